"""Requests that do not decode, and oversize input echoed in errors: clean statuses, short messages, quiet logs."""

from __future__ import annotations

import logging

import grpc
import pytest
from acker_client.testing import ManualClock
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

from acker_service.decode_guard import RateLimitedLog

INIT = int(OpKind.INIT)

# Bytes no ApplyRequest/SubscribeRequest/DescribeRequest decodes from: a truncated
# length-delimited field, an end-group with no start, and bad UTF-8 in a string field
# (field 5 is ApplyRequest.spouts, field 1 SubscribeRequest.spout; each skips the other as unknown).
UNDECODABLE = {
    "truncated": b"\x2a\x10abc",
    "stray end-group": b"\x0c",
    "bad utf-8 spout": b"\x2a\x02\xff\xfe\x0a\x02\xff\xfe",
}
METHODS = ["Apply", "Subscribe", "Describe"]


def _raw_call(channel: grpc.Channel, method: str, payload: bytes) -> grpc.RpcError:
    """Send raw bytes to an Acker method (no serializer); return the error it ends with."""
    path = f"/acker_service.v1.Acker/{method}"
    if method == "Subscribe":
        call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            list(call(payload, timeout=10))
    else:
        call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(payload, timeout=10)
    return caught.value


@pytest.fixture
def channel(make_server):
    server = make_server()
    with grpc.insecure_channel(server.address) as ch:
        ch.server = server  # type: ignore[attr-defined]
        yield ch


# DescribeRequest has no fields: for it the "bad utf-8" bytes are unknown fields, which is valid.
CASES = [(m, k) for m in METHODS for k in sorted(UNDECODABLE) if (m, k) != ("Describe", "bad utf-8 spout")]


@pytest.mark.parametrize(("method", "kind"), CASES)
def test_undecodable_request_is_invalid_argument(channel, method, kind):
    """Bytes that are not the method's request message end with INVALID_ARGUMENT and a short message."""
    error = _raw_call(channel, method, UNDECODABLE[kind])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "not a valid" in error.details()
    assert len(error.details()) < 400


def test_undecodable_requests_log_one_line_not_a_traceback_each(channel, caplog):
    """A burst of garbage requests writes at most one log line and no traceback."""
    caplog.set_level(logging.INFO)
    for _ in range(50):
        _raw_call(channel, "Apply", UNDECODABLE["truncated"])
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(records) <= 1, [r.getMessage()[:200] for r in records]
    assert not any(r.exc_info for r in records)
    assert channel.server.call(lambda: channel.server.ledger.pending_trees) == 0


def test_huge_spout_name_in_apply_is_invalid_argument_with_a_short_message(make_server, connect):
    """A 64 KiB spout name is INVALID_ARGUMENT (not RESOURCE_EXHAUSTED from echoing it into the trailers)."""
    server = make_server()
    stub = connect(server)
    name = "x" * 65536
    request = acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[7], values=[1], spouts=[name])
    with pytest.raises(grpc.RpcError) as caught:
        stub.Apply(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert len(caught.value.details()) < 400
    assert server.call(lambda: server.ledger.pending_trees) == 0


def test_huge_spout_name_in_subscribe_is_invalid_argument(make_server, connect):
    """Subscribe with a 64 KiB spout name is refused with INVALID_ARGUMENT and a short message."""
    server = make_server()
    stub = connect(server)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Subscribe(acker_pb2.SubscribeRequest(spout="y" * 65536), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert len(caught.value.details()) < 400


def test_rate_limited_log_counts_between_lines(caplog):
    """The decode-failure log writes one line per interval, carrying how many failures it summarises."""
    clock = ManualClock()
    limiter = RateLimitedLog(interval=60, clock=clock)
    caplog.set_level(logging.WARNING, logger="acker_service")
    for _ in range(5):
        limiter.note("x")
    clock.advance(61)
    limiter.note("y")
    lines = [r.getMessage() for r in caplog.records]
    assert limiter.lines == 2 and len(lines) == 2
    assert lines[1].startswith("5 undecodable")
