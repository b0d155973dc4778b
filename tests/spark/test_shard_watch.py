"""The driver's view of unreachable shards (ShardWatch) and its progress line, on a manual clock and a stand-in client."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
import pytest
from acker_client import ShardUnavailable
from acker_client.errors import ShardFailure
from acker_client.testing import ManualClock
from acker_spark.executor_read.shard_watch import DownTooLong, ShardWatch
from acker_spark.progress.driver_progress import ProgressLine

ADDRESSES = ["127.0.0.1:1", "127.0.0.1:2"]


def _unavailable(shard: int, detail: str) -> ShardUnavailable:
    failure = ShardFailure(shard, ADDRESSES[shard], grpc.StatusCode.UNAVAILABLE, detail, 0)
    return ShardUnavailable([failure], "acker shard unavailable")


class StandInCluster:
    """Answers Describe for the shards in ``up``; the others are refused connections."""

    addresses = ADDRESSES

    def __init__(self) -> None:
        self.up: set[int] = set()
        self.describes = 0

    def describe(self, shard: int) -> object:
        self.describes += 1
        if shard in self.up:
            return object()
        raise _unavailable(shard, "Connection refused")


@dataclass
class Counts:
    acked: int = 7
    dead_lettered: int = 1
    pending: int = 2
    awaiting_replay: int = 3


def test_a_shard_down_past_the_bound_is_named_with_the_cause_a_fresh_probe_gives() -> None:
    clock, cluster = ManualClock(), StandInCluster()
    watch = ShardWatch(cluster, clock)  # type: ignore[arg-type]
    watch(_unavailable(1, "Deadline Exceeded"))  # a dropped batch marks it
    clock.advance(2.0)
    assert watch.down_longer_than(3.0) is None  # not long enough
    clock.advance(1.5)
    down = watch.down_longer_than(3.0)
    assert down is not None
    shard, seconds = down
    assert (shard.shard, shard.address, seconds) == (1, ADDRESSES[1], 3.5)
    assert "Connection refused" in shard.cause  # the probe's answer, not the batch's deadline


def test_a_shard_that_answers_the_forced_probe_is_not_reported() -> None:
    clock, cluster = ManualClock(), StandInCluster()
    watch = ShardWatch(cluster, clock)  # type: ignore[arg-type]
    watch(_unavailable(0, "Connection refused"))
    clock.advance(5.0)
    cluster.up.add(0)  # back before the bound was checked
    assert watch.down_longer_than(3.0) is None
    assert watch.down() == []


def test_the_progress_line_waits_an_interval_then_names_counts_and_the_shard_waited_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, cluster = ManualClock(), StandInCluster()
    watch = ShardWatch(cluster, clock)  # type: ignore[arg-type]
    watch(_unavailable(1, "Connection refused"))
    logger = logging.getLogger("test.progress")
    line = ProgressLine(logger, watch, 10.0, clock)
    asked: list[int] = []

    def counts() -> Counts:
        asked.append(1)
        return Counts()

    with caplog.at_level(logging.INFO, logger="test.progress"):
        line.tick(counts)  # starts the interval
        clock.advance(9.0)
        line.tick(counts)
        assert caplog.records == [] and asked == []  # the stats are not even computed
        clock.advance(1.0)
        line.tick(counts)
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("progress: 7 acked, 1 dead-lettered, 2 pending, 3 awaiting replay; ")
    assert f"waiting on shard 1 at {ADDRESSES[1]}, unreachable for 10 s" in message


def test_a_shard_whose_outcome_stream_stays_closed_is_marked_down_from_then_though_no_batch_failed() -> None:
    """The driver sends nothing to a killed shard: its closed outcome stream, probed, is what marks it."""
    clock, cluster = ManualClock(), StandInCluster()
    cluster.up.add(0)
    closed = {0, 1}  # at the start no stream is open yet
    watch = ShardWatch(cluster, clock, silent=lambda: set(closed))  # type: ignore[arg-type]
    assert watch.down_longer_than(3.0) is None and cluster.describes == 0  # closed for less than a probe interval
    closed.discard(0)  # shard 0's stream opens; shard 1's never does
    clock.advance(1.0)
    assert watch.down_longer_than(3.0) is None
    assert [d.shard for d in watch.down()] == [1] and cluster.describes == 1  # only the closed one was probed
    clock.advance(2.5)
    verdict = watch.check_bound(3.0)
    assert isinstance(verdict, DownTooLong)
    assert (verdict.shard.shard, verdict.seconds) == (1, 3.5)  # counted from when its stream was first seen closed
    assert "Connection refused" in verdict.shard.cause and "unreachable for 4 s" in str(verdict)


def test_a_closed_stream_whose_shard_answers_is_not_marked() -> None:
    clock, cluster = ManualClock(), StandInCluster()
    cluster.up.update({0, 1})
    watch = ShardWatch(cluster, clock, silent=lambda: {1})  # type: ignore[arg-type]
    watch.check()
    clock.advance(5.0)
    assert watch.check_bound(3.0) is None and watch.down() == []
