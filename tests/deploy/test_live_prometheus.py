"""A real Prometheus scrapes 3 ackers under load; the dashboard and alerts use only live metric names."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from acker_service.process_cluster import ProcessCluster

DEADLINE = 60.0

# PromQL words that look like identifiers but are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels, ranges and keywords removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values may contain anything
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors, $__rate_interval
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        rest = text[match.end() :].lstrip()
        if not rest.startswith("(") and match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def test_metric_name_extraction() -> None:
    """The PromQL name extractor finds selected metrics and skips functions, labels, grouping and numbers."""
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(acker_complete_latency_seconds_bucket{job="acker",'
        'shard="$shard"}[$__rate_interval]))) / clamp_min(sum without (kind) (acker_operations_total), 1e-9)'
        " > 0.01 and on (shard) up == 0"
    )
    assert metric_names(expr) == {"acker_complete_latency_seconds_bucket", "acker_operations_total", "up"}


def _get(url: str) -> Any:
    """GET a Prometheus API URL and return its data (assert status success)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


class Prometheus:
    """A real Prometheus server (Debian's /usr/bin/prometheus) on a loopback port."""

    def __init__(self, binary: str, workdir: Path, port: int, cluster: ProcessCluster, rules: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        assert cluster.metrics_urls is not None
        targets = [u.removeprefix("http://").removesuffix("/metrics") for u in cluster.metrics_urls]
        # The scrape job mirrors deploy/prometheus/prometheus.yml (job "acker", a shard
        # label per target) with a 1 s interval; JSON is valid YAML.
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{
                "job_name": "acker",
                "static_configs": [
                    {"targets": [t], "labels": {"shard": str(i)}} for i, t in enumerate(targets)
                ],
            }],
        }  # fmt: skip
        config_path = workdir / "prometheus.yml"
        config_path.write_text(json.dumps(config))
        self.log_path = workdir / "prometheus.log"
        cmd = [
            binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self) -> None:
        """Block until /-/ready answers 200, failing with Prometheus's log if it exits or stalls."""
        deadline = time.monotonic() + DEADLINE
        while True:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log_path.read_text()}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query over the HTTP API; the result vector."""
        data = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return list(data["result"])

    def poll(self, promql: str, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        """Repeat `promql` until `done(result)`, with a bounded deadline."""
        deadline = time.monotonic() + DEADLINE
        while True:
            result = self.query(promql)
            if done(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"{promql!r} never satisfied the test; last result: {result}")
            time.sleep(0.25)

    def stop(self) -> None:
        """Terminate Prometheus and reap it."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def prometheus(
    tool: Callable[[str], str],
    metrics_cluster: ProcessCluster,
    tmp_path_factory: pytest.TempPathFactory,
    pick_port: Callable[[], int],
    deploy_dir: Path,
    workload: Callable[[str, int, int], Any],
) -> Iterator[Prometheus]:
    """A real Prometheus scraping the metrics cluster (with the deploy alert rules) after a workload ran."""
    binary = tool("prometheus")
    for shard, address in enumerate(metrics_cluster.addresses):
        reply = workload(address, shard, metrics_cluster.count)
        assert reply.applied > 0
    server = Prometheus(
        binary, tmp_path_factory.mktemp("prometheus"), pick_port(), metrics_cluster,
        deploy_dir / "prometheus" / "alerts.yml",
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _shards(result: list[dict[str, Any]]) -> set[str]:
    """The shard labels present in a query result."""
    return {series["metric"].get("shard", "") for series in result}


def test_outcome_and_pending_series_for_every_shard(prometheus: Prometheus) -> None:
    """PromQL over the live scrape returns acked and failed outcomes and pending trees for all 3 shards."""
    everyone = {"0", "1", "2"}
    acked = prometheus.poll('acker_outcomes_total{job="acker", outcome="acked"} > 0', lambda r: _shards(r) == everyone)
    assert all(float(s["value"][1]) == 5 for s in acked), acked
    failed = prometheus.poll('acker_outcomes_total{job="acker", outcome="failed"}', lambda r: _shards(r) == everyone)
    assert all(float(s["value"][1]) == 2 for s in failed), failed
    pending = prometheus.poll('acker_pending_trees{job="acker"}', lambda r: _shards(r) == everyone)
    assert len(pending) == 3


def test_shard_label_matches_the_ackers_own_shard(prometheus: Prometheus) -> None:
    """Each target's `shard` label equals the shard index the acker reports in acker_build_info."""
    info = prometheus.poll('acker_build_info{job="acker"}', lambda r: len(r) == 3)
    for series in info:
        labels = series["metric"]
        assert labels["shard"] == labels["shard_index"], labels
        assert labels["shard_count"] == "3"


def test_promtool_accepts_every_metrics_endpoint(metrics_cluster: ProcessCluster, tool: Callable[[str], str]) -> None:
    """`promtool check metrics` finds no problem in any acker's /metrics output."""
    promtool = tool("promtool")
    assert metrics_cluster.metrics_urls is not None
    for url in metrics_cluster.metrics_urls:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
        assert b"acker_pending_trees" in body
        done = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
        assert done.returncode == 0, (url, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def live_names(prometheus: Prometheus) -> set[str]:
    """Every series name Prometheus holds for the acker job, once histograms and outcomes are in."""
    prometheus.poll('acker_complete_latency_seconds_count{job="acker"} > 0', lambda r: len(r) == 3)
    prometheus.poll('grpc_server_handled_total{job="acker", grpc_method="Apply"}', lambda r: len(r) >= 3)
    query = urllib.parse.urlencode({"match[]": '{job="acker"}'})
    return set(_get(f"{prometheus.url}/api/v1/label/__name__/values?{query}"))


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard: panel targets (rows included) and template queries."""
    exprs = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        exprs += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        # label_values(metric{...}, label) selects `metric`.
        exprs += re.findall(r"label_values\((.*),\s*\w+\)", text)
    return exprs


def test_dashboard_uses_only_exported_metrics(deploy_dir: Path, live_names: set[str]) -> None:
    """The dashboard JSON parses and every metric its queries select is in the live scrape."""
    dashboard = json.loads((deploy_dir / "grafana" / "dashboards" / "acker.json").read_text())
    exprs = _dashboard_exprs(dashboard)
    used = set().union(*(metric_names(e) for e in exprs))
    assert len(used) >= 15, used
    assert used <= live_names, f"not exported: {sorted(used - live_names)}"


def test_dashboard_covers_the_required_views(deploy_dir: Path) -> None:
    """The dashboard has latency p50/p95/p99, per-shard pending, gRPC errors by code, and a row per shard."""
    dashboard = json.loads((deploy_dir / "grafana" / "dashboards" / "acker.json").read_text())
    text = "\n".join(_dashboard_exprs(dashboard))
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(acker_complete_latency_seconds_bucket" in text
    assert "sum by (shard) (acker_pending_trees" in text
    assert 'sum by (grpc_code) (rate(grpc_server_handled_total{job="acker", grpc_code!="OK"}' in text
    for metric in ("acker_outcomes_retained", "acker_outcomes_dropped_total", "acker_subscribers"):
        assert metric in text
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert any(r.get("repeat") == "shard" for r in rows)
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["shard"]


def test_alert_rules_load_evaluate_and_use_exported_metrics(prometheus: Prometheus, live_names: set[str]) -> None:
    """Prometheus loads the deploy alert rules and evaluates each without error, on live metric names only."""

    def rules() -> list[dict[str, Any]]:
        groups = _get(f"{prometheus.url}/api/v1/rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    deadline = time.monotonic() + DEADLINE
    while any(rule["health"] == "unknown" for rule in rules()) and time.monotonic() < deadline:
        time.sleep(0.25)
    loaded = rules()
    assert {r["name"] for r in loaded} >= {"AckerDown", "AckerTimeoutsRising", "AckerOutcomesDropped",
                                           "AckerPendingGrowing"}  # fmt: skip
    for rule in loaded:
        assert rule["health"] == "ok", rule
        unknown = metric_names(rule["query"]) - live_names
        assert not unknown, f"{rule['name']} uses metrics nobody exports: {unknown}"
    down = [r for r in loaded if r["name"] == "AckerDown"][0]
    assert down["state"] == "inactive", "every acker is up, so AckerDown must not be pending or firing"
