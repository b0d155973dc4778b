"""The blip suite: network cuts, half-open connections, slow readers and lost responses under a spout/bolt workload.

Every case checks the invariants: no tree whose work completed is replayed
(LOST or TIMED_OUT), exactly one callback per emit, no false ack. Fast by
default (one 1.5 s fault per case); for longer or more faults:

    BLIP_CUTS=3 BLIP_SECONDS=5 .venv/bin/pytest tests/blips

Each case prints its figures (trees replayed per second of outage among them)
as one JSON line; ``pytest -s`` shows them.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from acker_client import ClusterClient, ShardUnavailable, Spout, new_id
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome

from .proxy import BlipProxy
from .scenario import proxies, run_cuts, run_kills
from .workload import WorkloadConfig

pytestmark = pytest.mark.chaos  # network cuts under load: make test runs them serially (docs/testing.md)

CUTS = int(os.environ.get("BLIP_CUTS", "1"))
SECONDS = float(os.environ.get("BLIP_SECONDS", "1.5"))
WORKLOAD = WorkloadConfig(rate=300.0, bolt_threads=2)


@pytest.fixture(scope="module")
def ackers():
    """Three in-process ackers with a 10 s message timeout, shared by the workload cases."""
    with local_cluster(3, message_timeout=10.0) as cluster:
        yield cluster


def _check(result: dict) -> None:
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, sort_keys=True))
    assert result["drained"], "the spout still had records pending long after the workload stopped"
    assert result["emitted"] > 0 and result["emits_without_exactly_one_callback"] == 0
    assert result["false_acks"] == 0
    assert result["completed_but_replayed"] == 0, f"completed work replayed: {result}"
    assert result["completed"] == result["acked"] == result["emitted"]


@pytest.mark.parametrize("side", ["spout", "bolt", "both"])
def test_cut_loses_no_completed_work(ackers, side):
    """Connections reset and refused for a while: every completed tree is still acked, none replayed."""
    result = run_cuts(ackers.addresses, cuts=CUTS, seconds=SECONDS, gap=1.0, side=side, workload=WORKLOAD)
    _check(result)
    client = result["spout_client"] if side != "bolt" else result["bolt_client"]
    # A cut resets the connections at once: a batch in flight then is retried, and a client between
    # batches reconnects into the refusals; either way the cut reached it (else the test tested nothing).
    assert client["batches_retried"] > 0 or result["refused_connections"] > 0, "the cut never reached the client"


def test_half_open_connections_are_detected_and_nothing_is_replayed(ackers):
    """Connections that swallow every byte (a vanished peer): keepalive drops them, batches are re-sent."""
    result = run_cuts(
        ackers.addresses, cuts=1, seconds=SECONDS, gap=1.0, side="both", workload=WORKLOAD, fault="half_open"
    )
    _check(result)
    assert result["spout_client"]["batches_retried"] + result["bolt_client"]["batches_retried"] > 0


def test_slow_reader_and_delay_change_no_outcome(ackers):
    """A spout whose outcome stream is read at 2 KiB/s, and 50 ms of delay on every chunk: late, never wrong."""
    with proxies(ackers.addresses) as slow:
        with (
            ClusterClient([p.address for p in slow]) as spout_client,
            ClusterClient(ackers.addresses) as bolt_client,
        ):
            from .workload import Workload

            load = Workload(spout_client, bolt_client, WORKLOAD).start()
            for proxy in slow:
                proxy.slow_reader(2048, 2.0)
                proxy.set_delay(0.05)
            time.sleep(2.0)
            for proxy in slow:
                proxy.set_delay(0.0)
            drained = load.stop(60.0)
            result = load.report()
    result["drained"] = drained
    _check(result)


def _wait_pending(client: ClusterClient, shard: int, count: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        pending = client.describe(shard).pending_trees
        if pending == count or time.monotonic() > deadline:
            return pending
        time.sleep(0.05)


@pytest.mark.parametrize("batch_keys", [True, False])
def test_response_lost_after_the_acker_applied_the_batch(batch_keys):
    """The acker applies an ack batch and its response is lost with the connection (the ambiguous case).

    With batch keys the client re-sends the batch and the acker deduplicates it,
    so the tree still acks. Without them the batch is not re-sent (an unkeyed
    XOR ack applied twice would cancel itself and hang the tree); it is dropped
    as ambiguous, and the first copy, which did arrive, completes the tree.
    """
    with local_cluster(1, message_timeout=30.0) as cluster, BlipProxy(cluster.addresses[0]) as proxy:
        with (
            ClusterClient(cluster.addresses) as direct,
            ClusterClient([proxy.address], batch_keys=batch_keys, flush_interval=60.0, send_when_idle=False) as client,
        ):
            root, e1, e2 = new_id(), new_id(), new_id()
            direct.init(root, e1 ^ e2, "ambiguous")
            direct.flush()
            client.describe(0)  # the proxied connection is open
            client.ack(root, e1)
            proxy.swallow_responses(then_reset_after=0.3)
            if batch_keys:
                client.flush()  # re-sent after the reset, deduplicated by the acker
                stats = client.stats
                assert stats.batches_retried >= 1 and stats.deduplicated == 1
            else:
                with pytest.raises(ShardUnavailable) as info:
                    client.flush()
                assert info.value.failures[0].reason == "ambiguous"
                assert client.stats.dropped_by_reason == {"ambiguous": 1} and client.stats.batches_retried == 0
            assert _wait_pending(direct, 0, 1) == 1  # e1 applied exactly once: the tree waits for e2
            direct.ack(root, e2)
            direct.flush()
            assert _wait_pending(direct, 0, 0) == 0, "the tree did not complete: an ack was applied twice"


def test_a_shard_down_longer_than_wait_for_shard_blocks_then_raises():
    """While a shard is unreachable, the caller that fills its buffer waits wait_for_shard, then gets a clear error."""
    with local_cluster(1, message_timeout=30.0) as cluster, BlipProxy(cluster.addresses[0]) as proxy:
        with ClusterClient(
            [proxy.address], batch_size=10, wait_for_shard=1.0, flush_interval=60.0, send_when_idle=False
        ) as client:
            proxy.cut(60.0)
            for _ in range(9):
                client.ack(new_id(), 1)  # buffered: returns at once
            started = time.monotonic()
            with pytest.raises(ShardUnavailable) as info:
                client.ack(new_id(), 1)  # fills the buffer: sends it and waits for the shard
            waited = time.monotonic() - started
            assert 0.9 <= waited < 10.0
            assert info.value.failures[0].reason == "timeout" and info.value.failures[0].operations == 10
            stats = client.stats
            assert stats.dropped_by_reason == {"timeout": 10} and stats.shard_states == ("UNREACHABLE",)
            assert stats.operations_waiting == 0


def test_backstop_reports_the_ackers_timeout_after_a_cut_longer_than_its_margin():
    """T = 2 s, backstop 4 s (margin 1 s); the spout's stream is cut for 5 s while the acker times the trees out.

    The acker keeps the TIMED_OUT outcomes for the disconnected spout; the
    spout's backstop stands still while the stream is down, so every record
    gets TIMED_OUT (what the acker decided), not LOST.
    """
    cut = max(5.0, SECONDS)
    with local_cluster(2, message_timeout=2.0) as cluster, proxies(cluster.addresses) as cut_proxies:
        with ClusterClient([p.address for p in cut_proxies]) as client:
            calls: list = []
            spout = Spout(client, on_ack=lambda m: calls.append((m, None)), on_fail=lambda m, r: calls.append((m, r)))
            assert spout.timeout == pytest.approx(4.0)
            with spout:
                # Outcome streams open on connections of their own: cut them once open, as the test means.
                assert spout.wait_streams_open(10.0)
                for i in range(40):
                    spout.emit(i, i)  # nobody acks: the ackers will time these out
                client.flush()
                for proxy in cut_proxies:
                    proxy.cut(cut)
                assert spout.wait_idle(cut + 20.0)
                stats = spout.stats
    reasons = [r for _, r in calls]
    assert sorted(m for m, _ in calls) == list(range(40))
    assert reasons == [Outcome.TIMED_OUT] * 40, f"{stats}"
    assert stats.backstop_paused_seconds > 1.0
    assert stats.operations_dropped == 0 and stats.shard_states == ("READY", "READY")


def test_acker_killed_under_load_with_replicas_two_replays_nothing():
    """kill -9 of each acker in turn under load, restarted 1 s later, every tree on two ackers: no completed
    record is replayed, none lost, one callback per emit (the kill -9 measurement's scenario, short)."""
    from acker_service.process_cluster import ProcessCluster

    with ProcessCluster(count=3, message_timeout=3.0, extra_args=("--replicas", "2")) as cluster:
        # Trees stay in flight for 0.5 s, so every kill catches some on the dead acker. The kills are far
        # enough apart for the restarted acker to be back before its partner dies: a restarted acker keeps
        # only trees started after its return (docs/acker-semantics.md, "Replicated trees").
        workload = WorkloadConfig(rate=300.0, bolt_threads=2, hold=0.5)
        result = run_kills(cluster, kills=2, every=6.0, down=1.0, workload=workload)
    _check(result)
    assert result["replicas"] == 2 and result["lost"] == result["timed_out"] == 0


@pytest.mark.parametrize("fault", ["cut", "half_open"])
def test_every_replica_cut_at_once_loses_nothing(fault):
    """Replicas 2, every connection of spout and bolts broken at once: nothing lost, no false ack, one callback each.

    Replicas skip copies per batch, so a tree whose operations were skipped on
    different replicas can time out and be replayed (docs/acker-semantics.md,
    "What replication does not cover"): a replay is allowed here, a loss is not.
    """
    workload = WorkloadConfig(rate=300.0, bolt_threads=2, hold=0.5)
    with local_cluster(3, message_timeout=10.0, replicas=2) as ackers:
        result = run_cuts(ackers.addresses, cuts=CUTS, seconds=SECONDS, side="both", workload=workload, fault=fault)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, sort_keys=True))
    assert result["drained"], "the spout still had records pending long after the workload stopped"
    assert result["emitted"] > 0 and result["emits_without_exactly_one_callback"] == 0
    assert result["false_acks"] == 0 and result["lost"] == 0 and result["completed_but_lost"] == 0
    assert result["completed"] == result["emitted"]
