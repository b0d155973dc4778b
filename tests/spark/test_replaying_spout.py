"""The replaying spout without Spark or a server: the delivery is the message id, replays after backoff, close."""

from __future__ import annotations

import threading

from acker_client.testing import ManualClock
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome
from acker_spark import Delivery, ReplayPolicy
from acker_spark.driver_fed.replaying_spout import ReplayingSpout

from ..client.fakes import RecordingCluster


class Outcomes:
    """on_outcome calls, in order, with a way to wait for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Delivery, Outcome, bool]] = []
        self.cond = threading.Condition()

    def __call__(self, delivery: Delivery, outcome: Outcome, final: bool) -> None:
        with self.cond:
            self.calls.append((delivery, outcome, final))
            self.cond.notify_all()

    def wait_for(self, n: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.calls) >= n, 10)


def _spout(cluster, outcomes, clock, **options) -> ReplayingSpout:
    policy = ReplayPolicy(max_attempts=2, backoff_base=1.0)
    return ReplayingSpout(cluster, on_outcome=outcomes, policy=policy, timeout=60.0, clock=clock, **options).start()


def _feed(*deliveries: Delivery):
    queue = list(deliveries)
    return lambda: queue.pop(0) if queue else None


def test_a_failure_is_replayed_after_its_backoff_then_dead_on_the_last_attempt():
    """FAILED queues attempt 2 after the backoff (not final); attempt 2 failing is final; the delivery is the id."""
    cluster, outcomes, clock = RecordingCluster(), Outcomes(), ManualClock()
    spout = _spout(cluster, outcomes, clock)
    try:
        first = Delivery("k", "v", 1)
        (tracked,) = spout.take(None, _feed(first))
        assert tracked.value is first
        (root,) = tracked.message_id.roots
        cluster.push(0, 1, 1, [root], [acker_pb2.OUTCOME_FAILED])
        assert outcomes.wait_for(1) and outcomes.calls[0] == (first, Outcome.FAILED, False)
        assert spout.take(None, _feed()) == []  # backoff not over
        assert spout.busy()
        clock.advance(1.0)
        (again,) = spout.take(None, _feed())
        assert again.value == Delivery("k", "v", 2)
        (root2,) = again.message_id.roots
        cluster.push(0, 1, 2, [root2], [acker_pb2.OUTCOME_TIMED_OUT])
        assert outcomes.wait_for(2) and outcomes.calls[1] == (again.value, Outcome.TIMED_OUT, True)
        assert not spout.busy() and spout.unsettled == 0
    finally:
        spout.close()


def test_a_full_spout_pushes_the_delivery_back_for_next_time():
    """With max_pending trees in flight, take() stops and the delivery it could not emit goes out first next time."""
    cluster, outcomes, clock = RecordingCluster(), Outcomes(), ManualClock()
    spout = _spout(cluster, outcomes, clock, max_pending=1)
    try:
        feed = _feed(Delivery("a", 1, 1), Delivery("b", 2, 1))
        (a,) = spout.take(None, feed)
        assert spout.take(None, feed) == [] and spout.busy()
        (root,) = a.message_id.roots
        cluster.push(0, 1, 1, [root], [acker_pb2.OUTCOME_ACKED])
        assert outcomes.wait_for(1) and outcomes.calls[0] == (a.value, Outcome.ACKED, True)
        (b,) = spout.take(None, feed)
        assert b.value == Delivery("b", 2, 1)
    finally:
        spout.close()


def test_close_ends_pending_trees_lost_and_not_final():
    """Trees pending at close end LOST, reported not final and never queued for replay."""
    cluster, outcomes, clock = RecordingCluster(), Outcomes(), ManualClock()
    spout = _spout(cluster, outcomes, clock)
    (tracked,) = spout.take(None, _feed(Delivery("k", "v", 1)))
    spout.close()
    assert outcomes.wait_for(1) and outcomes.calls == [(tracked.value, Outcome.LOST, False)]
    assert spout.schedule.empty
