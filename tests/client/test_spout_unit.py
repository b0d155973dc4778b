"""Spout logic without a server: backstop on an injected clock, exactly-once callbacks, back-pressure."""

from __future__ import annotations

import threading

import pytest
from acker_client import ShardFailure, ShardUnavailable, Spout, SpoutFull
from acker_client.spout import default_backstop
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome

from .fakes import RecordingCluster
from .polling import wait_until

ACKED, FAILED, TIMED_OUT = acker_pb2.OUTCOME_ACKED, acker_pb2.OUTCOME_FAILED, acker_pb2.OUTCOME_TIMED_OUT


def root_of(t) -> int:
    (root,) = t.message_id.roots
    return root


def test_default_backstop_covers_the_ackers_latest_expiry():
    """The default backstop is T + T/(b-1) (latest acker expiry) plus a margin."""
    assert default_backstop(30.0, 3) == pytest.approx(30 + 15 + 6)
    assert default_backstop(1.0, 3) == pytest.approx(1 + 0.5 + 1)
    assert default_backstop(10.0, 5) > 10 + 2.5


def test_default_timeout_read_from_describe(make_spout):
    """Without an explicit timeout the spout derives its backstop from the ackers' Describe."""
    cluster = RecordingCluster(shard_count=2, message_timeout=4.0, buckets=3)
    spout = make_spout(cluster)
    assert spout.timeout == pytest.approx(default_backstop(4.0, 3))
    assert sorted(s[0] for s in cluster.subscribes) == [0, 1]  # subscribed to every shard


def test_emit_sends_init_with_xor_of_edges(make_spout):
    """emit_to(k) draws k edges, returns k tuples of one root, and inits with their xor."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=5.0)
    tuples = spout.emit_to("rec", "m1", targets=3)
    root = root_of(tuples[0])
    assert {root_of(t) for t in tuples} == {root}
    xor = 0
    for t in tuples:
        xor ^= t.message_id[root]
    assert cluster.calls == [("init", root, xor, spout.name)]
    assert spout.pending == 1


def test_outcomes_call_back_once_and_late_ones_are_counted(make_spout, recorder):
    """ACKED, FAILED and TIMED_OUT reach on_ack/on_fail once; a repeated or unknown root is counted as late."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=5.0)
    roots = [root_of(spout.emit(i, f"m{i}")) for i in range(3)]
    cluster.push(0, 1, 1, roots, [ACKED, FAILED, TIMED_OUT])
    cluster.push(0, 1, 4, [roots[0], 12345], [FAILED, ACKED])
    assert recorder.wait_for(3)
    assert spout.wait_idle(10)
    stats = spout.stats
    assert (stats.acked, stats.failed, stats.timed_out, stats.lost) == (1, 1, 1, 0)
    assert recorder.outcome("m0") == "acked"
    assert recorder.outcome("m1") is Outcome.FAILED
    assert recorder.outcome("m2") is Outcome.TIMED_OUT
    wait_until(lambda: spout.stats.late_outcomes == 2)


def test_backstop_fails_as_lost_on_injected_clock(make_spout, recorder, clock):
    """Records with no outcome are failed LOST once the backstop timeout passes on the spout's clock."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=10.0, clock=clock, check_interval=3600)
    first = [root_of(spout.emit(i, i)) for i in range(3)]
    clock.advance(5)
    spout.emit(3, 3)
    clock.advance(4.9)
    assert spout.check_timeouts() == 0
    clock.advance(0.2)
    assert spout.check_timeouts() == 3
    assert spout.wait_idle(0.01) is False and spout.pending == 1
    cluster.push(0, 1, 1, first[:1], [ACKED])  # too late: already failed as lost
    wait_until(lambda: spout.stats.late_outcomes == 1)
    clock.advance(5)
    assert spout.check_timeouts() == 1
    assert spout.wait_idle(10)
    assert [r for _, r in recorder.calls] == [Outcome.LOST] * 4
    recorder.assert_exactly_once(range(4))


def test_try_emit_and_blocking_emit_respect_max_pending(make_spout):
    """At max_pending try_emit returns None, emit times out with SpoutFull, and a blocked emit resumes on an outcome."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=60.0, max_pending=2)
    a = spout.emit("a", "a")
    spout.emit("b", "b")
    assert spout.try_emit("c", "c") is None
    with pytest.raises(SpoutFull):
        spout.emit("c", "c", timeout=0.05)
    done = threading.Event()
    threading.Thread(target=lambda: (spout.emit("d", "d"), done.set()), daemon=True).start()
    assert not done.wait(0.1)
    cluster.push(0, 1, 1, [root_of(a)], [ACKED])
    assert done.wait(10)
    assert spout.stats.emitted == 3 and spout.pending == 2


def test_failed_init_batch_fails_its_roots_as_lost(make_spout, recorder):
    """When the client reports a dropped batch, the spout fails that batch's inits as LOST at once."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=60.0)
    roots = [root_of(spout.emit(i, i)) for i in range(3)]
    failure = ShardFailure(0, "127.0.0.1:1", None, "down", 2, tuple(roots[:2]) + (999,))
    for listener in cluster.listeners:
        listener(ShardUnavailable([failure], "test"))
    assert recorder.wait_for(2)
    assert recorder.outcome(0) is Outcome.LOST and recorder.outcome(1) is Outcome.LOST
    assert recorder.outcome(2) is None and spout.pending == 1


def test_emit_swallows_a_failed_init(make_spout, recorder, clock):
    """If sending the init raises, emit still returns the tuple and the record ends LOST (one callback)."""
    cluster = RecordingCluster()
    cluster.init_error = ShardUnavailable([], "down")
    spout = make_spout(cluster, timeout=1.0, clock=clock, check_interval=3600)
    t = spout.emit("r", "r")
    assert t.message_id
    clock.advance(2)
    spout.check_timeouts()
    assert spout.wait_idle(10)
    assert recorder.outcome("r") is Outcome.LOST


def test_close_fails_pending_as_lost(recorder):
    """Closing a spout with records in flight fails them as LOST so no emit goes without a callback."""
    cluster = RecordingCluster()
    spout = Spout(cluster, on_ack=recorder.on_ack, on_fail=recorder.on_fail, timeout=60.0).start()
    for i in range(5):
        spout.emit(i, i)
    spout.close()
    recorder.assert_exactly_once(range(5))
    assert recorder.by_reason() == {Outcome.LOST: 5}
    assert spout.stats.lost == 5 and spout.pending == 0


def test_callback_errors_do_not_stop_delivery(make_spout, caplog):
    """A callback that raises is logged and the following records still get their callbacks."""
    cluster = RecordingCluster()
    seen = []

    def on_ack(mid):
        seen.append(mid)
        if mid == 0:
            raise RuntimeError("user bug")

    spout = make_spout(cluster, timeout=60.0)
    spout.on_ack = on_ack
    roots = [root_of(spout.emit(i, i)) for i in range(3)]
    cluster.push(0, 1, 1, roots, [ACKED] * 3)
    assert spout.wait_idle(10)
    assert seen == [0, 1, 2]
    assert "user bug" in caplog.text


def test_resume_skips_sequences_already_seen(make_spout, recorder):
    """A re-sent sequence is skipped; a new incarnation restarts numbering; resume uses the last sequence."""
    cluster = RecordingCluster()
    spout = make_spout(cluster, timeout=60.0)
    roots = [root_of(spout.emit(i, i)) for i in range(4)]
    cluster.push(0, 7, 1, roots[:2], [ACKED, ACKED])
    cluster.push(0, 7, 2, roots[1:3], [ACKED, ACKED])  # sequence 2 again, then 3
    cluster.push(0, 9, 1, roots[3:], [FAILED])  # the acker restarted
    assert spout.wait_idle(10)
    sub = spout.subscriptions[0]
    assert (sub.incarnation, sub.last_sequence, sub.duplicates_skipped) == (9, 1, 1)
    sub.interrupt()
    wait_until(lambda: len(cluster.subscribes) == 2)
    assert cluster.subscribes[-1] == (0, spout.name, 9, 1)
    recorder.assert_exactly_once(range(4))
    assert spout.stats.late_outcomes == 0
