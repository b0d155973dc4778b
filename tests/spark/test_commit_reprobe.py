"""A task whose start met refused connections sends its acks once the shards answer again (no Spark needed).

A bolt's task asks every shard once when it starts; the shards that refuse the
connection have their operations withheld at commit (so a dead acker delays
only its own trees). A shard cut off only for a moment when the task started
used to be withheld for the whole task, its trees replayed, although it
answered again long before the commit. The task now asks again at commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from acker_client import ClusterClient, ShardFailure, Spout, TrackedTuple
from acker_client.testing import local_cluster, unreachable_addresses
from acker_protocol.wire import Outcome
from acker_spark import Bolt, close_clients

from tests.blips.scenario import proxies

from .test_executor import Outcomes, emit_sentences, shipped


def _refused(shard: int, address: str) -> ShardFailure:
    return ShardFailure(shard, address, grpc.StatusCode.UNAVAILABLE, "Connection refused", 0)


def test_a_shard_that_answers_again_is_no_longer_withheld_one_still_down_is() -> None:
    (dead,) = unreachable_addresses(1)
    with local_cluster(3) as cluster:
        addresses = [cluster.addresses[0], cluster.addresses[1], dead]
        bolt = Bolt(lambda tuples, collector: iter(()), addresses, name="reprobe")
        try:
            # As if shards 1 and 2 refused at the task's start: shard 1 is back now, shard 2 is not.
            still = bolt._still_refused({1: _refused(1, addresses[1]), 2: _refused(2, dead)})
        finally:
            close_clients()
    assert set(still) == {2}
    assert still[2].code is grpc.StatusCode.UNAVAILABLE


def _slow_ack(tuples: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """Ack every input after the cut at the task's start is over (1 s)."""
    time.sleep(1.5)
    for t in tuples:
        collector.ack(t)
    return iter(())


@pytest.mark.chaos
def test_a_task_started_during_a_short_cut_delivers_its_acks_after_it() -> None:
    """Every bolt connection cut for 1 s as the task starts: its commit, after the cut, acks every tree."""
    with local_cluster(3, message_timeout=10.0) as cluster, proxies(list(cluster.addresses)) as breakers:
        outcomes = Outcomes()
        with (
            ClusterClient(cluster.addresses) as client,
            Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout,
        ):
            sentences = emit_sentences(spout, 30)
            close_clients()  # a fresh executor process: its first task asks every shard
            for proxy in breakers:
                proxy.cut(1.0)
            bolt = Bolt(_slow_ack, [p.address for p in breakers], name="after-cut")
            try:
                list(bolt.run_partition(0, shipped(sentences)))
            finally:
                close_clients()
            assert spout.wait_idle(20.0)
    assert sum(p.refused for p in breakers) > 0, "the cut reached no connection"
    assert outcomes.by_id == {f"s{i}": [Outcome.ACKED] for i in range(30)}
