"""The spout under the acker's progress timeouts and lifetime cap (issue 21): its backstop follows the cap."""

from __future__ import annotations

from acker_client import BoltCollector
from acker_client.pending import default_backstop
from acker_protocol.wire import Outcome


def test_backstop_follows_the_cap_in_progress_mode():
    """Fixed mode: the message timeout bounds a tree. Progress mode: only the cap does (the spout sees no acks)."""
    fixed = default_backstop(10.0, 3)
    assert fixed == default_backstop(10.0, 3, timeout_mode="fixed", max_tree_lifetime=600.0)
    progress = default_backstop(10.0, 3, timeout_mode="progress", max_tree_lifetime=600.0)
    assert progress - fixed == 600.0 - 10.0
    assert progress > 600.0 + 5.0, "later than the acker's latest end: the cap plus one rotation period"


def test_a_capped_tree_reaches_on_fail_as_lifetime_exceeded(make_ackers, make_client, make_spout, recorder, clock):
    """Acks keep a progress-mode tree past three timeouts; the cap ends it with a reason the spout tells apart."""
    (server,) = make_ackers(1, clock=clock, message_timeout=1.0, timeout_mode="progress", max_tree_lifetime=4.0)
    client = make_client([server.address])
    spout = make_spout(client)
    assert spout.timeout == default_backstop(1.0, 3, timeout_mode="progress", max_tree_lifetime=4.0)
    bolt = BoltCollector(client)
    busy = spout.emit("busy", "busy")
    client.flush()
    for _ in range(8):
        clock.advance(0.6)
        bolt.ack(bolt.emit("child", [busy]))  # progress: a child acked, the root still open
        client.flush()
        server.advance()
    assert recorder.wait_for(1)
    assert recorder.outcome("busy") is Outcome.LIFETIME_EXCEEDED
    assert spout.stats.timed_out == 1
