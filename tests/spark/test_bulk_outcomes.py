"""The driver side in bulk, without Spark or a server: batch emits, outcomes settled and written per batch."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from acker_client.testing import ManualClock
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome
from acker_spark import DeadLetterStore, Delivery, GuaranteedPipeline, ReplayPolicy
from acker_spark import dead_letter as dead_letter_module
from acker_spark.driver_fed.replaying_spout import ReplayingSpout
from acker_spark.driver_fed.replays import ReplaySchedule

from ..client.fakes import RecordingCluster
from ..client.polling import wait_until

ACKED, FAILED, TIMED_OUT = acker_pb2.OUTCOME_ACKED, acker_pb2.OUTCOME_FAILED, acker_pb2.OUTCOME_TIMED_OUT
POLICY = ReplayPolicy(max_attempts=2, backoff_base=1.0)


class Batches:
    """on_outcomes calls of a ReplayingSpout, with a way to wait for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Delivery], list[tuple[Delivery, Outcome, bool]]]] = []
        self.cond = threading.Condition()

    def __call__(self, acked: list[Delivery], failed: list[tuple[Delivery, Outcome, bool]]) -> None:
        with self.cond:
            self.calls.append((list(acked), list(failed)))
            self.cond.notify_all()

    def wait_for(self, records: int) -> bool:
        """Wait until ``records`` deliveries were reported, over all calls."""
        with self.cond:
            return self.cond.wait_for(lambda: sum(len(a) + len(f) for a, f in self.calls) >= records, 10)


def push(cluster: RecordingCluster, first_sequence: int, tracked: list[Any], outcomes: list[int]) -> None:
    """Stream one batch of outcomes for ``tracked`` (one shard)."""
    cluster.push(0, 1, first_sequence, [t.message_id.roots[0] for t in tracked], outcomes)


def count_connections(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[int]:
    """Count the SQLite connections ``module`` opens (one per transaction)."""
    opened: list[int] = []
    real = module.open_db

    def counting(path):
        opened.append(1)
        return real(path)

    monkeypatch.setattr(module, "open_db", counting)
    return opened


def test_schedule_batch_forms_read_the_clock_once_and_keep_order():
    """retry_many queues what has attempts left (refusing the rest), push_back_many keeps its order, pop_due_many limits."""
    clock = ManualClock()
    reads = []
    schedule = ReplaySchedule(POLICY, lambda: reads.append(1) or clock())
    flags = schedule.retry_many([Delivery("a", 1, 1), Delivery("dead", 1, 2), Delivery("b", 1, 1)])
    assert flags == [True, False, True] and len(reads) == 1 and schedule.waiting == 2
    schedule.push_back_many([Delivery("n1", 1, 1), Delivery("n2", 1, 1), Delivery("r", 1, 2)])
    schedule.push_back_many([Delivery("n0", 1, 1)])  # pushed back later, goes out before the earlier ones
    assert [d.key for d in schedule.pop_due_many(2)] == ["r", "n0"]  # the due replay first
    clock.advance(1.0)
    assert [(d.key, d.attempt) for d in schedule.pop_due_many(None)] == [("a", 2), ("b", 2), ("n1", 1), ("n2", 1)]
    assert schedule.empty


def test_replaying_spout_emits_a_take_in_one_batch_and_settles_outcomes_per_batch():
    """take() sends one init_columns for its deliveries; a batch of outcomes is one on_outcomes call, with finals."""
    cluster, batches, clock = RecordingCluster(), Batches(), ManualClock()
    spout = ReplayingSpout(cluster, on_outcomes=batches, policy=POLICY, timeout=60.0, clock=clock).start()
    try:
        feed = iter([Delivery(k, k, 1) for k in "abc"] + [Delivery("z", "z", 2)])
        tracked = spout.take(None, lambda: next(feed, None))
        assert [t.value.key for t in tracked] == ["a", "b", "c", "z"]
        assert [c[0] for c in cluster.calls] == ["init_columns"]
        push(cluster, 1, tracked, [ACKED, FAILED, TIMED_OUT, FAILED])
        assert batches.wait_for(4)
        wait_until(lambda: spout.unsettled == 0, "the batch to be settled")
        (acked, failed), *more = batches.calls
        assert not more and [d.key for d in acked] == ["a"]
        assert [(d.key, o, final) for d, o, final in failed] == [
            ("b", Outcome.FAILED, False),
            ("c", Outcome.TIMED_OUT, False),
            ("z", Outcome.FAILED, True),  # its second attempt: no replay left
        ]
        assert spout.schedule.waiting == 2 and spout.busy()
    finally:
        spout.close()


def test_replaying_spout_take_stops_at_max_pending_and_keeps_the_rest_first_in_line():
    """take() reads no more records than fit; deliveries it took but could not emit go out first next time."""
    cluster, batches, clock = RecordingCluster(), Batches(), ManualClock()
    spout = ReplayingSpout(cluster, on_outcomes=batches, policy=POLICY, timeout=60.0, clock=clock, max_pending=2)
    spout.start()
    try:
        feed = iter([Delivery(k, k, 1) for k in "abcd"])
        first = spout.take(None, lambda: next(feed, None))
        assert [t.value.key for t in first] == ["a", "b"] and spout.take(None, lambda: next(feed, None)) == []
        assert next(feed).key == "c"  # the source was not read past what fit
        spout.schedule.push_back_many([Delivery("c", "c", 1)])
        push(cluster, 1, first, [ACKED, ACKED])
        assert batches.wait_for(2)
        wait_until(lambda: spout.pending == 0, "room")
        again = spout.take(None, lambda: next(feed, None))
        assert [t.value.key for t in again] == ["c", "d"] and spout.unsettled == 2
    finally:
        spout.close()


def test_replaying_spout_per_delivery_callback_sees_every_delivery_despite_an_error(caplog):
    """With on_outcome, each delivery of a batch is reported once even when the callback raises for one of them."""
    cluster, clock, seen = RecordingCluster(), ManualClock(), []

    def on_outcome(delivery, outcome, final):
        seen.append((delivery.key, outcome))
        if delivery.key == "a":
            raise RuntimeError("driver bug")

    spout = ReplayingSpout(cluster, on_outcome=on_outcome, policy=POLICY, timeout=60.0, clock=clock).start()
    try:
        feed = iter([Delivery(k, k, 1) for k in "ab"])
        push(cluster, 1, spout.take(None, lambda: next(feed, None)), [ACKED, ACKED])
        wait_until(lambda: spout.unsettled == 0 and len(seen) == 2, "both deliveries")
    finally:
        spout.close()
    assert seen == [("a", Outcome.ACKED), ("b", Outcome.ACKED)] and "driver bug" in caplog.text
    with pytest.raises(ValueError, match="exactly one"):
        ReplayingSpout(cluster, on_outcome=on_outcome, on_outcomes=Batches(), timeout=1.0)


def test_dead_letters_are_written_per_batch_in_one_transaction(tmp_path: Path, monkeypatch):
    """add_many stores every row with one connection, as add would row by row."""
    store = DeadLetterStore(tmp_path / "db")
    dead_opened = count_connections(monkeypatch, dead_letter_module)
    assert store.add_many([("k1", {"v": 1}, Outcome.FAILED, 3), ("k2", "x", Outcome.LOST, 5)]) == 2
    assert store.add_many([("k1", {"v": 1}, Outcome.TIMED_OUT, 4)]) == 1  # replaces, as add does
    assert store.add_many([]) == 0
    assert len(dead_opened) == 2
    assert [(d.key, d.record, d.reason, d.attempts) for d in store.all()] == [
        ("k1", {"v": 1}, Outcome.TIMED_OUT, 4),
        ("k2", "x", Outcome.LOST, 5),
    ]


class _NoSpark:
    """A stand-in for a SparkSession: a GuaranteedPipeline given its partitions and running no job asks it nothing."""

    defaultParallelism = 1


def test_pipeline_counts_a_batch_of_outcomes_and_writes_its_dead_letters_at_once(tmp_path: Path, monkeypatch):
    """GuaranteedPipeline counts a batch, calls on_outcome per delivery and on_outcomes once, dead-letters in one go."""
    per_delivery, per_batch = [], []
    store = DeadLetterStore(tmp_path / "dl.sqlite")
    pipeline = GuaranteedPipeline(
        _NoSpark(),  # partitions given: a pipeline that runs no job asks Spark nothing
        RecordingCluster(),
        dead_letters=store,
        partitions=1,
        on_outcome=lambda d, o: per_delivery.append((d.key, o)),
        on_outcomes=lambda acked, failed: per_batch.append(([d.key for d in acked], [(d.key, o) for d, o in failed])),
    )
    opened = count_connections(monkeypatch, dead_letter_module)
    a, b, c, d = (Delivery(k, k, 2) for k in "abcd")
    pipeline._on_outcomes([a], [(b, Outcome.FAILED, True), (c, Outcome.TIMED_OUT, False), (d, Outcome.LOST, True)])
    stats = pipeline.snapshot()
    assert (stats.acked, stats.failed, stats.timed_out, stats.lost) == (1, 1, 1, 1)
    assert per_delivery == [("a", Outcome.ACKED), ("b", Outcome.FAILED), ("c", Outcome.TIMED_OUT), ("d", Outcome.LOST)]
    assert per_batch == [(["a"], [("b", Outcome.FAILED), ("c", Outcome.TIMED_OUT), ("d", Outcome.LOST)])]
    pipeline._write_dead_letters()
    assert len(opened) == 1 and pipeline.stats.dead_lettered == 2
    assert {(x.key, x.reason, x.attempts) for x in store.all()} == {("b", Outcome.FAILED, 2), ("d", Outcome.LOST, 2)}
