"""The lease keeper without Spark: what each renewal sends, the lifetime cap, the timeout it learns from Describe."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from acker_client.testing import ManualClock
from acker_spark import Bolt
from acker_spark.steps.leases import ClusterTimeouts, LeaseKeeper, cluster_timeouts


class Renewals:
    """A stand-in for ClusterClient.reset_timeout_columns: the roots of every call."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.sent = threading.Event()

    def __call__(self, roots: np.ndarray) -> None:
        self.calls.append(sorted(roots.tolist()))
        self.sent.set()


def test_every_renewal_resets_every_root_held_so_far_once():
    """Roots held one at a time and a column at a time are all renewed, each once per round."""
    renewals, clock = Renewals(), ManualClock()
    keeper = LeaseKeeper(renewals, 1.0, clock=clock)
    assert keeper.renew_now() == 0 and renewals.calls == []  # nothing held: nothing sent
    keeper.hold(5)
    keeper.hold(5)
    keeper.hold_column(np.array([7, 9], dtype=np.uint64))
    assert keeper.renew_now() == 3
    keeper.hold(11)
    clock.advance(1.0)
    keeper.renew_now()
    assert renewals.calls == [[5, 7, 9], [5, 7, 9, 11]]


def test_a_root_is_renewed_no_longer_than_the_cap():
    """Past ``cap`` seconds after the renewal that first sent it, a root is left to its timeout."""
    renewals, clock = Renewals(), ManualClock()
    keeper = LeaseKeeper(renewals, 1.0, cap=2.5, clock=clock)
    keeper.hold(1)
    keeper.renew_now()  # t=0: root 1's generation
    clock.advance(1.0)
    keeper.hold(2)
    keeper.renew_now()  # t=1: root 2's generation
    clock.advance(1.0)
    keeper.renew_now()  # t=2
    clock.advance(1.0)
    keeper.renew_now()  # t=3: root 1 is 3 s past its first renewal
    clock.advance(1.0)
    assert keeper.renew_now() == 0  # t=4: both past the cap
    assert renewals.calls == [[1], [1, 2], [1, 2], [2]]


def test_the_thread_renews_until_stopped():
    """start() renews on a thread every interval; stop() ends it."""
    renewals = Renewals()
    keeper = LeaseKeeper(renewals, 0.01)
    keeper.hold(3)
    with keeper:
        assert renewals.sent.wait(30)
    assert renewals.calls[0] == [3]
    assert keeper._thread is not None and not keeper._thread.is_alive()


def test_bad_intervals_and_caps_are_refused():
    """A lease needs a positive interval and cap; a bolt a positive message timeout."""
    with pytest.raises(ValueError, match="interval"):
        LeaseKeeper(Renewals(), 0)
    with pytest.raises(ValueError, match="cap"):
        LeaseKeeper(Renewals(), 1.0, cap=-1)
    with pytest.raises(ValueError, match="message_timeout"):
        Bolt(lambda tuples, collector: iter(()), ["127.0.0.1:1"], message_timeout=0)


class Describing:
    """A client whose shards answer Describe with (timeout, max lifetime), or fail."""

    def __init__(self, addresses: list[str], answers: list[tuple[float, float] | None]) -> None:
        self.addresses = addresses
        self.shard_count = len(answers)
        self.answers = answers
        self.asked = 0

    def describe(self, shard: int) -> SimpleNamespace:
        self.asked += 1
        answer = self.answers[shard]
        if answer is None:
            raise ConnectionError(f"shard {shard} unreachable")
        return SimpleNamespace(message_timeout_seconds=answer[0], max_tree_lifetime_seconds=answer[1])


def test_the_timeouts_come_from_the_first_shard_that_answers_and_are_cached():
    """Shard 0 down, shard 1 says 30 s and a 600 s lifetime cap: that, asked once per process."""
    client = Describing(["10.0.0.1:7100", "10.0.0.2:7100"], [None, (30.0, 600.0)])
    assert cluster_timeouts(client) == ClusterTimeouts(30.0, 600.0)
    assert cluster_timeouts(client) == ClusterTimeouts(30.0, 600.0)
    assert client.asked == 2


def test_a_cluster_that_did_not_answer_is_asked_again_after_a_minute():
    """No answer: None (the task runs without leases), and tasks in the next minute do not wait for Describe."""
    clock = ManualClock()
    client = Describing(["10.0.0.3:7100"], [None])
    assert cluster_timeouts(client, clock) is None
    assert cluster_timeouts(client, clock) is None and client.asked == 1
    clock.advance(61)
    client.answers = [(12.0, 0.0)]
    assert cluster_timeouts(client, clock) == ClusterTimeouts(12.0, None)  # 0: no lifetime cap


def test_a_bolt_caps_its_leases_at_the_ackers_lifetime_unless_given_one():
    """lease_cap=None takes the ackers' --max-tree-lifetime; an explicit cap wins; the interval is a third."""
    client = Describing(["10.0.0.4:7100"], [(9.0, 120.0)])
    client.reset_timeout_columns = Renewals()  # type: ignore[attr-defined]
    for cap, expected in ((None, 120.0), (45.0, 45.0)):
        keeper = Bolt(lambda tuples, collector: iter(()), client.addresses, lease_cap=cap).start_leases(client)  # type: ignore[arg-type]
        assert keeper is not None
        keeper.stop()
        assert (keeper.interval, keeper.cap) == (3.0, expected)
    assert Bolt(lambda tuples, collector: iter(()), client.addresses, leases=False).start_leases(client) is None  # type: ignore[arg-type]


def test_a_bolt_holds_every_tree_of_the_tuples_its_function_reads():
    """Tuples of one tree and of several (a join's output) hand all their roots to the keeper as they are read."""
    from acker_client import MessageId, TrackedTuple
    from acker_spark.steps.executor import _holding

    renewals = Renewals()
    keeper = LeaseKeeper(renewals, 1.0, clock=ManualClock())
    tuples = [TrackedTuple("a", MessageId({3: 1})), TrackedTuple("b", MessageId({4: 1, 5: 2})), TrackedTuple("c")]
    reading = _holding(iter(tuples), keeper)
    next(reading)
    keeper.renew_now()
    assert [t.value for t in reading] == ["b", "c"]
    keeper.renew_now()
    assert renewals.calls == [[3], [3, 4, 5]]


def test_a_bolt_learns_timeout_and_lifetime_cap_from_a_real_acker():
    """Against an acker run with --message-timeout 9 --max-tree-lifetime 120: renew every 3 s, stop at 120 s."""
    from acker_client import ClusterClient

    from acker_service.config import ServerConfig
    from acker_service.server import AckerServer

    server = AckerServer(
        ServerConfig(host="127.0.0.1", port=0, grace=0.2, message_timeout=9.0, max_tree_lifetime=120.0)
    ).start()
    try:
        with ClusterClient([server.address]) as client:
            keeper = Bolt(lambda tuples, collector: iter(()), [server.address]).start_leases(client)
            assert keeper is not None
            keeper.stop()
    finally:
        server.stop(0)
    assert (keeper.interval, keeper.cap) == (3.0, 120.0)


def test_trees_the_tasks_reader_started_are_renewed_before_the_bolt_receives_them(tmp_path):
    """Issue 28: the reader's emission file of the same task attempt is a source of held roots, read incrementally."""
    from acker_spark.task_roots import ReaderTrees
    from acker_spark.tracking.emission_log import EmissionWriter

    renewals, clock = Renewals(), ManualClock()
    keeper = LeaseKeeper(renewals, 1.0, clock=clock)
    trees = ReaderTrees(tmp_path, partition=3, task_attempt=17)
    keeper.add_source(trees.new_roots)
    assert keeper.renew_now() == 0, "no file yet: the reader has read nothing"
    writer = EmissionWriter(tmp_path, 2, 3, 17)
    other = EmissionWriter(tmp_path, 2, 4, 18)  # another task's reader: not this bolt's trees
    writer.write(np.array([30, 10], dtype=np.uint64), np.array([1, 2], dtype=np.uint64), np.ones(2, np.uint16))
    other.write(np.array([99], dtype=np.uint64), np.array([9], dtype=np.uint64), np.ones(1, np.uint16))
    assert keeper.renew_now() == 2
    writer.write(np.array([20], dtype=np.uint64), np.array([3], dtype=np.uint64), np.ones(1, np.uint16))
    clock.advance(1.0)
    keeper.renew_now()
    assert renewals.calls == [[10, 30], [10, 20, 30]]
    writer.close()
    other.close()
