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
    "DEFAULT_MAX_MESSAGE_BYTES",
    "server_options",
    "client_options",
]

# Clients ping an idle connection every 20 s so a dead acker is noticed on
# long-lived Subscribe streams; the server accepts pings every 10 s or slower.
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
MIN_PING_INTERVAL_MS = 10_000

# 65,536 operations of ~25 bytes each are ~1.6 MiB; 8 MiB leaves room.
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options for the acker's gRPC server."""
    return [
        # A second server on the same port would take half the connections and
        # split a shard's trees over two ledgers: refuse to share the port.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def client_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options for client channels to an acker (retries off: XOR acks are not idempotent)."""
    return [
        ("grpc.enable_retries", 0),
        # gRPC backs off up to 120 s between reconnects by default; a restarted
        # acker must be reached again within seconds, well inside the spout's backstop.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
