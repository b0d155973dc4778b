"""Subscribe through gRPC: delivery, retention, resume, takeover, overflow, timeouts, many streams."""

from __future__ import annotations

import grpc
import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

from acker_service.servicer import OUTCOMES_PER_MESSAGE

INIT, ACK, FAIL, RESET = (int(k) for k in (OpKind.INIT, OpKind.ACK, OpKind.FAIL, OpKind.RESET_TIMEOUT))
ACKED, FAILED, TIMED_OUT = acker_pb2.OUTCOME_ACKED, acker_pb2.OUTCOME_FAILED, acker_pb2.OUTCOME_TIMED_OUT
TIMEOUT_RESET = acker_pb2.OUTCOME_TIMEOUT_RESET


def subscribe(stub, spout="s", incarnation=0, after=0):
    """Open a stream and return it with its first (confirming) batch."""
    stream = stub.Subscribe(
        acker_pb2.SubscribeRequest(spout=spout, incarnation=incarnation, after_sequence=after), timeout=60
    )
    return stream, next(stream)


def read_outcomes(stream, count, first=None):
    """Read batches until `count` outcomes arrived; return [(sequence, root, outcome)] and dropped."""
    got, dropped = [], 0
    batches = [first] if first is not None else []
    while True:
        for batch in batches:
            dropped += batch.dropped
            got += [
                (batch.first_sequence + i, root, outcome)
                for i, (root, outcome) in enumerate(zip(batch.root_ids, batch.outcomes))
            ]
        if len(got) >= count:
            return got, dropped
        batches = [next(stream)]


def complete(apply, stub, roots, spout="s"):
    """Init and ack each root in one batch (each tree ends ACKED)."""
    apply(stub, [(INIT, r, r) for r in roots] + [(ACK, r, r) for r in roots], spout=spout)


def test_first_batch_confirms_the_subscription(make_server, connect):
    """The stream opens with an empty batch carrying the incarnation and the next sequence."""
    server = make_server()
    stream, first = subscribe(connect(server))
    assert (first.incarnation, first.first_sequence, len(first.root_ids), first.dropped) == (
        server.incarnation,
        1,
        0,
        0,
    )
    stream.cancel()


@pytest.mark.reference_engine
def test_live_outcomes_arrive_in_sequence(make_server, connect, apply):
    """Outcomes of trees applied while subscribed arrive with sequences 1, 2, 3 and their kinds."""
    server = make_server()
    stub = connect(server)
    stream, _ = subscribe(stub)
    complete(apply, stub, [10, 11])
    apply(stub, [(INIT, 12, 1), (FAIL, 12, 0)])
    got, dropped = read_outcomes(stream, 3)
    assert got == [(1, 10, ACKED), (2, 11, ACKED), (3, 12, FAILED)]
    assert dropped == 0
    stream.cancel()


def test_outcomes_are_batched_per_message(make_server, connect, apply):
    """10,000 retained outcomes arrive in a few messages of at most 4096, consecutive and complete."""
    server = make_server()
    stub = connect(server)
    roots = list(range(1, 10_001))
    complete(apply, stub, roots)
    stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout="s"), timeout=60)
    sizes, got = [], []
    while len(got) < len(roots):
        batch = next(stream)
        sizes.append(len(batch.root_ids))
        assert batch.first_sequence == len(got) + 1
        got += list(batch.root_ids)
    stream.cancel()
    assert got == roots
    assert max(sizes) == OUTCOMES_PER_MESSAGE
    assert len(sizes) <= 4


def test_outcomes_are_retained_until_the_spout_subscribes(make_server, connect, apply):
    """Outcomes produced before any subscriber are delivered when the spout subscribes."""
    server = make_server()
    stub = connect(server)
    complete(apply, stub, [1, 2, 3])
    stream, first = subscribe(stub)
    got, _ = read_outcomes(stream, 3, first)
    assert [root for _, root, _ in got] == [1, 2, 3]
    stream.cancel()


def test_resume_delivers_exactly_what_was_missed(make_server, connect, apply):
    """After a disconnect, resuming at (incarnation, last sequence) yields only the later outcomes, once."""
    server = make_server()
    stub = connect(server)
    stream, _ = subscribe(stub)
    complete(apply, stub, range(1, 6))
    got, _ = read_outcomes(stream, 5)
    last_seq = got[-1][0]
    stream.cancel()
    complete(apply, stub, range(6, 11))
    stream, first = subscribe(stub, incarnation=server.incarnation, after=last_seq)
    assert first.first_sequence == last_seq + 1
    missed, dropped = read_outcomes(stream, 5, first)
    assert [(seq, root) for seq, root, _ in missed] == [(6, 6), (7, 7), (8, 8), (9, 9), (10, 10)]
    assert dropped == 0
    complete(apply, stub, [11])
    assert read_outcomes(stream, 1)[0] == [(11, 11, ACKED)]  # nothing repeated before the new one
    stream.cancel()


def test_other_incarnation_starts_at_oldest_retained(make_server, connect, apply):
    """A position from another incarnation (an earlier acker process) replays all retained outcomes."""
    server = make_server()
    stub = connect(server)
    complete(apply, stub, [1, 2])
    stream, first = subscribe(stub, incarnation=server.incarnation ^ 1, after=1)
    got, _ = read_outcomes(stream, 2, first)
    assert [seq for seq, _, _ in got] == [1, 2]
    stream.cancel()


def test_new_subscription_takes_over_and_old_one_is_aborted(make_server, connect, apply):
    """A second Subscribe for the same spout ends the first with ABORTED and receives the outcomes."""
    server = make_server()
    stub = connect(server)
    old, _ = subscribe(stub)
    new, _ = subscribe(stub)
    with pytest.raises(grpc.RpcError) as caught:
        next(old)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert "took over" in caught.value.details()
    complete(apply, stub, [5])
    assert read_outcomes(new, 1)[0] == [(1, 5, ACKED)]
    assert server.call(lambda: server.hub.subscribers) == 1
    new.cancel()


def test_overflow_is_counted_as_dropped(make_server, connect, apply):
    """With retention 5 and 12 undelivered outcomes, the subscriber gets the newest 5 and dropped=7."""
    server = make_server(retain_outcomes=5)
    stub = connect(server)
    complete(apply, stub, range(1, 13))
    stream, first = subscribe(stub)
    got, dropped = read_outcomes(stream, 5, first)
    assert [(seq, root) for seq, root, _ in got] == [(s, s) for s in range(8, 13)]
    assert dropped == 7
    assert server.metrics.sample("acker_outcomes_dropped_total") == 7
    stream.cancel()


def test_retention_ages_out(make_server, connect, apply, clock):
    """Outcomes older than retain_seconds are evicted on the next tick and reported as dropped."""
    server = make_server(clock=clock, retain_seconds=10.0, message_timeout=60.0)
    stub = connect(server)
    complete(apply, stub, [1, 2, 3])
    clock.advance(11)
    server.advance()
    assert server.call(lambda: server.hub.retained) == 0
    stream, first = subscribe(stub)
    assert (len(first.root_ids), first.dropped, first.first_sequence) == (0, 3, 4)
    stream.cancel()


@pytest.mark.reference_engine
def test_timed_out_trees_are_delivered(make_server, connect, apply, clock):
    """Trees not completed within the timeout reach the spout as TIMED_OUT with their age as latency."""
    server = make_server(clock=clock, message_timeout=2.0, buckets=3)
    stub = connect(server)
    stream, _ = subscribe(stub)
    apply(stub, [(INIT, 7, 1), (INIT, 8, 1), (ACK, 9, 4)])  # 9 has no init: an orphan, never an outcome
    clock.advance(3.5)  # past T + T/(b-1) = 3 s: every entry has expired
    server.advance()
    batches = [next(stream)]
    got, _ = read_outcomes(stream, 2, batches[0])
    assert sorted((root, outcome) for _, root, outcome in got) == [(7, TIMED_OUT), (8, TIMED_OUT)]
    assert list(batches[0].latency_micros) == [3_500_000] * len(batches[0].latency_micros)
    pending, orphans = server.call(lambda: (server.ledger.pending_trees, server.ledger.orphan_entries))
    assert (pending, orphans) == (0, 0)
    assert server.ledger.stats.orphaned == 1
    stream.cancel()


def test_timeout_resets_reach_the_spout(make_server, connect, apply, clock):
    """A RESET_TIMEOUT on a tree with a known spout is streamed as TIMEOUT_RESET, then the real outcome follows."""
    server = make_server(clock=clock, message_timeout=2.0)
    stub = connect(server)
    stream, _ = subscribe(stub)
    apply(stub, [(INIT, 7, 3), (RESET, 5, 0)])  # root 5 is unknown: nothing to reset, nothing streamed
    clock.advance(0.5)
    apply(stub, [(RESET, 7, 0)])
    apply(stub, [(ACK, 7, 3)])
    got, _ = read_outcomes(stream, 2)
    assert [(root, outcome) for _, root, outcome in got] == [(7, TIMEOUT_RESET), (7, ACKED)]
    assert server.ledger.stats.acked == 1 and server.ledger.stats.resets == 1
    stream.cancel()


@pytest.mark.parametrize("spout", ["", "x" * 257])
def test_bad_spout_name_is_refused(make_server, connect, spout):
    """Subscribe with an empty or too long spout name fails with INVALID_ARGUMENT."""
    server = make_server()
    stream = connect(server).Subscribe(acker_pb2.SubscribeRequest(spout=spout), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spout name" in caught.value.details()


def test_many_open_streams_do_not_starve_apply(make_server, connect, apply):
    """With 40 open Subscribe streams, Apply still answers and every stream gets its own outcome."""
    server = make_server()
    stub = connect(server)
    streams = [subscribe(stub, spout=f"spout-{i}")[0] for i in range(40)]
    assert server.call(lambda: server.hub.subscribers) == 40
    for i in range(40):
        complete(apply, stub, [1000 + i], spout=f"spout-{i}")
    for i, stream in enumerate(streams):
        assert read_outcomes(stream, 1)[0] == [(1, 1000 + i, ACKED)]
    assert stub.Describe(acker_pb2.DescribeRequest(), timeout=10).pending_trees == 0
    for stream in streams:
        stream.cancel()


def test_stop_ends_open_streams_with_unavailable(make_server, connect, apply):
    """At shutdown an open stream ends with UNAVAILABLE (resubscribe) instead of holding the server."""
    server = make_server()
    stub = connect(server)
    complete(apply, stub, [1, 2])
    stream, first = subscribe(stub)
    assert list(first.root_ids) == [1, 2]
    server.stop(grace=30.0)  # would block for 30 s if streams were left to the grace period
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
