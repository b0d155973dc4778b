"""Adaptive linger: a buffer leaves at once when its shard is idle and grows while a batch is in flight.

The flusher's decision (:meth:`Sender._send_due`) is driven with an injected
time and a recorded "send", so no test waits for a clock; one end-to-end test
checks that an operation reaches a real acker with a flush interval far longer
than the test.
"""

from __future__ import annotations

import pytest
from acker_client import new_id
from acker_client.delivery import ConnectionMonitor
from acker_client.process import ProcessState
from acker_client.sender import MAX_IN_FLIGHT, Sender

from .polling import wait_until

INTERVAL = 0.002


@pytest.fixture
def flusher():
    """A Sender over a two-shard ProcessState whose background sends are recorded, not made."""
    state = ProcessState(["127.0.0.1:1", "127.0.0.1:2"])
    sender = Sender(("127.0.0.1:1", "127.0.0.1:2"), deadline=1.0, flush_interval=INTERVAL, report=lambda e, b: None)
    sent: list[int] = []

    def record(st, shard):
        # What send_in_background does to the state, without a thread or a call.
        st.buffers[shard] = type(st.buffers[shard])()
        st.busy[shard] = st.busy.get(shard, 0) + 1
        sent.append(shard)

    sender.send_in_background = lambda st, shard: record(st, shard)  # type: ignore[method-assign]
    yield sender, state, sent
    state.close_channels()


def _buffer(state: ProcessState, shard: int, started: float) -> None:
    state.buffers[shard].init(new_id(), 1, "linger")
    state.buffers[shard].started = started


def test_an_idle_shard_sends_at_once(flusher):
    """Nothing in flight: the buffer goes now, however young (the flush interval is no wait)."""
    sender, state, sent = flusher
    _buffer(state, 0, started=100.0)
    assert sender._send_due(state, now=100.0) == 0.0
    assert sent == [0]


def test_a_busy_shard_lets_the_buffer_grow_until_the_interval(flusher):
    """A batch in flight: the next waits, at most flush_interval from its first operation, then is pipelined."""
    sender, state, sent = flusher
    state.busy[0] = 1
    state.connections.set(0, ConnectionMonitor.READY)
    _buffer(state, 0, started=100.0)
    assert sender._send_due(state, now=100.0005) == pytest.approx(INTERVAL - 0.0005)
    assert sent == []
    assert sender._send_due(state, now=100.0 + INTERVAL) == 0.0
    assert sent == [0] and state.busy[0] == 2


def test_no_more_than_max_in_flight_and_none_behind_a_waiting_connection(flusher):
    """At MAX_IN_FLIGHT, or while the shard's last batch waits for its connection, the buffer only grows."""
    sender, state, sent = flusher
    state.busy[0] = MAX_IN_FLIGHT
    state.connections.set(0, ConnectionMonitor.READY)
    _buffer(state, 0, started=100.0)
    state.busy[1] = 1
    state.connections.set(1, ConnectionMonitor.WAITING)
    _buffer(state, 1, started=100.0)
    assert sender._send_due(state, now=200.0) is None  # nothing to wait for but a batch's end
    assert sent == []


def test_send_when_idle_false_keeps_the_fixed_linger(flusher):
    """The old behaviour on request: an idle shard's buffer still waits its full interval."""
    sender, state, sent = flusher
    sender.send_when_idle = False
    _buffer(state, 0, started=100.0)
    assert sender._send_due(state, now=100.001) == pytest.approx(INTERVAL - 0.001)
    assert sender._send_due(state, now=100.0 + INTERVAL) == 0.0
    assert sent == [0]


def test_an_operation_reaches_the_acker_with_an_hour_long_flush_interval(make_ackers, make_client):
    """End to end: with flush_interval=3600 s a lone init is still applied, because the shard was idle."""
    (server,) = make_ackers(1, message_timeout=60.0)
    client = make_client([server.address], flush_interval=3600.0)
    root = new_id()
    client.init(root, 1, "idle")
    wait_until(lambda: server.call(lambda: server.ledger.pending_trees) == 1, "the init to be applied")
    # The client counts a batch when the acker's answer arrives, a moment after the acker applied it.
    wait_until(lambda: client.stats.operations_sent == 1, "the acker's answer to be counted")
    assert client.stats.batches_sent == 1
