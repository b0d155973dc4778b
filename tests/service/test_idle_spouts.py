"""Idle per-spout state (retention log, sequence counter) is forgotten after the retention window."""

from __future__ import annotations

import gc
import os
import time
import tracemalloc

import grpc
import pytest
from acker_client.testing import ManualClock
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import Outcome

from acker_service.outcome_columns import OutcomeColumns, Resolution
from acker_service.outcome_hub import OutcomeHub

INC = 0x5EED
RETAIN_SECONDS = 60.0
# 5,000 distinct names: the leak this guards against held ~700 bytes per name, 3.5 MB here, 14 times the
# test's 256 KiB tolerance; ACKER_IDLE_SPOUT_NAMES=30000 repeats the original leak measurement.
NAMES = int(os.environ.get("ACKER_IDLE_SPOUT_NAMES", "5000"))


def _hub(clock: ManualClock) -> OutcomeHub:
    return OutcomeHub(retain_outcomes=100, retain_seconds=RETAIN_SECONDS, incarnation=INC, clock=clock)


def _subscribe_and_leave(hub: OutcomeHub, names) -> None:
    """Subscribe to each name, take the opening batch, publish one outcome, and unsubscribe."""
    for i, name in enumerate(names):
        sub = hub.subscribe(name, incarnation=0, after_sequence=0, wake=lambda: None)
        hub.take(sub)
        hub.publish(OutcomeColumns.from_resolutions([Resolution(name, i + 1, Outcome.ACKED, 0.001)]))
        hub.take(sub)
        hub.unsubscribe(sub)


def _traced_bytes_after(action) -> int:
    """Bytes allocated (and still held) by ``action``, measured with tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_distinct_spout_names_do_not_leak_after_the_retention_window():
    """5,000 spouts (NAMES) that subscribe once and go away leave nothing behind once their window passed.

    The control subscribes one name as often: it holds one spout's state.
    Both are measured as memory the hub still holds after the window.
    """
    clock = ManualClock()
    hub, control = _hub(clock), _hub(clock)

    def run(target: OutcomeHub, names) -> None:
        _subscribe_and_leave(target, names)
        clock.advance(RETAIN_SECONDS + 1)
        target.expire()

    distinct = _traced_bytes_after(lambda: run(hub, (f"spout-{os.getpid()}-{i:08x}" for i in range(NAMES))))
    same = _traced_bytes_after(lambda: run(control, ("one-spout" for _ in range(NAMES))))
    # Before the fix: ~700 bytes per name (about 3.5 MB here). Now as little as the control, give or take.
    assert distinct < same + 256 * 1024, (distinct, same)
    assert (hub.tracked_spouts, control.tracked_spouts) == (0, 0)


def test_state_is_kept_within_the_window_and_while_subscribed():
    """A spout that is subscribed, or left less than the window ago, keeps its log and its numbering."""
    clock = ManualClock()
    hub = _hub(clock)
    live = hub.subscribe("live", incarnation=0, after_sequence=0, wake=lambda: None)
    _subscribe_and_leave(hub, ["recent"])
    clock.advance(RETAIN_SECONDS / 2)
    hub.expire()
    assert hub.tracked_spouts == 2
    clock.advance(RETAIN_SECONDS)
    hub.expire()
    assert hub.tracked_spouts == 1  # "recent" went, "live" stays while subscribed
    hub.unsubscribe(live)


def test_sequences_never_go_back_after_a_spout_was_forgotten():
    """A spout resubscribing after its state expired gets sequence numbers beyond any it saw before."""
    clock = ManualClock()
    hub = _hub(clock)
    sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=lambda: None)
    hub.take(sub)
    hub.publish(OutcomeColumns.from_resolutions([Resolution("s", r, Outcome.ACKED, 0.0) for r in range(1, 11)]))
    last = hub.take(sub)
    assert last is not None
    seen = last.first_sequence + len(last.roots) - 1
    hub.unsubscribe(sub)
    clock.advance(RETAIN_SECONDS + 1)
    hub.expire()
    assert hub.tracked_spouts == 0
    again = hub.subscribe("s", incarnation=INC, after_sequence=seen, wake=lambda: None)
    hub.take(again)
    hub.publish(OutcomeColumns.from_resolutions([Resolution("s", 99, Outcome.FAILED, 0.0)]))
    chunk = hub.take(again)
    assert chunk is not None and chunk.roots.tolist() == [99]
    assert chunk.first_sequence > seen


@pytest.mark.parametrize("names", [200])
def test_server_forgets_spouts_whose_streams_ended(make_server, connect, clock, names):
    """Through gRPC: subscriptions of many names end; after the window the shard tracks none of them."""
    server = make_server(clock=clock, retain_seconds=RETAIN_SECONDS)
    stub = connect(server)
    for i in range(names):
        stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout=f"gone-{i}"), timeout=10)
        next(stream)
        stream.cancel()
    with pytest.raises(grpc.RpcError):
        next(stream)

    # The server notices each cancel asynchronously: wait (bounded) until every stream has ended.
    deadline = time.monotonic() + 10
    while server.call(lambda: server.hub.subscribers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.call(lambda: server.hub.subscribers) == 0
    assert server.call(lambda: server.hub.tracked_spouts) == names
    clock.advance(RETAIN_SECONDS + 1)
    server.advance()
    assert server.call(lambda: server.hub.tracked_spouts) == 0
    assert server.metrics.sample("acker_spouts_tracked") == 0
