"""Typed errors raised by the acker client."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

__all__ = [
    "AckerError",
    "ShardFailure",
    "ShardUnavailable",
    "RequestRefused",
    "ClusterMisconfigured",
    "SpoutFull",
]

# Status codes that mean "the acker looked at the request and said no": a
# client bug or a misconfiguration, never cured by waiting.
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


class AckerError(Exception):
    """Base class of every error the acker client raises."""


@dataclass(frozen=True)
class ShardFailure:
    """Why one shard's batch was not (or maybe not) applied."""

    shard: int
    address: str
    code: grpc.StatusCode | None
    detail: str
    operations: int
    init_roots: tuple[int, ...] = ()
    # Why the batch was given up on: "refused", "timeout" (retried until the
    # client's wait_for_shard ran out) or "ambiguous" (may have been applied,
    # and not safe to repeat); see acker_client.delivery.
    reason: str = ""

    def describe(self) -> str:
        """One human-readable line naming the shard, its address and the cause."""
        code = self.code.name if self.code is not None else "ERROR"
        if not self.operations and not self.reason:  # a call that carried no operations (Describe)
            return f"shard {self.shard} ({self.address}): {code}: {self.detail}"
        why = f", {self.reason}" if self.reason else ""
        return f"shard {self.shard} ({self.address}): {code}: {self.detail} [{self.operations} operations dropped{why}]"


class _BatchError(AckerError):
    """A batch (or several, one per shard) was dropped; the trees involved are left to the spout's backstop."""

    def __init__(self, failures: list[ShardFailure], headline: str) -> None:
        self.failures = tuple(failures)
        super().__init__(headline + "; " + "; ".join(f.describe() for f in self.failures))

    @property
    def shards(self) -> tuple[int, ...]:
        """The shard indexes whose batch failed."""
        return tuple(f.shard for f in self.failures)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses of the shards whose batch failed."""
        return tuple(f.address for f in self.failures)

    @property
    def init_roots(self) -> tuple[int, ...]:
        """Roots whose INIT was in a dropped batch (a spout fails these as LOST)."""
        return tuple(r for f in self.failures for r in f.init_roots)


class ShardUnavailable(_BatchError):
    """A shard could not be reached in time; its operations were dropped.

    A retry-safe batch (every ACK carries a dedup key: the default) was retried
    until the client's ``wait_for_shard`` ran out (reason "timeout"). A batch
    holding an unkeyed ACK is never repeated after a failure that may have
    applied it (reason "ambiguous"). Either way the spout's backstop settles
    the affected trees.
    """


class RequestRefused(_BatchError):
    """A shard refused a batch (bad request or wrong shard); nothing of it was applied."""


class ClusterMisconfigured(AckerError):
    """The address list does not match the ackers' own shard index and count."""


class SpoutFull(AckerError):
    """The spout has ``max_pending`` trees in flight and none completed within the timeout,
    or the client's buffer for the record's acker stayed full that long (the acker is unreachable)."""


def shard_failure(
    shard: int, address: str, exc: grpc.RpcError, operations: int, init_roots: tuple[int, ...] = ()
) -> ShardFailure:
    """The :class:`ShardFailure` of a call to ``shard`` that raised ``exc``."""
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    return ShardFailure(shard, address, code, detail or "", operations, init_roots)


def connect_error(failures: list[ShardFailure], shards: int) -> _BatchError:
    """The error of a client that could not check its ackers: one naming every shard that did not answer.

    ShardUnavailable (could not connect) unless a shard answered with a refusal
    (e.g. UNAUTHENTICATED), which is RequestRefused.
    """
    if any(f.code in REFUSAL_CODES for f in failures):
        return RequestRefused(failures, f"{len(failures)} of {shards} ackers refused the client's Describe")
    return ShardUnavailable(failures, f"could not connect to {len(failures)} of {shards} ackers")


def batch_error(failures: list[ShardFailure]) -> _BatchError:
    """RequestRefused if any shard said no, else ShardUnavailable: one error naming every failed shard."""
    refused = [f for f in failures if f.code in REFUSAL_CODES]
    if refused:
        return RequestRefused(failures, "an acker refused a batch; nothing of that batch was applied")
    return ShardUnavailable(failures, "acker shard unavailable; its operations were dropped")
