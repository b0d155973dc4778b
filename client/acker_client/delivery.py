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
- With a replication factor of 2 every operation goes to two shards, each copy
  in that shard's own batch and retries; both copies of an ACK carry the same
  dedup key (given when it is buffered). An attempt does not wait for a
  reconnecting channel (no ``wait_for_ready``), and a batch whose shard failed
  a transient way is dropped (reason ``replica``) rather than retried only once
  the shards that hold the other copies of its operations have *applied* them
  (every batch they were buffered in before this one was taken has been
  answered) and dropped no batch since its operations were buffered: the live
  replica has the operations, and a replica that misses updates can never
  reach a false zero (``docs/acker-semantics.md``). Until then it is retried.
  A refusal at the acker's bound of held operations (UNAVAILABLE ending with
  ``HELD_AT_BOUND``) is never skipped: that acker is alive and will need the
  operations once its copy is installed.
  Skipping only after the other copy applied is what lets a restarted replica
  catch up from its partner's snapshot: every operation it missed is either in
  the snapshot or reaches it. For the same reason a copy counts as delivered
  only while its replica lives or the other copy is applied too: a batch a
  replica applied while its partners' copies were on their way is kept and
  sent to it again if it then fails (its crash may have lost it). So an unreachable replica blocks no caller for
  longer than its partner's round trip. When a partner is unreachable too, the
  batch is retried as with one replica.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from acker_protocol.apply_codec import with_layout_epoch
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import held_at_bound

from .batching import OpBuffer
from .errors import REFUSAL_CODES, ShardFailure
from .ids import new_id

__all__ = [
    "RETRYABLE_CODES",
    "DeliveryPolicy",
    "ConnectionMonitor",
    "retry_safe",
    "deliver",
    "DROP_REFUSED",
    "DROP_TIMEOUT",
    "DROP_AMBIGUOUS",
    "DROP_REPLICA",
]

# Transient failures: the shard was unreachable, the connection broke, or the
# attempt ran out of time. A retry-safe batch is tried again for these.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})

DROP_REFUSED = "refused"  # the acker said no; nothing of the batch was applied
DROP_TIMEOUT = "timeout"  # retry-safe, but the shard stayed unreachable for wait_for_shard seconds
DROP_AMBIGUOUS = "ambiguous"  # may have been applied, and holds an unkeyed ACK: never repeated
DROP_REPLICA = "replica"  # this replica was unreachable while its partners were live: they hold the operations

_ACK = acker_pb2.OP_KIND_ACK

log = logging.getLogger(__name__)


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
    """Per-attempt deadline, total time a batch may wait for its shard, the pause between attempts, and replication."""

    attempt_deadline: float
    wait_for_shard: float
    retry_initial_backoff: float = 0.05
    retry_max_backoff: float = 1.0
    replicas: int = 1
    shard_count: int = 1

    @property
    def wait_for_ready(self) -> bool:
        """Whether an attempt waits for a reconnecting channel: only without a replica to fall back on."""
        return self.replicas == 1

    def partners(self, shard: int) -> tuple[int, ...]:
        """The shards holding the other copies of the trees in ``shard``'s batches (none with one replica).

        A shard's batch holds the roots it owns (also kept by the next shard) and
        those it follows (also kept by the previous one).
        """
        if self.replicas == 1:
            return ()
        n = self.shard_count
        return tuple(sorted({(shard - 1) % n, (shard + 1) % n} - {shard}))

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
        # Per shard, the buffers taken out to be sent and not yet finished, each with its
        # delivery once it has one: what the replica skip rule asks "is it applied?" of.
        self._unfinished: list[dict[int, tuple[OpBuffer, _Delivery | None]]] = [{} for _ in range(shards)]
        # Per shard, batches it applied while the other copies of their operations were still on their
        # way: if it fails now (a crash loses what it applied), they are sent to it again.
        self._retained: list[list[_Delivery]] = [[] for _ in range(shards)]
        # Monotonic time each shard last had a batch dropped (any reason): a replica may skip its copy of
        # an operation only if no partner dropped a batch since that operation was buffered.
        self._dropped_at = [float("-inf")] * shards
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

    def dropped(self, shard: int, unreachable: bool = True) -> None:
        """Record that a batch of ``shard`` was given up on (UNREACHABLE unless it was refused)."""
        with self._lock:
            self._dropped_at[shard] = time.monotonic()
            if unreachable:
                self._states[shard] = self.UNREACHABLE

    def taken(self, shard: int, buf: OpBuffer) -> None:
        """Record that ``buf`` left ``shard``'s buffer to be sent (call under the client's lock, with the swap)."""
        with self._lock:
            if shard < len(self._unfinished):
                self._unfinished[shard][id(buf)] = (buf, None)

    def attach(self, shard: int, buf: OpBuffer, delivery: _Delivery) -> None:
        """Link a taken buffer to the delivery sending it (its answer tells whether it was applied)."""
        with self._lock:
            if shard < len(self._unfinished) and id(buf) in self._unfinished[shard]:
                self._unfinished[shard][id(buf)] = (buf, delivery)

    def finished(self, shard: int, buf: OpBuffer) -> None:
        """Forget a taken buffer: applied, dropped (then :meth:`dropped` was called first) or folded away."""
        with self._lock:
            if shard < len(self._unfinished):
                self._unfinished[shard].pop(id(buf), None)

    def retain(self, shard: int, deliveries: list[_Delivery]) -> None:
        """Keep applied batches of ``shard`` whose other copies may still be on their way."""
        with self._lock:
            if shard < len(self._retained):
                self._retained[shard].extend(deliveries)

    def retained(self, shard: int) -> list[_Delivery]:
        """Take every batch kept for ``shard`` (the caller keeps back those still needed)."""
        with self._lock:
            if shard >= len(self._retained):
                return []
            taken, self._retained[shard] = self._retained[shard], []
            return taken

    def applied_before(self, shard: int, before: float) -> bool:
        """Whether every batch of ``shard`` taken with operations buffered at or before ``before`` was applied."""
        with self._lock:
            for buf, delivery in self._unfinished[shard].values():
                if buf.started is not None and buf.started <= before and (delivery is None or not delivery.applied()):
                    return False
        return True

    def fall_back(self, shard: int, partners: tuple[int, ...], since: float) -> bool:
        """Mark ``shard`` WAITING; True if its batch, buffered from ``since`` on, may be dropped as covered.

        Covered: every partner is READY (or not yet called) and dropped no batch
        since ``since``, so the partners' copies of the batch's operations were
        not given up on (a copy is buffered with the operation, at or after
        ``since``). A True answer counts as a drop. Marking and checking under
        one lock: when two partners fail at once, the second sees the first
        WAITING and keeps retrying; so no operation is dropped by both of its
        replicas for being covered by the other.
        """
        with self._lock:
            self._states[shard] = self.WAITING
            live = (self.READY, self.UNKNOWN)
            covered = bool(partners) and all(self._states[p] in live and self._dropped_at[p] < since for p in partners)
            if covered:
                self._dropped_at[shard] = time.monotonic()
            return covered


# failure_of(shard, exc, operations, init_roots) and on_sent(state, buffer, operations, response):
# the client's own ways to describe a failed batch and to count a delivered one.
FailureOf = Callable[[int, grpc.RpcError, int, tuple[int, ...]], ShardFailure]
OnSent = Callable[[Any, OpBuffer, int, acker_pb2.ApplyResponse], None]


class _Delivery:
    """One shard's batch on its way: the request (sent again unchanged on a retry) and its current attempt."""

    __slots__ = (
        "shard",
        "buf",
        "request",
        "safe",
        "count",
        "future",
        "sent_at",
        "waiting",
        "buffered_since",
        "taken_at",
        "succeeded",
    )

    def __init__(self, shard: int, buf: OpBuffer, request: bytes, count: int, safe: bool) -> None:
        self.shard = shard
        self.buf = buf
        # When its first operation was buffered (monotonic); unknown: the beginning of time, so that
        # any partner's drop forbids skipping this batch (the cautious answer).
        self.buffered_since = buf.started if buf.started is not None else float("-inf")
        self.request = request
        self.safe = safe  # retry_safe(request), known from the buffer without reading every operation
        self.count = count
        self.future: Any = None
        self.sent_at = 0.0
        self.waiting = False  # counted in the client's operations_waiting
        # Every operation of the batch was buffered by now (a partner must have applied what it buffered until then).
        self.taken_at = time.monotonic()
        self.succeeded = False

    def applied(self) -> bool:
        """Whether the shard answered the current attempt with success (its future may not be read yet)."""
        if self.succeeded:
            return True
        future = self.future
        if future is None or not future.done():
            return False
        try:
            return future.exception() is None
        except Exception:  # a cancelled future
            return False


def deliver(
    st: Any,
    batches: dict[int, OpBuffer],
    *,
    policy: DeliveryPolicy,
    batch_keys: bool,
    failure_of: FailureOf,
    on_sent: OnSent,
) -> list[ShardFailure]:
    """Send one batch per shard and see each through (waiting, retrying); return the batches given up on.

    ``st`` is the client's per-process state: ``apply_calls``, ``lock``, ``stats``
    and ``connections`` (a :class:`ConnectionMonitor`). First attempts go to
    every shard at once; then each shard's batch is retried on its own until
    it lands or the common budget (``policy.wait_for_shard``) runs out.
    """
    give_up_at = time.monotonic() + policy.wait_for_shard
    deliveries = []
    try:
        for shard, buf in batches.items():
            batch_key = new_id() if batch_keys else 0
            request, count = buf.encode(batch_key)
            # The layout it was routed by: during a two-replica move the ackers serve a moving root by it.
            request = with_layout_epoch(request, getattr(st, "epoch", 0))
            if not count:
                st.connections.finished(shard, buf)
                continue  # everything folded away to no-op acks
            delivery = _Delivery(shard, buf, request, count, buf.retry_safe(batch_key))
            st.connections.attach(shard, buf, delivery)
            _attempt(st, delivery, policy, give_up_at)
            deliveries.append(delivery)
        results: list[ShardFailure | None] = []
        helpers: list[threading.Thread] = []
        last = len(deliveries) - 1
        for i, d in enumerate(deliveries):
            if policy.replicas > 1 and i < last and _first_attempt_failed(d):
                # With replicas, a shard's retries wait for its partners to apply their copies: those
                # partners' batches must see their own retries through meanwhile, so this one goes on alone.
                helper = threading.Thread(
                    target=lambda d=d: results.append(_await_or_retry(st, d, policy, give_up_at, failure_of, on_sent)),
                    name="acker-client-retry",
                    daemon=True,
                )
                helper.start()
                helpers.append(helper)
                continue
            results.append(_await_or_retry(st, d, policy, give_up_at, failure_of, on_sent))
        for helper in helpers:
            helper.join()
        return [f for f in results if f is not None]
    finally:
        for shard, buf in batches.items():
            st.connections.finished(shard, buf)


def _first_attempt_failed(delivery: _Delivery) -> bool:
    """Wait for the first attempt's answer; True if it failed (the retry loop then reads the same answer again)."""
    try:
        delivery.future.result()
    except grpc.RpcError:
        return True
    return False


def _partners_applied(st: Any, partners: tuple[int, ...], before: float) -> bool:
    """Whether every partner applied every operation buffered for it at or before ``before``.

    Under the client's lock: an operation is either still in its shard's
    buffer or in a taken one (the swap and its record are one step).
    """
    with st.lock:
        for p in partners:
            started = st.buffers[p].started
            if started is not None and started <= before:
                return False
            if not st.connections.applied_before(p, before):
                return False
    return True


def _attempt(st: Any, delivery: _Delivery, policy: DeliveryPolicy, give_up_at: float) -> None:
    """Send one attempt; it waits (wait_for_ready) while the channel reconnects, up to its deadline."""
    if st.connections.state(delivery.shard) in (ConnectionMonitor.WAITING, ConnectionMonitor.UNREACHABLE):
        _set_waiting(st, delivery, True)
    delivery.sent_at = time.monotonic()
    # The request is already bytes: the call's serializer passes them through (serialized once).
    delivery.future = st.apply_calls[delivery.shard].future(
        delivery.request, timeout=policy.attempt_timeout(give_up_at), wait_for_ready=policy.wait_for_ready
    )


def _await_or_retry(
    st: Any,
    delivery: _Delivery,
    policy: DeliveryPolicy,
    give_up_at: float,
    failure_of: FailureOf,
    on_sent: OnSent,
) -> ShardFailure | None:
    """Wait for the batch's response, retrying while that is safe and time is left; the failure, or None."""
    backoff = 0.0
    try:
        while True:
            try:
                response = delivery.future.result()
            except grpc.RpcError as exc:
                failure = failure_of(delivery.shard, exc, delivery.count, delivery.buf.init_roots())
                relayout = getattr(st, "relayout", None)
                if (
                    failure.code == grpc.StatusCode.FAILED_PRECONDITION
                    and relayout is not None
                    and relayout(st, delivery.shard, delivery.request)
                ):
                    # The ackers moved to a new layout: the batch went, split, to the new owners.
                    st.connections.set(delivery.shard, ConnectionMonitor.READY)
                    return None
                if policy.replicas > 1 and failure.code in RETRYABLE_CODES:
                    _put_back(st, delivery.shard, policy, failure_of, on_sent)
                reason = policy.should_retry(failure.code, delivery.safe)
                now = time.monotonic()
                if reason is None and give_up_at - now <= 0:
                    reason = DROP_TIMEOUT
                partners = policy.partners(delivery.shard)
                if (
                    reason is None
                    and partners
                    and not held_at_bound(failure.detail)
                    and _partners_applied(st, partners, delivery.taken_at)
                    and st.connections.fall_back(delivery.shard, partners, delivery.buffered_since)
                ):
                    reason = DROP_REPLICA
                if reason is not None:
                    st.connections.dropped(delivery.shard, unreachable=reason != DROP_REFUSED)
                    return dataclasses.replace(failure, reason=reason)
                st.connections.set(delivery.shard, ConnectionMonitor.WAITING)
                log.debug("retrying %d operations for shard %d: %s", delivery.count, delivery.shard, failure.describe())
                _set_waiting(st, delivery, True)
                with st.lock:
                    st.stats.batches_retried += 1
                    st.stats.operations_retried += delivery.count
                # An attempt that failed at once (a reset connection) pauses
                # before the next; one that waited out its deadline does not.
                backoff = policy.next_backoff(backoff)
                pause = min(backoff - (now - delivery.sent_at), give_up_at - now)
                if pause > 0:
                    time.sleep(pause)
                _attempt(st, delivery, policy, give_up_at)
                continue
            delivery.succeeded = True
            st.connections.set(delivery.shard, ConnectionMonitor.READY)
            on_sent(st, delivery.buf, delivery.count, response)
            if policy.replicas > 1 and delivery.safe:
                _retain(st, delivery, policy.partners(delivery.shard))
            return None
    finally:
        _set_waiting(st, delivery, False)


def _retain(st: Any, delivery: _Delivery, partners: tuple[int, ...]) -> None:
    """Keep an applied batch while its partners have not applied their copies (dropping those that have).

    An operation counts as delivered to a replica only while that replica's
    incarnation lives or the other copy is applied too: a replica that crashes
    after applying it, before its partner did, may come back and copy its range
    from the partner before the partner applied it (docs/acker-semantics.md,
    "Replicated trees").
    """
    if not partners:
        return
    pending = [d for d in st.connections.retained(delivery.shard) if not _partners_applied(st, partners, d.taken_at)]
    if not _partners_applied(st, partners, delivery.taken_at):
        pending.append(delivery)
    st.connections.retain(delivery.shard, pending)


def _put_back(st: Any, shard: int, policy: DeliveryPolicy, failure_of: FailureOf, on_sent: OnSent) -> None:
    """``shard`` failed a transient way: send it again what it applied while the other copies were on their way.

    It may have crashed and lost them; if not, sending a retry-safe batch again
    changes nothing. The batches go out on a thread of their own, each retried
    (or skipped once the partners applied their copies) as any batch is.
    """
    partners = policy.partners(shard)
    again = [d for d in st.connections.retained(shard) if not _partners_applied(st, partners, d.taken_at)]
    if not again:
        return
    give_up_at = time.monotonic() + policy.wait_for_shard
    for d in again:
        d.succeeded = False
        with st.lock:  # as the sender's take: the skip rule sees the batch unfinished again
            st.connections.taken(shard, d.buf)
        st.connections.attach(shard, d.buf, d)
        _attempt(st, d, policy, give_up_at)
    with st.lock:
        st.stats.operations_put_back += sum(d.count for d in again)

    def see_through() -> None:
        for d in again:
            try:
                failure = _await_or_retry(st, d, policy, give_up_at, failure_of, on_sent)
            finally:
                st.connections.finished(shard, d.buf)
            if failure is not None:
                with st.lock:
                    st.stats.batches_failed += 1
                    st.stats.operations_dropped += failure.operations
                    by_reason = st.stats.dropped_by_reason
                    by_reason[failure.reason] = by_reason.get(failure.reason, 0) + failure.operations

    threading.Thread(target=see_through, name="acker-client-put-back", daemon=True).start()


def _set_waiting(st: Any, delivery: _Delivery, waiting: bool) -> None:
    if delivery.waiting == waiting:
        return
    delivery.waiting = waiting
    with st.lock:
        st.stats.operations_waiting += delivery.count if waiting else -delivery.count
