"""Server limits: concurrent RPCs, streams per connection, subscriptions, keepalive; each refuses with a clear status."""

from __future__ import annotations

import time

import grpc
import pytest
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.cli import build_parser, config_from_args
from acker_service.config import ConfigError, ServerConfig


def _open(server, spout: str, stub):
    """Open a Subscribe stream and read its opening batch, so it is certainly running on the server."""
    stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout=spout), timeout=30)
    next(stream)
    return stream


def _wait_subscribers(server, n: int) -> None:
    """Wait (bounded) until the server has seen cancelled streams end."""
    deadline = time.monotonic() + 10
    while server.call(lambda: server.hub.subscribers) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.call(lambda: server.hub.subscribers) == n


def test_concurrent_rpc_limit_refuses_with_resource_exhausted(make_server, connect):
    """With --max-concurrent-rpcs 2 and two open streams, a third call is RESOURCE_EXHAUSTED; freed, it works."""
    server = make_server(max_concurrent_rpcs=2)
    stub = connect(server)
    streams = [_open(server, f"s{i}", stub) for i in range(2)]
    with pytest.raises(grpc.RpcError) as caught:
        connect(server).Describe(acker_pb2.DescribeRequest(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    streams[0].cancel()
    _wait_subscribers(server, 1)
    deadline = time.monotonic() + 10
    while True:  # the server releases the slot just after the stream's handler ends
        try:
            assert connect(server).Describe(acker_pb2.DescribeRequest(), timeout=10).shard_count == 1
            break
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    streams[1].cancel()


def test_subscription_limit_refuses_new_spouts_but_allows_takeover(make_server, connect):
    """At --max-subscriptions, a new spout is RESOURCE_EXHAUSTED, a takeover still works, Apply is served."""
    server = make_server(max_subscriptions=2)
    stub = connect(server)
    first, second = _open(server, "a", stub), _open(server, "b", stub)
    with pytest.raises(grpc.RpcError) as caught:
        _open(server, "c", stub)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-subscriptions" in caught.value.details()
    takeover = _open(server, "a", stub)
    with pytest.raises(grpc.RpcError) as ended:
        next(first)
    assert ended.value.code() == grpc.StatusCode.ABORTED
    request = acker_pb2.ApplyRequest(kinds=[1], root_ids=[5], values=[1], spouts=["a"])
    assert stub.Apply(request, timeout=10).applied == 1
    for stream in (second, takeover):
        stream.cancel()


def test_streams_per_connection_limit_keeps_other_connections_served(make_server, connect):
    """With --max-streams-per-connection 2, a third call on that connection waits (here: past its deadline)
    while another connection is served at once."""
    server = make_server(max_streams_per_connection=2)
    # Channels with equal options share one connection; a local subchannel pool gives this one its own.
    busy = connect(server, local_pool=True)
    streams = [_open(server, f"s{i}", busy) for i in range(2)]
    with pytest.raises(grpc.RpcError) as caught:
        busy.Describe(acker_pb2.DescribeRequest(), timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert connect(server).Describe(acker_pb2.DescribeRequest(), timeout=10).shard_count == 1
    for stream in streams:
        stream.cancel()


def test_client_pinging_too_often_is_disconnected_others_are_not(make_server):
    """A client pinging every 50 ms (server permits one per 3 s) loses its connection: too_many_pings."""
    server = make_server(min_ping_interval=3.0)
    flooding = [
        ("grpc.keepalive_time_ms", 50),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with (
        grpc.insecure_channel(server.address, options=flooding) as bad,
        grpc.insecure_channel(server.address, options=grpc_options.client_options()) as good,
    ):
        stream = acker_pb2_grpc.AckerStub(bad).Subscribe(acker_pb2.SubscribeRequest(spout="pinger"), timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "too many pings" in (caught.value.details() or "").lower().replace("_", " ")
        assert acker_pb2_grpc.AckerStub(good).Describe(acker_pb2.DescribeRequest(), timeout=10).shard_count == 1


def test_limit_flags_fall_back_to_environment():
    """Every limit flag reads its ACKER_* variable; a flag on the command line wins."""
    env = {
        "ACKER_MAX_CONCURRENT_RPCS": "10",
        "ACKER_MAX_STREAMS_PER_CONNECTION": "3",
        "ACKER_MAX_SUBSCRIPTIONS": "4",
        "ACKER_MIN_PING_INTERVAL": "2.5",
    }
    config = config_from_args(build_parser(env).parse_args(["--max-subscriptions", "5"]))
    assert (config.max_concurrent_rpcs, config.max_streams_per_connection) == (10, 3)
    assert (config.max_subscriptions, config.min_ping_interval) == (5, 2.5)


@pytest.mark.parametrize("overrides", [{"max_subscriptions": -1}, {"min_ping_interval": 0}, {"min_ping_interval": 60}])
def test_bad_limits_are_refused_at_start(overrides):
    """Negative limits and a ping interval the acker's own clients would violate fail with a clear message."""
    with pytest.raises(ConfigError):
        ServerConfig(**overrides)
