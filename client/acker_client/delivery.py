"""How a batch reaches its shard through a network blip: wait for a connection, retry only what is safe, watch each channel.

The rules (the API docs in ``docs/client.md`` repeat them):

- Every attempt is sent with ``wait_for_ready``: an RPC that cannot leave the
  client because the channel is reconnecting is queued until the channel is
  READY, instead of failing at once with UNAVAILABLE.
- A batch may keep trying for ``wait_for_shard`` seconds in total (each attempt
  bounded by the per-call deadline). After that its operations are dropped
  (reason ``timeout``) and the caller gets :class:`ShardUnavailable`.
- A failed attempt is retried only when repeating the whole batch cannot change
  a ledger twice: INIT is set-once, FAIL and RESET_TIMEOUT are idempotent, and
  an ACK carrying a dedup key is applied once per tree. The client gives every
  unkeyed ACK of a flushed batch the batch's own random dedup key
  (``batch_keys=True``, the default), so every batch is retry-safe. With
  ``batch_keys=False`` a batch holding an unkeyed ACK is never retried after a
  failure that may have reached the acker (DEADLINE_EXCEEDED, or UNAVAILABLE /
  INTERNAL once the request may have left); it is dropped (reason
  ``ambiguous``) and left to the spout's backstop.
- Refusals (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) are never retried
  (reason ``refused``): waiting does not cure a bad request.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import grpc
from acker_protocol.v1 import acker_pb2

from .errors import REFUSAL_CODES

__all__ = [
    "RETRYABLE_CODES",
    "DeliveryPolicy",
    "ConnectionMonitor",
    "retry_safe",
    "DROP_REFUSED",
    "DROP_TIMEOUT",
    "DROP_AMBIGUOUS",
]

# Transient failures: the shard was unreachable, the connection broke, or the
# attempt ran out of time. A retry-safe batch is tried again for these.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})

DROP_REFUSED = "refused"  # the acker said no; nothing of the batch was applied
DROP_TIMEOUT = "timeout"  # retry-safe, but the shard stayed unreachable for wait_for_shard seconds
DROP_AMBIGUOUS = "ambiguous"  # may have been applied, and holds an unkeyed ACK: never repeated

_ACK = acker_pb2.OP_KIND_ACK


def retry_safe(request: acker_pb2.ApplyRequest) -> bool:
    """True if applying ``request`` twice leaves every ledger as applying it once (every ACK carries a dedup key)."""
    kinds = request.kinds
    if _ACK not in kinds:
        return True
    keys = request.dedup_keys
    if not keys:
        return False
    return all(key for kind, key in zip(kinds, keys) if kind == _ACK)


@dataclass(frozen=True)
class DeliveryPolicy:
    """Per-attempt deadline, total time a batch may wait for its shard, and the pause between attempts."""

    attempt_deadline: float
    wait_for_shard: float
    retry_initial_backoff: float = 0.05
    retry_max_backoff: float = 1.0

    def next_backoff(self, previous: float) -> float:
        """The pause after an attempt that failed at once (doubling, capped, with jitter)."""
        base = min(self.retry_max_backoff, max(self.retry_initial_backoff, previous * 2))
        return base * random.uniform(0.5, 1.0)

    def attempt_timeout(self, give_up_at: float, now: float | None = None) -> float:
        """The deadline of the next attempt: the per-call deadline, but never past ``give_up_at``."""
        now = time.monotonic() if now is None else now
        return max(0.0, min(self.attempt_deadline, give_up_at - now))

    @staticmethod
    def should_retry(code: grpc.StatusCode | None, safe: bool) -> str | None:
        """None to retry the batch after a failure with ``code``; otherwise the reason it is dropped."""
        if code in REFUSAL_CODES:
            return DROP_REFUSED
        if code in RETRYABLE_CODES and safe:
            return None
        # Not retry-safe, or an unexpected status: the batch may have been
        # applied, and repeating an unkeyed XOR ack would undo it.
        return DROP_AMBIGUOUS


class ConnectionMonitor:
    """Each shard's connection as this client last saw it: UNKNOWN, READY, WAITING (retrying) or UNREACHABLE.

    Kept from the outcomes of the client's own calls rather than from gRPC's
    connectivity watch, whose polling thread per channel would be inside gRPC
    core whenever PySpark's daemon forks a worker.
    """

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    WAITING = "WAITING"  # a batch failed a transient way and is being retried
    UNREACHABLE = "UNREACHABLE"  # a batch was given up on after waiting for the shard

    def __init__(self, shards: int) -> None:
        self._states = [self.UNKNOWN] * shards
        self._lock = threading.Lock()

    def set(self, shard: int, state: str) -> None:
        """Record what the last call to ``shard`` showed."""
        with self._lock:
            self._states[shard] = state

    def state(self, shard: int) -> str:
        """The shard's last seen state."""
        with self._lock:
            return self._states[shard]

    def states(self) -> tuple[str, ...]:
        """Every shard's last seen state, in shard order."""
        with self._lock:
            return tuple(self._states)
