"""The stall check: a successful job none of whose trees settled stops the run, unless an acker outage explains it.

The check names a job that emits rows no later step acks. A one-replica acker
killed and restarted while the job ran has lost the trees it held: they end
at the backstop and are replayed, so the run must go on (the mixed kill run of
``acker-bench --mode exactly-once`` stopped here when its acker kill landed at
the end of a round's job).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import ManualClock, local_cluster
from acker_spark import close_clients
from acker_spark.executor_read.pipeline_options import PipelineOptions
from acker_spark.executor_read.run_guards import RunGuards
from acker_spark.run_report import RunStopped, SourceStats
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.outcome_feed import OutcomeFeed

from tests.client.polling import wait_until

BACKSTOP = 9.0


class FakeCluster:
    """What the guards ask of a cluster: listeners and a shard count (every shard answers)."""

    shard_count = 1
    addresses = ["127.0.0.1:1"]

    def add_error_listener(self, _listener: Any) -> None:
        """Nothing is sent here, so nothing fails."""

    def describe(self, _shard: int) -> None:
        """The shard answers."""


class FakeFeed:
    """The outcome feed as the guards see it: the streams' breaks and the shards whose stream is closed now."""

    def __init__(self) -> None:
        self.breaks = 0
        self.taps: list[Any] = []

    def stream_breaks(self) -> int:
        """Breaks so far."""
        return self.breaks

    def closed_streams(self) -> set[int]:
        """Every stream is open again (the acker was restarted)."""
        return set()


class StalledBook:
    """A book whose every round left all of its 500 trees pending."""

    undelivered: list[Any] = []

    def round_stalled(self, _round_no: int) -> int:
        """Every tree of the round is pending."""
        return 500


def _guards(tmp_path: Path, clock: ManualClock) -> tuple[RunGuards, FakeFeed]:
    options = PipelineOptions(clock=clock, budget=None, hang_grace=None, shard_down_after=None)
    guards = RunGuards(SimpleNamespace(sparkContext=None), FakeCluster(), tmp_path, options, lambda: BACKSTOP)
    feed = FakeFeed()
    guards.attach(feed)
    return guards, feed


def _run_round(guards: RunGuards, feed: FakeFeed, clock: ManualClock, acker_restarted: bool) -> None:
    """Round 2's job starts, (its acker goes down and comes back,) and succeeds."""
    guards.round_watch(2, SimpleNamespace(mode="select"), StalledBook(), "run")
    if acker_restarted:
        feed.breaks += 1
    guards.job_succeeded(2)
    clock.advance(BACKSTOP / 2 + 0.1)  # past the stall limit, before the backstop


def _check(guards: RunGuards) -> None:
    guards.check_stalled(StalledBook(), BACKSTOP, False, lambda: SourceStats())


def test_a_job_whose_trees_never_settle_stops_the_run(tmp_path: Path) -> None:
    clock = ManualClock()
    guards, feed = _guards(tmp_path, clock)
    _run_round(guards, feed, clock, acker_restarted=False)
    with pytest.raises(RunStopped, match="none of its 500 trees has completed"):
        _check(guards)


def test_an_acker_restarted_during_the_job_explains_its_pending_trees(tmp_path: Path) -> None:
    clock = ManualClock()
    guards, feed = _guards(tmp_path, clock)
    _run_round(guards, feed, clock, acker_restarted=True)
    _check(guards)  # no stop: the restarted acker lost them, the backstop replays them
    assert guards.job_ends == {}  # and the round is not looked at again


def test_an_outage_of_an_earlier_round_does_not_hide_a_stall(tmp_path: Path) -> None:
    clock = ManualClock()
    guards, feed = _guards(tmp_path, clock)
    feed.breaks = 3  # streams broke before this round's job started
    _run_round(guards, feed, clock, acker_restarted=False)
    with pytest.raises(RunStopped):
        _check(guards)


def test_an_acker_stopped_under_a_feed_counts_as_a_stream_break(tmp_path: Path) -> None:
    """The witness the check relies on: a real acker going away breaks the feed's stream to it."""
    with local_cluster(1, message_timeout=5.0) as ackers, ClusterClient(ackers.addresses) as client:
        feed = OutcomeFeed(client, "stall-test", Checkpoint(tmp_path), interval=0.05).start()
        try:
            wait_until(lambda: not feed.closed_streams(), "the outcome stream to open", timeout=10.0)
            assert feed.stream_breaks() == 0
            ackers.servers[0].stop(0)
            wait_until(lambda: feed.stream_breaks() > 0, "the stream to break", timeout=10.0)
        finally:
            feed.close()
            close_clients()
