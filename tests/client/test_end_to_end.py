"""Spout and bolts against real acker servers: trees ack only at the last ack, fail once, time out, reset."""

from __future__ import annotations

import pytest
from acker_client import BoltCollector
from acker_protocol.wire import Outcome

from .polling import wait_until


@pytest.fixture
def three(make_ackers, make_client):
    """A 3-shard in-process cluster (60 s acker timeout) and a verified client."""
    servers = make_ackers(3, message_timeout=60.0)
    return servers, make_client([s.address for s in servers])


def pending_trees(client) -> int:
    """Trees pending on all shards, from Describe."""
    return sum(client.describe(i).pending_trees for i in range(client.shard_count))


def test_chain_acks_only_after_last_ack(three, make_spout, recorder):
    """spout -> bolt -> bolt: the tree stays pending until the last tuple is acked, then ACKED once."""
    _, client = three
    spout = make_spout(client, timeout=60.0)
    b1, b2 = BoltCollector(client), BoltCollector(client)
    t = spout.emit("rec", "m")
    mid = b1.emit("mid", [t])
    b1.ack(t)
    leaf = b2.emit("leaf", [mid])
    b2.ack(mid)
    client.flush()
    assert pending_trees(client) == 1 and recorder.outcome("m") is None
    b2.ack(leaf)
    client.flush()
    assert spout.wait_idle(30)
    assert recorder.outcome("m") == "acked"
    assert pending_trees(client) == 0


def test_many_trees_with_fan_out(three, make_spout, recorder):
    """200 trees, each sent to 2 targets with 3 children per target, all ACKED exactly once."""
    _, client = three
    spout = make_spout(client, timeout=60.0)
    bolt = BoltCollector(client)
    for i in range(200):
        for t in spout.emit_to(i, i, targets=2):
            kids = [bolt.emit((i, k), [t]) for k in range(3)]
            bolt.ack(t)
            for kid in kids:
                bolt.ack(kid)
    assert spout.wait_idle(60)
    recorder.assert_exactly_once(range(200))
    assert recorder.by_reason() == {"acked": 200}
    assert spout.stats.late_outcomes == 0


def test_dag_anchored_to_two_roots(three, make_spout, recorder):
    """A join anchored to two records' tuples keeps both trees pending until it is acked; then both ACK."""
    _, client = three
    spout = make_spout(client, timeout=60.0)
    bolt = BoltCollector(client)
    a, b = spout.emit("a", "a"), spout.emit("b", "b")
    join = bolt.emit("a+b", [a, b])
    bolt.ack(a)
    bolt.ack(b)
    out = bolt.emit("out", [join])
    bolt.ack(join)
    client.flush()
    assert pending_trees(client) == 2 and recorder.calls == []
    bolt.ack(out)
    assert spout.wait_idle(30)
    assert recorder.outcome("a") == "acked" and recorder.outcome("b") == "acked"


@pytest.mark.parametrize("where", ["spout tuple", "middle", "leaf"])
def test_fail_anywhere_fails_once(three, make_spout, recorder, where):
    """Failing any tuple of a tree ends it FAILED exactly once, even if the other tuples are acked after."""
    _, client = three
    spout = make_spout(client, timeout=60.0)
    bolt = BoltCollector(client)
    t = spout.emit("rec", "m")
    mid = bolt.emit("mid", [t])
    leaf = bolt.emit("leaf", [mid])
    victim = {"spout tuple": t, "middle": mid, "leaf": leaf}[where]
    bolt.fail(victim)
    client.flush()
    for other in (t, mid, leaf):
        if other is not victim:
            bolt.ack(other)
    client.flush()
    assert spout.wait_idle(30)
    assert recorder.outcome("m") is Outcome.FAILED
    assert spout.stats.failed == 1 and pending_trees(client) == 0


def test_unacked_tree_times_out_at_the_acker(make_ackers, make_client, make_spout, recorder, clock):
    """A tree nobody acks ends TIMED_OUT (reported by the acker, before the spout's own backstop)."""
    (server,) = make_ackers(1, clock=clock, message_timeout=1.0)
    client = make_client([server.address])
    spout = make_spout(client, timeout=60.0)
    spout.emit("rec", "m")
    client.flush()
    clock.advance(0.9)
    server.advance()
    assert client.describe(0).pending_trees == 1
    clock.advance(1.0)  # past T + T/(b-1) = 1.5 s
    server.advance()
    assert spout.wait_idle(30)
    assert recorder.outcome("m") is Outcome.TIMED_OUT


def test_reset_timeout_keeps_slow_tree_alive(make_ackers, make_client, make_spout, recorder, clock):
    """A tree reset every 0.6 s outlives three 1 s timeouts and then acks; an unreset twin times out."""
    (server,) = make_ackers(1, clock=clock, message_timeout=1.0)
    client = make_client([server.address])
    spout = make_spout(client, timeout=60.0)
    bolt = BoltCollector(client)
    slow = spout.emit("slow", "slow")
    spout.emit("twin", "twin")
    client.flush()
    for _ in range(6):
        clock.advance(0.6)
        server.advance()
        bolt.reset_timeout(slow)
        client.flush()
    assert recorder.wait_for(1)
    assert recorder.outcome("twin") is Outcome.TIMED_OUT and recorder.outcome("slow") is None
    bolt.ack(slow)
    assert spout.wait_idle(30)
    assert recorder.outcome("slow") == "acked"


def test_reset_timeout_restarts_the_spouts_backstop(make_ackers, make_client, make_spout, recorder, clock):
    """Resets reach the spout, so a tree kept alive for longer than the spout's backstop is not failed as LOST."""
    (server,) = make_ackers(1, clock=clock, message_timeout=1.0)
    client = make_client([server.address])
    spout = make_spout(client, timeout=2.0, clock=clock)
    bolt = BoltCollector(client)
    slow = spout.emit("slow", "slow")
    client.flush()
    for i in range(1, 7):  # 3.6 s of fake time in all, well past the 2 s backstop
        clock.advance(0.6)
        server.advance()
        bolt.reset_timeout(slow)
        client.flush()
        wait_until(lambda: spout.stats.timeout_resets == i, "the reset notification")  # noqa: B023 (polled now)
        assert spout.check_timeouts() == 0
    assert recorder.outcome("slow") is None and spout.pending == 1
    bolt.ack(slow)
    assert spout.wait_idle(30)
    assert recorder.outcome("slow") == "acked"


def test_without_resets_the_backstop_fails_the_record_as_lost(make_ackers, make_client, make_spout, recorder, clock):
    """Control for the test above: the same 3.6 s without resets ends LOST at the spout's 2 s backstop."""
    (server,) = make_ackers(1, clock=clock, message_timeout=60.0)
    client = make_client([server.address])
    spout = make_spout(client, timeout=2.0, clock=clock)
    spout.emit("slow", "slow")
    client.flush()
    clock.advance(3.6)
    assert spout.check_timeouts() == 1
    assert spout.wait_idle(30)
    assert recorder.outcome("slow") is Outcome.LOST
