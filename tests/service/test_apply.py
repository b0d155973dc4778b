"""Apply and Describe through gRPC on a real server: batches, dedup keys, sharding and bad input."""

from __future__ import annotations

import grpc
import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


@pytest.mark.reference_engine
def test_batch_of_trees_is_applied_and_counted(make_server, connect, apply, ledger_state):
    """A batch that inits 100 trees and acks half of them leaves exactly the other half pending."""
    server = make_server()
    stub = connect(server)
    ops = [(INIT, root, root * 7) for root in range(1, 101)]
    ops += [(ACK, root, root * 7) for root in range(1, 51)]
    response = apply(stub, ops)
    assert (response.applied, response.deduplicated, response.ignored) == (150, 0, 0)
    pending, orphans, roots, stats = ledger_state(server)
    assert (pending, orphans) == (50, 0)
    assert roots == list(range(51, 101))
    assert (stats["inits"], stats["acks"], stats["acked"]) == (100, 50, 50)


def test_multi_spout_batch_routes_inits_by_index(make_server, connect, ledger_state):
    """spout_index picks each INIT's spout; FAIL resolves the tree for that spout."""
    server = make_server()
    stub = connect(server)
    request = acker_pb2.ApplyRequest(
        kinds=[INIT, INIT, FAIL],
        root_ids=[11, 12, 12],
        values=[3, 4, 0],
        spouts=["a", "b"],
        spout_index=[0, 1, 0],
    )
    assert stub.Apply(request, timeout=10).applied == 3
    assert server.call(lambda: (server.hub.retained_for("a"), server.hub.retained_for("b"))) == (0, 1)
    assert ledger_state(server)[:3] == (1, 0, [11])


def test_dedup_key_ignores_a_repeated_ack(make_server, connect, apply, ledger_state):
    """The same ACK with the same dedup key twice counts once: the tree stays pending, not cancelled."""
    server = make_server()
    stub = connect(server)
    apply(stub, [(INIT, 42, 0b11)])
    first = apply(stub, [(ACK, 42, 0b01)], dedup_keys=[777])
    again = apply(stub, [(ACK, 42, 0b01)], dedup_keys=[777])
    assert (first.applied, again.applied, again.deduplicated) == (1, 0, 1)
    assert ledger_state(server)[0] == 1
    done = apply(stub, [(ACK, 42, 0b10)], dedup_keys=[778])
    assert done.applied == 1
    pending, _, _, stats = ledger_state(server)
    assert (pending, stats["acked"], stats["deduplicated"]) == (0, 1, 1)


@pytest.mark.reference_engine
def test_messages_for_ended_trees_become_orphans(make_server, connect, apply):
    """An ack or fail for a tree that already ended makes a spout-less entry, never a second outcome."""
    server = make_server()
    stub = connect(server)
    apply(stub, [(INIT, 9, 5), (ACK, 9, 5)])
    late = apply(stub, [(ACK, 9, 5), (FAIL, 9, 0)])
    assert (late.applied, late.ignored) == (2, 0)
    assert server.call(lambda: (server.ledger.pending_trees, server.ledger.orphan_entries)) == (0, 1)
    assert server.call(lambda: server.ledger.stats.acked + server.ledger.stats.failed) == 1


def test_describe_reports_configuration(make_server, connect, apply):
    """Describe returns the shard, settings, incarnation, version and pending trees."""
    server = make_server(
        shard_index=1,
        shard_count=3,
        message_timeout=12.5,
        buckets=4,
        max_batch=500,
        retain_outcomes=77,
        retain_seconds=9.0,
    )
    stub = connect(server)
    apply(stub, [(INIT, 4, 1), (INIT, 7, 1)])
    d = stub.Describe(acker_pb2.DescribeRequest(), timeout=10)
    assert (d.shard_index, d.shard_count, d.buckets, d.max_batch) == (1, 3, 4, 500)
    assert (d.message_timeout_seconds, d.retain_outcomes, d.retain_seconds) == (12.5, 77, 9.0)
    assert d.pending_trees == 2
    assert d.incarnation == server.incarnation != 0
    assert d.version == __import__("acker_service").__version__
    assert d.replicas == 1


def test_replica_shard_keeps_followed_roots_and_refuses_foreign_ones(make_server, connect, apply, ledger_state):
    """With --replicas 2, shard 1 of 3 applies its own roots and shard 0's, refuses shard 2's, and says so in Describe."""
    server = make_server(shard_index=1, shard_count=3, replicas=2)
    stub = connect(server)
    assert stub.Describe(acker_pb2.DescribeRequest(), timeout=10).replicas == 2
    assert apply(stub, [(INIT, 4, 1), (INIT, 6, 1)]).applied == 2  # 4 % 3 == 1 owned, 6 % 3 == 0 followed
    before = ledger_state(server)
    with pytest.raises(grpc.RpcError) as caught:
        apply(stub, [(ACK, 4, 1), (INIT, 8, 1)])  # 8 % 3 == 2: kept by shards 2 and 0
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "root 8 belongs to shard 2 and shard 0 of 3" in caught.value.details()
    assert ledger_state(server) == before


def test_wrong_shard_is_refused_whole(make_server, connect, apply, ledger_state):
    """A batch with one foreign root fails with FAILED_PRECONDITION naming the owner, and applies nothing."""
    server = make_server(shard_index=1, shard_count=3)
    stub = connect(server)
    before = ledger_state(server)
    with pytest.raises(grpc.RpcError) as caught:
        apply(stub, [(INIT, 4, 1), (INIT, 8, 1)])  # 4 % 3 == 1 is ours, 8 % 3 == 2 is not
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "root 8 belongs to shard 2 of 3" in caught.value.details()
    assert "this acker is shard 1" in caught.value.details()
    assert ledger_state(server) == before
    assert apply(stub, [(INIT, 4, 1)]).applied == 1


BAD_REQUESTS = {
    "zero root": (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[0], values=[1], spouts=["s"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "root id 0",
    ),
    "length mismatch": (
        acker_pb2.ApplyRequest(kinds=[INIT, ACK], root_ids=[1], values=[1, 2], spouts=["s"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "root_ids has 1",
    ),
    "dedup length": (
        acker_pb2.ApplyRequest(kinds=[ACK, ACK], root_ids=[1, 2], values=[1, 2], dedup_keys=[5]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dedup_keys has 1",
    ),
    "empty spout": (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[1], values=[1], spouts=[""]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "1 to 256 bytes",
    ),
    "long spout": (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[1], values=[1], spouts=["x" * 257]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "257 bytes",
    ),
    "init without spout": (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[1], values=[1]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "names no spout",
    ),
    "spout index out of range": (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[1], values=[1], spouts=["a", "b"], spout_index=[2]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "spout index 2",
    ),
    "unknown kind": (
        acker_pb2.ApplyRequest(kinds=[ACK, 9], root_ids=[1, 2], values=[1, 2]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown kind 9",
    ),
    "unspecified kind": (
        acker_pb2.ApplyRequest(kinds=[0], root_ids=[1], values=[1]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown kind 0",
    ),
    "value on fail": (
        acker_pb2.ApplyRequest(kinds=[FAIL], root_ids=[1], values=[3]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FAIL with a non-zero value",
    ),
    "value on reset": (
        acker_pb2.ApplyRequest(kinds=[RESET], root_ids=[1], values=[3]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RESET_TIMEOUT with a non-zero value",
    ),
    "too many operations": (
        acker_pb2.ApplyRequest(kinds=[ACK] * 11, root_ids=range(1, 12), values=[1] * 11),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "maximum of 10",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_changes_nothing_and_server_keeps_serving(case, make_server, connect, apply, ledger_state):
    """Each malformed batch gets its status code and an actionable message; the ledger is untouched."""
    request, code, fragment = BAD_REQUESTS[case]
    server = make_server(max_batch=10)
    stub = connect(server)
    apply(stub, [(INIT, 100, 6)])  # some state the bad request must not disturb
    before = ledger_state(server)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Apply(request, timeout=10)
    assert caught.value.code() == code
    assert fragment in caught.value.details()
    assert ledger_state(server) == before
    assert apply(stub, [(ACK, 100, 6)]).applied == 1


def test_oversized_message_is_refused_by_grpc(make_server, connect, apply, ledger_state):
    """A message over --max-message-bytes gets RESOURCE_EXHAUSTED before it reaches the ledger."""
    server = make_server(max_message_bytes=64 * 1024, max_batch=1_000_000)
    stub = connect(server)  # the client may send up to its default (8 MiB)
    before = ledger_state(server)
    n = 10_000  # ~ 10k * (8 + 8 + 1) bytes > 64 KiB
    request = acker_pb2.ApplyRequest(kinds=[ACK] * n, root_ids=range(1, n + 1), values=[1] * n)
    assert request.ByteSize() > 64 * 1024
    with pytest.raises(grpc.RpcError) as caught:
        stub.Apply(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ledger_state(server) == before
    assert apply(stub, [(INIT, 5, 5)]).applied == 1


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\xff\xff\xff", id="truncated-varint-tag"),
        pytest.param(b"\x12\x05\x01", id="packed-field-past-the-end"),
        pytest.param(b"\x2a\x02\xc3\x28", id="spout-name-not-utf8"),
    ],
)
def test_undecodable_request_is_invalid_argument(payload, make_server, ledger_state):
    """Bytes that are no ApplyRequest get INVALID_ARGUMENT naming the message type, never UNKNOWN."""
    server = make_server()
    before = ledger_state(server)
    with grpc.insecure_channel(server.address) as channel:
        raw_apply = channel.unary_unary("/acker_service.v1.Acker/Apply")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as caught:
            raw_apply(payload, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "not a valid acker_service.v1.ApplyRequest" in caught.value.details()
        # The server keeps serving: a valid request (as bytes) after the bad one applies.
        reply = raw_apply(
            acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[5], values=[0], spouts=["s"]).SerializeToString(), timeout=10
        )
        assert acker_pb2.ApplyResponse.FromString(reply).applied == 1
    assert ledger_state(server)[3]["acked"] == before[3]["acked"] + 1
