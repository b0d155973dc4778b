"""deploy/kubernetes-resharding: the overlay and the reshard Job validate offline, and the Job asks for the right move.

The overlay renders with `kubectl kustomize` (as `kubectl apply -k` would apply
it); the Job's script runs under ``sh`` with an ``acker-ctl`` on PATH that
records the command it is given, so the addresses the script builds from the
StatefulSet's stable DNS names are checked without a Kubernetes cluster (the
move itself is tested against real ackers in tests/reshard/).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from acker_service.cli import build_parser, config_from_args
from acker_service.shard_identity import FROM_HOSTNAME_ENV, environ_with_shard_index

from .conftest import require_tool

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]' installs it")

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes-resharding"
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def _rendered() -> list[dict[str, Any]]:
    """The resources `kubectl apply -k deploy/kubernetes-resharding` would apply."""
    kubectl = require_tool("kubectl")
    text = subprocess.run(
        [kubectl, "kustomize", str(FOLDER)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _job() -> dict[str, Any]:
    return yaml.safe_load((FOLDER / "reshard-job.yaml").read_text())


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"] if "value" in item}


@pytest.mark.parametrize("version", VERSIONS)
def test_overlay_and_job_are_valid_against_the_schemas(version: str) -> None:
    """Every rendered resource and the Job pass strict validation (unknown fields are errors)."""
    for resource in [*_rendered(), _job()]:
        kubernetes_validate.validate(resource, version, strict=True)


def test_a_broken_job_is_caught() -> None:
    """The validator rejects a wrong Job (so the test above can fail)."""
    job = _job()
    broken = {**job, "spec": {**job["spec"], "backoffLimit": "none"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_overlay_keeps_one_copy_and_lets_an_added_pod_join() -> None:
    """ACKER_REPLICAS 1 (reshard refuses two copies); pod acker-<count> starts outside the layout, not in a crash loop."""
    (sts,) = [doc for doc in _rendered() if doc["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    assert env["ACKER_REPLICAS"] == "1" and env["ACKER_JOIN"] == "1"
    count = int(env["ACKER_SHARD_COUNT"])

    def config_of(pod: str):
        # The index as the pod's own host name gives it (then the flag is spent: this test runs under another name).
        derived = environ_with_shard_index(env, hostname=lambda: pod)
        derived.pop(FROM_HOSTNAME_ENV)
        derived.pop("ACKER_LAYOUT_FILE")  # a path on the pod's volume, not on this machine (checked below)
        return config_from_args(build_parser(derived).parse_args([]))

    added = config_of(f"{sts['metadata']['name']}-{count}")
    assert added.shard_index == count and not added.in_layout
    assert config_of(f"{sts['metadata']['name']}-0").in_layout


def test_each_pod_keeps_its_layout_on_a_claim_of_its_own() -> None:
    """ACKER_LAYOUT_FILE lies on a volume claim template (it survives rescheduling), writable by the acker's group."""
    (sts,) = [doc for doc in _rendered() if doc["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = Path(_env(container)["ACKER_LAYOUT_FILE"])
    (mount,) = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert path != Path(mount["mountPath"]) and not mount.get("readOnly")
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert mount["name"] in claims and mount["name"] not in {v["name"] for v in pod.get("volumes", [])}
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # A pod removed by scaling down (after its drain) leaves no stale layout for a pod added back later.
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete"


def _run_job_script(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess:
    """The Job's script under sh, its environment as the manifest sets it (namespace `streams`), acker-ctl recorded."""
    (container,) = _job()["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    recorder = tmp_path / "acker-ctl"
    recorder.write_text('#!/bin/sh\necho "ACKERS=$ACKER_CTL_ACKERS"\necho "ARGS=$*"\n')
    recorder.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", **_env(container), "ACKER_NAMESPACE": "streams", **overrides}
    return subprocess.run(
        [require_tool("sh"), "-c", container["args"][0]], env=env, capture_output=True, text=True, timeout=30
    )


def _names(count: int) -> str:
    return ",".join(f"acker-{i}.acker.streams.svc.cluster.local:7100" for i in range(count))


def test_job_grows_by_the_stable_dns_names(tmp_path: Path) -> None:
    """FROM 3, TO 4: acker-ctl reshard from the three pods' names to the four pods' names, in ordinal order."""
    done = _run_job_script(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"ACKERS={_names(3)}", f"ARGS=reshard --shards 4 --addresses {_names(4)}"]


def test_job_shrinks_by_draining_the_highest_pod(tmp_path: Path) -> None:
    """FROM 4, TO 3: acker-ctl drain 3 (the pod the StatefulSet removes first), waiting for its due trees."""
    done = _run_job_script(tmp_path, ACKER_RESHARD_FROM="4", ACKER_RESHARD_TO="3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"ACKERS={_names(4)}", "ARGS=drain 3 --wait 45"]


def test_job_refuses_a_move_it_cannot_make(tmp_path: Path) -> None:
    """Shrinking by more than one pod (or to the same count) is refused with exit 2 and the reason; nothing runs."""
    done = _run_job_script(tmp_path, ACKER_RESHARD_FROM="5", ACKER_RESHARD_TO="3")
    assert done.returncode == 2 and "shrink by one" in done.stderr
    assert "ARGS=" not in done.stdout
