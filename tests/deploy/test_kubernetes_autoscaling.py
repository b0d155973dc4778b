"""deploy/kubernetes/autoscaling: the HPA and its adapter rules validate offline and match the ackers and their metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ..service.test_metric_docs import documented

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]' installs it")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SCALING = K8S / "autoscaling"
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _resources() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(SCALING.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [(path.name, doc) for doc in _docs(path)]
    return found


def _kind(kind: str, directory: Path = SCALING) -> dict[str, Any]:
    (found,) = [
        doc for path in sorted(directory.glob("*.yaml")) if path.name != "kustomization.yaml" for doc in _docs(path)
        if doc["kind"] == kind
    ]  # fmt: skip
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "resource"), _resources(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_against_the_schemas(name: str, resource: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(resource, version, strict=True)


def test_a_broken_autoscaler_is_caught() -> None:
    """The validator rejects a wrong HPA (so the test above can fail)."""
    hpa = _kind("HorizontalPodAutoscaler")
    broken = {**hpa, "spec": {**hpa["spec"], "maxReplicas": "eight"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((SCALING / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted({name for name, _ in _resources()})


def test_autoscaler_scales_the_acker_statefulset_up_only() -> None:
    """It targets the StatefulSet of deploy/kubernetes, starts at its replica count, and never scales down by itself."""
    hpa, sts = _kind("HorizontalPodAutoscaler"), _kind("StatefulSet", K8S)
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (sts["apiVersion"], sts["kind"], sts["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] == sts["spec"]["replicas"] < hpa["spec"]["maxReplicas"]
    # Removing a pod before `acker-ctl drain` moved its roots would kill a shard.
    assert hpa["spec"]["behavior"]["scaleDown"]["selectPolicy"] == "Disabled"
    # One pod per step, so that a reshard follows each one.
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_autoscaler_metrics_are_acker_gauges_the_adapter_serves() -> None:
    """Each metric the HPA reads is a documented acker gauge (docs/server.md, tied to a real scrape) with an adapter rule."""
    hpa = _kind("HorizontalPodAutoscaler")
    wanted = {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]}
    assert wanted == {"acker_pending_trees", "acker_oldest_pending_tree_age_seconds"}
    assert wanted <= set(documented())
    rules = yaml.safe_load(_kind("ConfigMap")["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"] for rule in rules}
    assert wanted <= served
    for rule in rules:
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
