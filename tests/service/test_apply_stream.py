"""ApplyStream on a real server: acks in order, refusals that leave the stream serving, limits, shutdown."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


class Stream:
    """One ApplyStream call driven by hand: ``send`` a request, ``ack`` reads the next answer."""

    def __init__(self, stub, **call_options) -> None:
        self._requests: queue.Queue = queue.Queue()
        self.call = stub.ApplyStream(iter(self._requests.get, None), **call_options)
        self._acks = iter(self.call)

    def send(self, request: acker_pb2.ApplyRequest) -> None:
        self._requests.put(request)

    def ack(self) -> acker_pb2.ApplyAck:
        return next(self._acks)

    def close(self) -> None:
        self._requests.put(None)


def _request(ops, spouts=("s",), dedup_keys=()) -> acker_pb2.ApplyRequest:
    kinds, roots, values = zip(*ops)
    return acker_pb2.ApplyRequest(
        kinds=list(kinds), root_ids=list(roots), values=list(values), spouts=list(spouts), dedup_keys=list(dedup_keys)
    )


def test_describe_offers_the_stream(make_server, connect):
    """Describe tells clients the acker serves ApplyStream (an older acker's answer lacks the field: False)."""
    assert connect(make_server()).Describe(acker_pb2.DescribeRequest(), timeout=10).apply_stream


def test_requests_are_applied_and_acked_in_order(make_server, connect, ledger_state):
    """Each request gets one ack with its sequence and counts; the ledger ends as with the same Apply calls."""
    server = make_server()
    stream = Stream(connect(server))
    stream.send(_request([(INIT, root, root * 3) for root in range(1, 11)]))
    stream.send(_request([(ACK, root, root * 3) for root in range(1, 6)]))
    stream.send(_request([(ACK, 7, 1)], dedup_keys=[5]))
    stream.send(_request([(ACK, 7, 1)], dedup_keys=[5]))
    acks = [stream.ack() for _ in range(4)]
    assert [a.sequence for a in acks] == [1, 2, 3, 4]
    assert [(a.applied, a.deduplicated, a.code) for a in acks] == [(10, 0, 0), (5, 0, 0), (1, 0, 0), (0, 1, 0)]
    stream.close()
    assert list(stream.call) == []  # the client closed its side: the call ends OK after the last ack
    assert stream.call.code() == grpc.StatusCode.OK
    assert ledger_state(server)[2] == [6, 7, 8, 9, 10]


@pytest.mark.parametrize(
    ("request_bytes", "code", "words"),
    [
        (_request([(INIT, 0, 1)]).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT, "root"),
        (_request([(FAIL, 5, 9)]).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT, "value"),
        (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, ""),
        (_request([(INIT, 2, 1)]).SerializeToString(), grpc.StatusCode.FAILED_PRECONDITION, "shard"),
        (
            _request([(INIT, r, 1) for r in range(3, 12, 2)]).SerializeToString(),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "max",
        ),
    ],
)
def test_a_refused_request_changes_nothing_and_the_stream_goes_on(
    make_server, connect, ledger_state, request_bytes, code, words
):
    """A bad request is acked with Apply's status and message; nothing of it is applied; the next one is served."""
    server = make_server(shard_index=1, shard_count=2, max_batch=4)
    channel = grpc.insecure_channel(server.address)
    try:
        call = channel.stream_stream("/acker_service.v1.Acker/ApplyStream")
        good = _request([(INIT, 3, 1)]).SerializeToString()
        responses = call(iter([request_bytes, good]), timeout=10)
        first, second = (acker_pb2.ApplyAck.FromString(r) for r in responses)
    finally:
        channel.close()
    assert (first.sequence, first.code, first.applied) == (1, code.value[0], 0)
    assert words in first.message.lower() and first.message
    assert (second.sequence, second.code, second.applied) == (2, 0, 1)
    assert ledger_state(server)[2] == [3]


def test_a_message_over_the_receive_limit_ends_the_call(make_server, connect, ledger_state):
    """grpc refuses an oversized message for the whole call (RESOURCE_EXHAUSTED); what was acked stays applied."""
    server = make_server(max_message_bytes=4096)
    stream = Stream(connect(server))
    stream.send(_request([(INIT, 1, 1)]))
    assert stream.ack().applied == 1
    stream.send(_request([(INIT, root, 1) for root in range(2, 1000)]))
    with pytest.raises(grpc.RpcError) as caught:
        stream.ack()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ledger_state(server)[2] == [1]


def test_shutdown_ends_an_idle_stream_with_unavailable_at_once(make_server, connect):
    """A stream waiting for requests does not hold the server for its grace: it ends UNAVAILABLE, saying what to do."""
    server = make_server(grace=30.0)
    stream = Stream(connect(server))
    stream.send(_request([(INIT, 1, 1)]))
    assert stream.ack().applied == 1
    stopped = threading.Event()
    stopper = threading.Thread(target=lambda: (server.stop(), stopped.set()))
    stopper.start()
    with pytest.raises(grpc.RpcError) as caught:
        stream.ack()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "send the requests not yet acknowledged again" in caught.value.details()
    # Bounded by the test's own timeout, not by the grace: the stream no longer holds the server.
    assert stopped.wait(10)
    stopper.join()
