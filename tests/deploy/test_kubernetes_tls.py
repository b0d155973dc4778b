"""deploy/kubernetes-tls: the TLS and mutual-TLS overlays render, validate, and their probes pass against a real TLS acker.

Kubernetes' built-in gRPC probe speaks plaintext only: with TLS switched on as
docs/security.md describes, the base manifest's probes failed and the pods
never became ready (issue 21). The overlays probe with acker-healthcheck over
TLS; here the rendered probe command runs, with the rendered environment and
the Secret's files, against a real acker configured from that same environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from acker_bench.testcerts import CertificateAuthority
from grpc_health.v1 import health_pb2, health_pb2_grpc

from acker_service.config import ServerConfig
from acker_service.healthcheck import main as healthcheck_main
from acker_service.server import AckerServer

from .conftest import require_tool

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]' installs it")

OVERLAYS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes-tls"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _rendered_statefulset(overlay: str) -> dict[str, Any]:
    """The StatefulSet as `kubectl apply -k deploy/kubernetes-tls/<overlay>` would apply it."""
    kubectl = require_tool("kubectl")
    text = subprocess.run(
        [kubectl, "kustomize", str(OVERLAYS / overlay)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    (sts,) = [doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "StatefulSet"]
    return sts


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> dict[str, str]:
    """The files of the `acker-tls` Secret the overlays name, issued by a throwaway CA: key -> local path."""
    folder = tmp_path_factory.mktemp("acker-tls")
    ca = CertificateAuthority(folder, "cluster-ca")
    server, probe = ca.issue("localhost", server=True), ca.issue("probe")
    return {
        "ca.crt": ca.ca,
        "server.crt": server.cert,
        "server.key": server.key,
        "probe.crt": probe.cert,
        "probe.key": probe.key,
    }


def _local_env(container: dict[str, Any], mount: str, secret: dict[str, str]) -> dict[str, str]:
    """The container's environment, with each path into the Secret's mount replaced by the local file."""
    env = {item["name"]: item["value"] for item in container["env"]}
    for name, value in env.items():
        if value.startswith(mount + "/"):
            key = value[len(mount) + 1 :]
            assert key in secret, f"{name} names {key}, which the overlay's comments do not ask the Secret for"
            env[name] = secret[key]
    return env


@pytest.mark.parametrize("overlay", ["tls", "mtls"])
def test_overlay_probes_pass_over_tls_where_the_plaintext_probe_fails(overlay, secret, monkeypatch):
    """The rendered probes run acker-healthcheck over (m)TLS and see SERVING; a plaintext health check cannot."""
    sts = _rendered_statefulset(overlay)
    for version in ("1.27.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(sts, version, strict=True)
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "acker-tls"
    env = _local_env(container, mount["mountPath"], secret)
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        grace=0.2,
        tls_cert=env["ACKER_TLS_CERT"],
        tls_key=env["ACKER_TLS_KEY"],
        tls_client_ca=env.get("ACKER_TLS_CLIENT_CA"),
    )
    assert (config.tls_client_ca is not None) == (overlay == "mtls")
    server = AckerServer(config).start()
    try:
        # What the kubelet's built-in gRPC probe does: a plaintext Check on the port.
        with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("ACKER_PORT", str(server.port))
        monkeypatch.delenv("ACKER_HEALTHCHECK_ADDRESS", raising=False)
        for probe in PROBES:
            assert "grpc" not in container[probe], f"{probe} is still Kubernetes' plaintext gRPC probe"
            command = container[probe]["exec"]["command"]
            assert command[0] == "acker-healthcheck"
            assert healthcheck_main(command[1:]) == 0, f"{probe} fails against the {overlay} acker"
    finally:
        server.stop(0)
