"""Channel and server options shared by the acker server and its clients.

Keepalive must be configured on both sides together: a client that pings more
often than the server permits is disconnected with "too_many_pings", and an
idle outcome subscription dies with it. Keeping both lists here makes that
mismatch impossible.
"""

from __future__ import annotations

__all__ = [
    "KEEPALIVE_TIME_MS",
    "MIN_PING_INTERVAL_MS",
    "MAX_PING_STRIKES",
    "MIN_RECV_PING_INTERVAL_OPTION",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "server_options",
    "client_options",
]

# Both sides ping every 4 s and give up on a peer that has not answered for
# 2 s, so a vanished acker (or client) is noticed within about 6 s, even on an
# idle Subscribe stream whose TCP connection would otherwise look alive for
# minutes. A ping every 4 s per connection costs nothing measurable.
#
# gRPC's server polices the pings it receives (chttp2's ping abuse policy):
# - a ping that arrives sooner than MIN_RECV_PING_INTERVAL_WITHOUT_DATA after
#   the previous one is a strike (on a connection without calls the minimum is
#   two hours unless the server permits pings without calls, which it does
#   here: the spout's idle outcome stream must survive between calls);
# - the server sending headers or data clears the strikes, so only an idle
#   connection collects them;
# - past MAX_PING_STRIKES strikes it sends GOAWAY ENHANCE_YOUR_CALM
#   "too_many_pings", and the client doubles its keepalive interval for the
#   next connections of that channel ("Current keepalive time (before
#   throttling)" in its log).
# The channel argument that sets the minimum is "grpc.http2.min_ping_interval_
# without_data_ms" (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS). An
# unknown option name is ignored without a word: spelled after the C macro, as
# it once was here, the server kept gRPC's default of five minutes, every
# 4 s keepalive ping of an idle stream was a strike, and the eleventh closed the
# connection about 40 s in. tests/service/test_keepalive.py keeps a stream idle
# past the strike limit.
# The server accepts pings every 1 s or slower, a quarter of the clients'
# interval, and tolerates 10 early ones: a client's keepalive ping can follow
# closely on the pings gRPC itself sends (flow-control probes, after cancelled
# calls). The client's "grpc.http2.max_pings_without_data" 0 lets keepalive
# ping while no data flows (the default stops after two).
KEEPALIVE_TIME_MS = 4_000
KEEPALIVE_TIMEOUT_MS = 2_000
MIN_PING_INTERVAL_MS = 1_000
MAX_PING_STRIKES = 10

MIN_RECV_PING_INTERVAL_OPTION = "grpc.http2.min_ping_interval_without_data_ms"

# Reconnect backoff for ackers on a LAN: first retry after 100 ms, doubling up
# to 1 s, so a healed network is used again within about a second (gRPC's
# defaults are 1 s and 120 s). A connection attempt gets at least 1 s.
INITIAL_RECONNECT_BACKOFF_MS = 100
MAX_RECONNECT_BACKOFF_MS = 1_000
MIN_CONNECT_TIMEOUT_MS = 1_000

# 65,536 operations of ~25 bytes each are ~1.6 MiB; 8 MiB leaves room.
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def server_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    max_streams_per_connection: int = 0,
    min_ping_interval_ms: int = MIN_PING_INTERVAL_MS,
) -> list[tuple[str, int]]:
    """Options for the acker's gRPC server (``max_streams_per_connection`` 0: gRPC's default, no limit)."""
    streams = [("grpc.max_concurrent_streams", max_streams_per_connection)] if max_streams_per_connection else []
    return streams + [
        # A second server on the same port would take half the connections and
        # split a shard's trees over two ledgers: refuse to share the port.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # A client pinging more often than this collects strikes, then gets GOAWAY "too_many_pings".
        # gRPC's name for GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS (see above).
        (MIN_RECV_PING_INTERVAL_OPTION, min_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def client_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    initial_reconnect_backoff_ms: int = INITIAL_RECONNECT_BACKOFF_MS,
    max_reconnect_backoff_ms: int = MAX_RECONNECT_BACKOFF_MS,
    keepalive_time_ms: int = KEEPALIVE_TIME_MS,
) -> list[tuple[str, int]]:
    """Options for client channels to an acker (``keepalive_time_ms``: a test's shorter interval).

    gRPC's own retries stay off: the client decides what may be repeated
    (acker_client.delivery), because a repeated unkeyed XOR ack undoes itself.
    """
    if not 0 < initial_reconnect_backoff_ms <= max_reconnect_backoff_ms:
        raise ValueError(
            f"reconnect backoff must satisfy 0 < initial ({initial_reconnect_backoff_ms} ms) <= "
            f"max ({max_reconnect_backoff_ms} ms)"
        )
    return [
        ("grpc.enable_retries", 0),
        # gRPC backs off up to 120 s between reconnects by default; a restarted
        # acker must be reached again within seconds, well inside the spout's backstop.
        ("grpc.initial_reconnect_backoff_ms", initial_reconnect_backoff_ms),
        ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
        ("grpc.min_reconnect_backoff_ms", MIN_CONNECT_TIMEOUT_MS),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Any ping (not only keepalive's) unanswered this long closes the connection.
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ]
