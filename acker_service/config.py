"""The acker server's settings, validated once so a bad value fails at start with a clear message."""

from __future__ import annotations

import os
from dataclasses import dataclass

from acker_protocol import grpc_options
from acker_protocol.wire import MAX_REPLICAS

from .tree_info import TIMEOUT_MODES, check_timeout_rules

__all__ = ["ServerConfig", "ConfigError", "ENGINES"]

# The ledger engines (see acker_service.engines): the Rust core, and the Python model.
ENGINES = ("native", "reference")


class ConfigError(ValueError):
    """A setting is out of range; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything one acker shard needs to start (see ``acker-server --help``)."""

    host: str = "127.0.0.1"
    port: int = 7100  # 0 = pick a free port
    shard_index: int = 0
    shard_count: int = 1
    replicas: int = 1  # 2: every tree also lives on the next shard (see docs/acker-semantics.md)
    # A shard index at or above the count starts the acker outside the layout, owning no roots,
    # until `acker-ctl reshard` gives it a place (a StatefulSet pod added by scaling up).
    join: bool = False
    # Where the acker keeps its last committed layout, so a restart comes back in it (moving/layout_file.py). None = off.
    layout_file: str | None = None
    message_timeout: float = 30.0
    buckets: int = 3
    # Progress timeouts (docs/operations.md): "progress" restarts a tree's timeout on every applied ack.
    timeout_mode: str = "fixed"
    max_tree_lifetime: float = 0.0  # seconds from init after which any tree ends LIFETIME_EXCEEDED; 0 = no cap
    metrics_host: str | None = None  # None = same as host
    metrics_port: int | None = None  # None = no metrics HTTP server; 0 = pick a free port
    max_batch: int = 65536
    max_message_bytes: int = grpc_options.DEFAULT_MAX_MESSAGE_BYTES
    retain_outcomes: int = 100_000  # per spout
    retain_seconds: float = 300.0
    subscriber_buffer_bytes: int = 256 * 1024 * 1024  # per subscribed spout: its undelivered backlog
    grace: float = 5.0
    # Limits (0 = no limit). Streams count as RPCs: every open Subscribe holds one.
    max_concurrent_rpcs: int = 4096
    max_streams_per_connection: int = 256
    max_subscriptions: int = 1024
    # Operations held unapplied (0 = no limit): during a layout change, for trees still moving to this acker;
    # during a restarted replica's catch-up, for ranges awaiting their partner's copy (each bounded apart).
    max_held_operations: int = 1_000_000
    min_ping_interval: float = grpc_options.MIN_PING_INTERVAL_MS / 1000
    # Security (see docs/security.md). PEM file paths; None = off.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients must present a certificate this CA signed (mTLS)
    metrics_tls_cert: str | None = None
    metrics_tls_key: str | None = None
    metrics_tls_client_ca: str | None = None
    # Calls to the other ackers (handoffs of a layout change; acker_service.moving.peers). None = derived from the above.
    peer_tls_ca: str | None = None  # CA of the other ackers' certificates (default: tls_client_ca, else system roots)
    peer_tls_cert: str | None = None  # client certificate for peers under mTLS (default: tls_cert)
    peer_tls_key: str | None = None
    peer_server_name: str | None = None  # name to check the peers' certificates against instead of their host
    auth_tokens: str | None = None  # file of "name sha256-hex" lines
    auth_policy: str | None = None  # TOML: principals and their rights
    engine: str = "native"
    # With replicas 2: every shard's address in shard order ("a0,a1,..."), so that a restarted acker
    # copies its two ranges from the partners that keep them (docs/acker-semantics.md, "Replicated trees").
    peers: str | None = None
    # Seconds a restarted acker holds Apply before it asks for the copies: longer than a client's
    # reconnect backoff, so that no client still skips this acker's copies (the partner applying
    # them after the copy was taken) once the copy is taken.
    catchup_delay: float = 2.0
    # A bearer token for the catch-up's calls to its partners (Snapshot is an admin call); the channel's
    # TLS is the peer_tls_* settings above (acker_service.moving.peers).
    peer_token_file: str | None = None

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def in_layout(self) -> bool:
        """Whether the acker starts as a shard of the layout (False: joining, placed by a reshard)."""
        return self.shard_index < self.shard_count

    @property
    def effective_metrics_host(self) -> str:
        """The address the metrics HTTP server binds to."""
        return self.metrics_host if self.metrics_host is not None else self.host

    @property
    def peer_addresses(self) -> tuple[str, ...]:
        """The ``--peers`` addresses in shard order (empty: none given)."""
        return tuple(a.strip() for a in (self.peers or "").split(",") if a.strip())

    @property
    def rotation_period(self) -> float:
        """Seconds between ledger rotations, ``T / (b - 1)``."""
        return self.message_timeout / (self.buckets - 1)


def _problems(c: ServerConfig) -> list[str]:
    """Every out-of-range setting, described so the operator knows what to change."""
    problems = []
    if not c.host:
        problems.append("host must not be empty (use 0.0.0.0 to listen on every interface)")
    if not 0 <= c.port <= 65535:
        problems.append(f"port must be 0..65535 (0 = pick a free port), got {c.port}")
    if c.shard_count < 1:
        problems.append(f"shard count must be at least 1, got {c.shard_count}")
    elif c.shard_index < 0 or (c.shard_index >= c.shard_count and not c.join):
        problems.append(
            f"shard index must be 0..{c.shard_count - 1} for a shard count of {c.shard_count}, got {c.shard_index}"
            + ("" if c.shard_index < 0 else " (--join 1 starts an acker outside the layout until a reshard places it)")
        )
    problems += _layout_file_problems(c.layout_file)
    if not 1 <= c.replicas <= MAX_REPLICAS:
        problems.append(f"replicas must be 1 or {MAX_REPLICAS}, got {c.replicas}")
    elif c.replicas > c.shard_count >= 1:
        problems.append(
            f"replicas {c.replicas} needs a shard count of at least {c.replicas} (a tree's copies live on "
            f"different ackers), got {c.shard_count}"
        )
    if not c.message_timeout > 0:
        problems.append(f"message timeout must be a positive number of seconds, got {c.message_timeout}")
    if c.buckets < 2:
        problems.append(f"buckets must be at least 2 (Storm uses 3), got {c.buckets}")
    if c.metrics_port is not None and not 0 <= c.metrics_port <= 65535:
        problems.append(f"metrics port must be 0..65535 (0 = pick a free port), got {c.metrics_port}")
    if c.max_batch < 1:
        problems.append(f"max batch must be at least 1 operation, got {c.max_batch}")
    if c.max_message_bytes < 1024:
        problems.append(f"max message bytes must be at least 1024, got {c.max_message_bytes}")
    if c.retain_outcomes < 1:
        problems.append(f"retain outcomes must be at least 1 per spout, got {c.retain_outcomes}")
    if c.subscriber_buffer_bytes < 0:
        problems.append(f"subscriber buffer bytes must be zero or more, got {c.subscriber_buffer_bytes}")
    if not c.retain_seconds > 0:
        problems.append(f"retain seconds must be positive, got {c.retain_seconds}")
    problems += _timeout_rule_problems(c)
    if c.engine not in ENGINES:
        problems.append(f"engine must be one of {', '.join(ENGINES)}, got {c.engine!r}")
    if c.engine == "native" and c.buckets > 32:
        problems.append(f"the native engine supports at most 32 buckets, got {c.buckets}; use --engine reference")
    if not c.grace >= 0:
        problems.append(f"grace must be zero or more seconds, got {c.grace}")
    for name in ("max_concurrent_rpcs", "max_streams_per_connection", "max_subscriptions", "max_held_operations"):
        if getattr(c, name) < 0:
            problems.append(f"{name.replace('_', ' ')} must be 0 (no limit) or more, got {getattr(c, name)}")
    problems += _security_problems(c)
    problems += _catchup_problems(c)
    client_ping = grpc_options.KEEPALIVE_TIME_MS / 1000
    if not 0 < c.min_ping_interval <= client_ping:
        problems.append(
            f"min ping interval must be positive and at most {client_ping:g} s (the acker clients' keepalive "
            f"interval; they would be disconnected for pinging too often), got {c.min_ping_interval}"
        )
    return problems


def _layout_file_problems(path: str | None) -> list[str]:
    """A layout file the acker can replace: found now, not at the first reshard (the file itself may be absent)."""
    if path is None:
        return []
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return [f"layout file {path} is a directory; name a file in it"]
    if not os.path.isdir(folder):
        return [f"layout file {path}: its directory {folder} does not exist"]
    if not os.access(folder, os.W_OK | os.X_OK):
        return [f"layout file {path}: its directory {folder} is not writable by this user (the file is replaced there)"]
    return []


def _timeout_rule_problems(c: ServerConfig) -> list[str]:
    """A timeout mode and lifetime cap that keep the promise that no tree lives forever."""
    if c.timeout_mode not in TIMEOUT_MODES:
        return [f"timeout mode must be one of {', '.join(TIMEOUT_MODES)}, got {c.timeout_mode!r}"]
    if c.timeout_mode == "progress" and not c.max_tree_lifetime:
        return [
            "--timeout-mode progress needs --max-tree-lifetime: a tree that keeps making progress would "
            "otherwise never time out (and the spouts' backstop follows the cap)"
        ]
    if not c.message_timeout > 0 or c.buckets < 2:
        return []  # reported above; the rotation period is undefined
    try:
        check_timeout_rules(c.timeout_mode, c.max_tree_lifetime, c.rotation_period)
    except ValueError as exc:
        return [str(exc).replace("max_tree_lifetime", "max tree lifetime")]
    if c.max_tree_lifetime and c.max_tree_lifetime < c.message_timeout:
        return [
            f"max tree lifetime ({c.max_tree_lifetime:g} s) must be at least the message timeout "
            f"({c.message_timeout:g} s), or 0 for no cap"
        ]
    return []


def _catchup_problems(c: ServerConfig) -> list[str]:
    """Peers only with two replicas, one address per shard, and a catch-up delay that is a duration."""
    problems = []
    if not (c.catchup_delay >= 0 and c.catchup_delay < 3600):
        problems.append(f"catch-up delay must be 0 to 3600 seconds, got {c.catchup_delay}")
    if c.peer_token_file is not None and c.tls_cert is None:
        problems.append("--peer-token-file needs --tls-cert/--tls-key: a bearer token is only sent over TLS")
    if c.peer_token_file is not None and not os.path.isfile(c.peer_token_file):
        problems.append(f"{c.peer_token_file} is not a readable file")
    peers = c.peer_addresses
    if not peers:
        return problems
    if c.replicas < 2:
        problems.append("--peers is for --replicas 2 (a restarted acker copies its ranges from its partners); drop it")
    elif len(peers) != c.shard_count:
        problems.append(
            f"--peers needs one address per shard in shard order ({c.shard_count}), got {len(peers)}: {c.peers}"
        )
    if c.auth_tokens is not None and c.peer_token_file is None:
        problems.append(
            "--peers with --auth-tokens needs --peer-token-file, a token whose principal has admin = true "
            "(the catch-up calls Snapshot, an admin call)"
        )
    for address in peers:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            problems.append(f"peer address {address!r} is not host:port")
    return problems


def _security_problems(c: ServerConfig) -> list[str]:
    """TLS files that must come in pairs, and authentication that needs its transport and policy."""
    problems = []
    for prefix, flag in (("tls", "--tls"), ("metrics_tls", "--metrics-tls")):
        cert, key, ca = (getattr(c, f"{prefix}_{part}") for part in ("cert", "key", "client_ca"))
        if (cert is None) != (key is None):
            problems.append(f"{flag}-cert and {flag}-key go together: give both or neither")
        if ca is not None and cert is None:
            problems.append(f"{flag}-client-ca (mutual TLS) needs {flag}-cert and {flag}-key")
        for path in (cert, key, ca):
            if path is not None and not os.path.isfile(path):
                problems.append(f"{path} is not a readable file")
    problems += _peer_problems(c)
    if c.auth_tokens is not None and c.tls_cert is None:
        problems.append(
            "--auth-tokens needs --tls-cert and --tls-key: bearer tokens must not cross the network in clear"
        )
    if c.auth_tokens is not None and c.auth_policy is None:
        problems.append("--auth-tokens needs --auth-policy, which says what each token may do")
    if c.auth_policy is not None and c.auth_tokens is None and c.tls_client_ca is None:
        problems.append("--auth-policy needs a way to identify clients: --auth-tokens and/or --tls-client-ca")
    for path in (c.auth_tokens, c.auth_policy):
        if path is not None and not os.path.isfile(path):
            problems.append(f"{path} is not a readable file")
    return problems


def _peer_problems(c: ServerConfig) -> list[str]:
    """Settings for calls to the other ackers: only with TLS on, the certificate with its key."""
    problems = []
    given = [name for name in ("peer_tls_ca", "peer_tls_cert", "peer_tls_key", "peer_server_name") if getattr(c, name)]
    if given and c.tls_cert is None:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        problems.append(f"{flags} secure calls to the other ackers, which are plaintext without --tls-cert/--tls-key")
    if (c.peer_tls_cert is None) != (c.peer_tls_key is None):
        problems.append("--peer-tls-cert and --peer-tls-key go together: give both or neither")
    for path in (c.peer_tls_ca, c.peer_tls_cert, c.peer_tls_key):
        if path is not None and not os.path.isfile(path):
            problems.append(f"{path} is not a readable file")
    return problems
