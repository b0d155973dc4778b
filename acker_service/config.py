"""The acker server's settings, validated once so a bad value fails at start with a clear message."""

from __future__ import annotations

from dataclasses import dataclass

from acker_protocol import grpc_options

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
    message_timeout: float = 30.0
    buckets: int = 3
    metrics_host: str | None = None  # None = same as host
    metrics_port: int | None = None  # None = no metrics HTTP server; 0 = pick a free port
    max_batch: int = 65536
    max_message_bytes: int = grpc_options.DEFAULT_MAX_MESSAGE_BYTES
    retain_outcomes: int = 100_000  # per spout
    retain_seconds: float = 300.0
    grace: float = 5.0
    engine: str = "native"

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def effective_metrics_host(self) -> str:
        """The address the metrics HTTP server binds to."""
        return self.metrics_host if self.metrics_host is not None else self.host

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
    elif not 0 <= c.shard_index < c.shard_count:
        problems.append(
            f"shard index must be 0..{c.shard_count - 1} for a shard count of {c.shard_count}, got {c.shard_index}"
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
    if not c.retain_seconds > 0:
        problems.append(f"retain seconds must be positive, got {c.retain_seconds}")
    if c.engine not in ENGINES:
        problems.append(f"engine must be one of {', '.join(ENGINES)}, got {c.engine!r}")
    if c.engine == "native" and c.buckets > 32:
        problems.append(f"the native engine supports at most 32 buckets, got {c.buckets}; use --engine reference")
    if not c.grace >= 0:
        problems.append(f"grace must be zero or more seconds, got {c.grace}")
    return problems
