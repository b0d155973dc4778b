"""deploy/kubernetes: valid against the Kubernetes API schemas (offline), and consistent with the acker's contract."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from acker_service.cli import build_parser, config_from_args
from acker_service.shard_identity import FROM_HOSTNAME_ENV, environ_with_shard_index, ordinal_of

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]' installs it")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests promise (gRPC probes are GA since 1.27), and the newest schemas shipped.
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
MEASURED_BYTES_PER_PENDING_TREE = 219  # the Python ledger, engineering notes
PLANNED_PENDING_TREES = 1_000_000


def _resources() -> list[tuple[str, dict[str, Any]]]:
    """(file name, resource) for every Kubernetes object in the manifests (the kustomization is kustomize's)."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def _by_kind() -> dict[str, dict[str, Any]]:
    """The resources by kind (one of each)."""
    resources = [doc for _, doc in _resources()]
    kinds = {doc["kind"]: doc for doc in resources}
    assert len(kinds) == len(resources)
    return kinds


def _quantity(text: str) -> int:
    """A Kubernetes memory quantity in bytes."""
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?)?", text).groups()  # type: ignore[union-attr]
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}[unit]
    return int(number) * scale


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "resource"), _resources(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_against_the_schemas(name: str, resource: dict[str, Any], version: str) -> None:
    """Each object validates strictly (no unknown fields) against the Kubernetes schemas of that version."""
    kubernetes_validate.validate(resource, version, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    """`kubectl apply -k deploy/kubernetes` applies every manifest file."""
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted({name for name, _ in _resources()})


def test_a_validation_error_is_caught() -> None:
    """The validator really rejects a broken StatefulSet (so the test above can fail)."""
    broken = _by_kind()["StatefulSet"]
    broken = {**broken, "spec": {**broken["spec"], "replicas": "three"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


def test_pod_ordinal_is_the_shard_and_replicas_the_count() -> None:
    """Pods <name>-0..n-1 are shards 0..n-1 of n: the ordinal is read from the pod name, n = replicas."""
    sts = _by_kind()["StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert env["ACKER_SHARD_INDEX_FROM_HOSTNAME"] == "1" and "ACKER_SHARD_INDEX" not in env
    replicas = sts["spec"]["replicas"]
    assert int(env["ACKER_SHARD_COUNT"]) == replicas
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(replicas)]
    assert [ordinal_of(pod) for pod in pods] == list(range(replicas))


def test_headless_service_gives_each_shard_a_stable_name() -> None:
    """The governing Service is headless, selects the acker pods and serves the gRPC port the pods listen on."""
    kinds = _by_kind()
    sts, svc = kinds["StatefulSet"], kinds["Service"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == int(_env(container)["ACKER_PORT"])
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"] == ports["grpc"]


def test_probes_use_the_grpc_health_service_and_scraping_the_metrics_port() -> None:
    """Startup, readiness and liveness probes are gRPC health checks on the acker port; annotations name /metrics."""
    sts = _by_kind()["StatefulSet"]
    template = sts["spec"]["template"]
    (container,) = template["spec"]["containers"]
    env = _env(container)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": int(env["ACKER_PORT"])}, probe
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == env["ACKER_METRICS_PORT"]
    assert notes["prometheus.io/path"] == "/metrics"


def test_memory_is_sized_from_the_measured_bytes_per_tree_and_runs_unprivileged() -> None:
    """The memory request covers the planned pending trees at the measured size; the pod runs as non-root."""
    sts = _by_kind()["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    requested = _quantity(container["resources"]["requests"]["memory"])
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert requested >= MEASURED_BYTES_PER_PENDING_TREE * PLANNED_PENDING_TREES + 64 * 2**20
    assert limit > requested
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_trees_are_replicated_and_a_disruption_never_takes_both_copies() -> None:
    """ACKER_REPLICAS 2 (fewer than the shards), and the budget takes fewer pods than a tree has copies."""
    kinds = _by_kind()
    sts, pdb = kinds["StatefulSet"], kinds["PodDisruptionBudget"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    replication = int(_env(container)["ACKER_REPLICAS"])
    assert replication == 2 <= int(_env(container)["ACKER_SHARD_COUNT"])
    assert pdb["spec"]["maxUnavailable"] < replication


def test_disruption_budget_allows_one_shard_down() -> None:
    """Voluntary disruptions take at most one acker pod at a time."""
    kinds = _by_kind()
    pdb, sts = kinds["PodDisruptionBudget"], kinds["StatefulSet"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_every_pod_knows_its_partners_for_the_catch_up() -> None:
    """With two copies per tree, ACKER_PEERS lists every pod by its stable DNS name, in shard order, on the gRPC
    port, so a restarted pod copies its ranges from its partners; the server accepts the settings as a pod gets them."""
    kinds = _by_kind()
    sts, svc = kinds["StatefulSet"], kinds["Service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert env["ACKER_REPLICAS"] == "2"
    name, service, port = sts["metadata"]["name"], svc["metadata"]["name"], env["ACKER_PORT"]
    expected = tuple(f"{name}-{i}.{service}:{port}" for i in range(sts["spec"]["replicas"]))
    derived = environ_with_shard_index(env, hostname=lambda: f"{name}-1")
    derived.pop(FROM_HOSTNAME_ENV)
    config = config_from_args(build_parser(derived).parse_args([]))
    assert config.peer_addresses == expected and config.shard_index == 1 and config.replicas == 2
