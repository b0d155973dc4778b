"""The ``acker_spout`` source's options, parsed from the strings Spark passes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from acker_protocol.credentials import ChannelSecurity

from ..budget import FailureBudget
from ..replay_policy import ReplayPolicy

__all__ = ["StreamOptions"]


@dataclass(frozen=True)
class StreamOptions:
    """The source's options, parsed from the strings Spark passes."""

    ackers: tuple[str, ...]
    database: str
    path: str
    checkpoint: str
    name: str | None = None
    max_pending: int = 100_000
    max_bytes_per_batch: int = 64 << 20
    split_bytes: int = 16 << 20
    partitions: int = 2
    policy: ReplayPolicy = ReplayPolicy()
    spout_timeout: float | None = None
    budget: FailureBudget | None = (
        FailureBudget()
    )  # options failure_budget (a fraction, or "off"), failure_budget_records
    security: ChannelSecurity | None = None  # options tls_ca, tls_cert, tls_key, token_file, server_name

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Validate ``options``; raise ValueError naming the option that is wrong."""
        opts = {k.lower(): v for k, v in options.items()}  # Spark's option keys are case-insensitive
        ackers = tuple(a.strip() for a in opts.get("ackers", "").split(",") if a.strip())
        if not ackers:
            raise ValueError('option "ackers" is required: the acker addresses in shard order, comma-separated')
        if "database" not in opts:
            raise ValueError('option "database" is required: the SQLite file for dead letters')
        path = opts.get("path")
        if path is None:
            raise ValueError('give the record source: load(<directory>) or option "path"')
        if not opts.get("checkpoint"):
            raise ValueError(
                'option "checkpoint" is required: a directory the planner and every executor can write, for the'
                " stream's emission log, outcome journal and replay plans (one per query, kept with its"
                " checkpointLocation)"
            )
        policy = ReplayPolicy(
            max_attempts=_int(opts, "max_attempts", 5),
            backoff_base=_float(opts, "backoff_base", 0.5),
            backoff_factor=_float(opts, "backoff_factor", 2.0),
            backoff_cap=_float(opts, "backoff_cap", 30.0),
        )
        parsed = cls(
            ackers=ackers,
            database=opts["database"],
            path=path,
            checkpoint=opts["checkpoint"],
            name=opts.get("name"),
            max_pending=_int(opts, "max_pending", 100_000),
            max_bytes_per_batch=_int(opts, "max_bytes_per_batch", 64 << 20),
            split_bytes=_int(opts, "split_bytes", 16 << 20),
            partitions=max(1, _int(opts, "partitions", 2)),
            policy=policy,
            spout_timeout=_float(opts, "spout_timeout", None) if "spout_timeout" in opts else None,
            budget=_budget(opts),
            security=_security(opts),
        )
        for key in ("max_pending", "max_bytes_per_batch", "split_bytes"):
            if getattr(parsed, key) < 1:
                raise ValueError(f"option {key!r} must be at least 1, got {getattr(parsed, key)}")
        return parsed


def _budget(opts: Mapping[str, str]) -> FailureBudget | None:
    """The stream's failure budget: ``failure_budget`` (a fraction, default 0.05, or "off") and ``failure_budget_records``."""
    fraction = opts.get("failure_budget", "0.05").strip().lower()
    records = _int(opts, "failure_budget_records", 0) if "failure_budget_records" in opts else None
    if fraction in ("off", "none", "") and records is None:
        return None
    try:
        return FailureBudget(fraction=None if fraction in ("off", "none", "") else float(fraction), records=records)
    except ValueError as err:
        raise ValueError(f'option "failure_budget": {err}') from err


def _security(opts: Mapping[str, str]) -> ChannelSecurity | None:
    """TLS / token options, or None when none is given (plaintext)."""
    keys = ("tls_ca", "tls_cert", "tls_key", "token_file", "server_name")
    given = {key: opts[key] for key in keys if opts.get(key)}
    if not given:
        return None
    return ChannelSecurity(tls=True, **given)


def _int(opts: Mapping[str, str], key: str, default: int | None) -> Any:
    try:
        return int(opts[key]) if key in opts else default
    except ValueError:
        raise ValueError(f"option {key!r} must be an integer, got {opts[key]!r}") from None


def _float(opts: Mapping[str, str], key: str, default: float | None) -> Any:
    try:
        return float(opts[key]) if key in opts else default
    except ValueError:
        raise ValueError(f"option {key!r} must be a number, got {opts[key]!r}") from None
