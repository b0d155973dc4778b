"""The compose cluster for real: healthy ackers, node loss, partition, rolling restart, Prometheus, a Spark job.

The tests share one compose project (see conftest.py) and run in file order; each
leaves the cluster healthy for the next. Load comes from the host through the
published ports with the real client. The node-loss and partition tests print
their figures (run with -s to see them).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient

from .conftest import REPLICAS, SHARDS, ComposeCluster
from .workload import Figures, Workload

# Seconds of load before and after a fault: small, the whole suite stays at a few minutes.
LOAD_SECONDS = 3.0


def _wait(condition, what: str, timeout: float) -> None:
    """Poll `condition` until true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(0.2)


def _reachable(addresses: list[str], shard: int) -> bool:
    """True when the shard answers Describe through its published port."""
    try:
        with ClusterClient(addresses, verify=False, deadline=1.0) as client:
            client.describe(shard)
        return True
    except Exception:
        return False


def _load_recovers(load: Workload, timeout: float = 60.0) -> None:
    """Acks keep arriving: at least 100 more within `timeout`."""
    before = load.acked_since()
    _wait(lambda: load.acked_since() >= before + 100, "acks to keep arriving", timeout)


def _assert_guarantees(figures: Figures, label: str) -> None:
    """Nothing lost, nothing acked falsely, one callback per emit; print the figures for the record."""
    print(figures.line(label))
    assert figures.lost_records == 0, figures.line(label)
    assert figures.false_acks == 0, figures.line(label)
    assert figures.duplicate_callbacks == 0, figures.line(label)
    assert figures.acked == figures.records, figures.line(label)  # one ack per record, the rest replayed
    assert figures.trees == figures.records + figures.replayed


def test_up_gives_three_healthy_ackers_that_ack_a_workload(compose_cluster: ComposeCluster) -> None:
    """After `up` every acker is healthy by the image's HEALTHCHECK, and every tree of a workload is ACKED."""
    for shard in range(SHARDS):
        state = compose_cluster.state(shard)
        assert state["Health"]["Status"] == "healthy"
        # A probe may time out on a busy machine (exit -1); healthy needs passing ones.
        passed = [entry for entry in state["Health"]["Log"] if entry["ExitCode"] == 0]
        assert passed and "SERVING" in passed[-1]["Output"], state["Health"]["Log"]
    with ClusterClient(compose_cluster.addresses) as client:  # verify=True: shard order matches the addresses
        assert [client.describe(i).shard_index for i in range(SHARDS)] == [0, 1, 2]
    load = Workload(compose_cluster.addresses).start()
    time.sleep(LOAD_SECONDS)
    figures = load.finish(timeout=60)
    _assert_guarantees(figures, "up")
    assert figures.records > 100
    assert figures.replayed == 0 and not figures.failed, figures.line("up")


@pytest.mark.chaos
def test_node_loss_under_load(compose_cluster: ComposeCluster) -> None:
    """A crashed acker under load, with every tree on two ackers (REPLICAS 2): the partner replicas settle its
    trees, so no record is replayed because of the crash; the restart policy brings it back and load recovers;
    nothing lost, no false ack, one callback per emit."""
    shard = 1
    restarts = compose_cluster.restart_count(shard)
    load = Workload(compose_cluster.addresses).start()
    assert load.client.replicas == REPLICAS
    time.sleep(LOAD_SECONDS)
    compose_cluster.crash(shard)
    _wait(lambda: compose_cluster.restart_count(shard) > restarts, "restart: unless-stopped to restart it", 60)
    compose_cluster.wait_healthy(shard)
    _wait(lambda: _reachable(compose_cluster.addresses, shard), "the restarted shard's published port", 30)
    _load_recovers(load)
    time.sleep(LOAD_SECONDS)
    skipped = load.client.stats.dropped_by_reason.get("replica", 0)
    figures = load.finish(timeout=120)
    _assert_guarantees(figures, "node loss")
    # The crash happened under load: the client skipped the dead replica's copies of operations.
    assert skipped > 0, figures.line("node loss")
    assert figures.replayed == 0 and not figures.failed, figures.line("node loss")


@pytest.mark.chaos
def test_partition_under_load(compose_cluster: ComposeCluster) -> None:
    """An acker cut off the network and reconnected: same guarantees, the clients recover without a restart."""
    shard = 2
    load = Workload(compose_cluster.addresses).start()
    time.sleep(LOAD_SECONDS)
    compose_cluster.disconnect(shard)
    _wait(lambda: not _reachable(compose_cluster.addresses, shard), "the partition to cut the shard off", 30)
    time.sleep(LOAD_SECONDS)
    compose_cluster.connect(shard)
    _wait(lambda: _reachable(compose_cluster.addresses, shard), "the shard to be reachable again", 60)
    _load_recovers(load)
    time.sleep(LOAD_SECONDS)
    reconnects = load.spout.stats.reconnects
    figures = load.finish(timeout=120)
    _assert_guarantees(figures, "partition")
    # The client rides out a partition shorter than its wait for a shard (see
    # docs/client-outages.md): the cut shard's operations wait and its trees
    # complete, so no tree needs to fail. The reconnect shows the cut was real.
    assert reconnects >= 1  # the same spout's outcome stream came back by itself
    assert figures.slowest_failure_seconds <= load.backstop + 5.0, figures.line("partition")


@pytest.mark.chaos
def test_rolling_restart_loses_and_duplicates_nothing(compose_cluster: ComposeCluster) -> None:
    """`docker-compose restart` of each acker in turn under load: every record acked exactly once in the end."""
    load = Workload(compose_cluster.addresses).start()
    time.sleep(1.0)
    for shard in range(SHARDS):
        compose_cluster.restart(shard)
        compose_cluster.wait_healthy(shard)
        _wait(lambda s=shard: _reachable(compose_cluster.addresses, s), f"acker-{shard} back", 30)
    _load_recovers(load)
    figures = load.finish(timeout=120)
    _assert_guarantees(figures, "rolling restart")


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    """Run an instant PromQL query; return the result vector."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_in_compose_answers_for_every_shard(compose_cluster: ComposeCluster) -> None:
    """The compose Prometheus scrapes all three ackers: outcomes and pending trees per shard, alert rules loaded."""
    url = compose_cluster.prometheus_url

    def shards_of(expr: str) -> set[str]:
        try:
            return {series["metric"].get("shard", "") for series in _query(url, expr)}
        except OSError:
            return set()

    every = {str(i) for i in range(SHARDS)}
    # The shipped config scrapes every 15 s: allow a few scrapes after the restarts.
    _wait(lambda: shards_of('up{job="acker"} == 1') == every, "every acker target up", 90)
    _wait(lambda: shards_of('sum by (shard) (acker_outcomes_total{outcome="acked"}) > 0') == every, "outcomes", 90)
    assert shards_of("acker_pending_trees") == every
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as response:
        groups = json.load(response)["data"]["groups"]
    alerts = {rule["name"] for group in groups for rule in group["rules"] if rule["type"] == "alerting"}
    assert {"AckerDown", "AckerTimeoutsRising", "AckerOutcomesDropped", "AckerPendingGrowing"} <= alerts
    assert all(rule["health"] == "ok" for group in groups for rule in group["rules"]), groups


@pytest.mark.spark
def test_pyspark_word_count_against_compose(compose_cluster: ComposeCluster, spark: Any, tmp_path: Path) -> None:
    """The demo's word count on local Spark, tracked by the compose ackers: every record acked, sink exact."""
    from acker_demo.wordcount import build_source_job, create_sink, expected_counts, sink_counts
    from acker_spark import SourcePipeline, close_clients
    from acker_spark.dead_letter import DeadLetterStore
    from acker_spark.sources import generated_sentences

    db = tmp_path / "sink.sqlite"
    create_sink(db)
    records = list(generated_sentences(200, seed=7))
    job, _ = build_source_job(compose_cluster.addresses, db, partitions=2)
    try:
        with ClusterClient(compose_cluster.addresses) as client:
            pipeline = SourcePipeline(spark, client, tmp_path / "checkpoint", dead_letters=DeadLetterStore(db))
            stats = pipeline.run(records, job)
    finally:
        close_clients()
    assert (stats.emitted, stats.acked, stats.dead_lettered, stats.pending) == (len(records), len(records), 0, 0), stats
    assert sink_counts(db) == expected_counts(records)
