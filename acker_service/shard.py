"""One acker shard's state and rules: ledger, outcome hub, expiry and metrics, without gRPC.

The ledger is the engine the configuration names (``native`` by default, see
:mod:`acker_service.engines`); its outcomes reach the metrics and the hub as
columns (:class:`~acker_service.outcome_columns.OutcomeColumns`).

Everything about trees moving between ackers (layout changes, handoffs, a
restarted replica's catch-up) is the :class:`~acker_service.moving.membership.Membership`'s
(``shard.membership``); the shard asks it only whether Apply may take a request
whole.

The servicer translates protobuf to calls on a :class:`Shard`; the server owns
the event loop, health and the timer that calls :meth:`Shard.advance`. Every
method runs on that one event loop, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable

from acker_protocol.text import clip
from acker_protocol.wire import check_spout_name

from .config import ServerConfig
from .engines import new_ledger
from .metrics import AckerMetrics
from .moving.membership import Membership
from .operate import AGE_BUCKETS, check_oldest, check_roots
from .outcome_columns import ColumnarResult, OutcomeColumns
from .outcome_hub import OutcomeChunk, OutcomeHub
from .tree_info import TreeInfo

__all__ = ["EXPIRY_SLICE", "Shard", "SubscribeRefused", "BadSpoutName", "ShardClosing", "Superseded", "new_incarnation"]

log = logging.getLogger(__name__)

# Trees expired per slice: a few milliseconds of work, so health checks, Apply and
# Subscribe wait at most that long during a mass expiry.
EXPIRY_SLICE = 2048


def new_incarnation() -> int:
    """A random non-zero 64-bit id for one server lifetime."""
    while True:
        value = secrets.randbits(64)
        if value:
            return value


class SubscribeRefused(Exception):
    """A subscription was refused or ended by the shard; the message says what the spout should do."""


class BadSpoutName(SubscribeRefused):
    """The spout name is empty or too long (INVALID_ARGUMENT)."""


class ShardClosing(SubscribeRefused):
    """The shard is shutting down (UNAVAILABLE): resubscribe elsewhere or later, with the position."""


class Superseded(SubscribeRefused):
    """A newer subscription of the same spout took over this one (ABORTED)."""


class TooManySubscriptions(SubscribeRefused):
    """The acker holds its maximum of open subscriptions (--max-subscriptions)."""


class Shard:
    """The pending trees of one shard and the routing of their outcomes to spouts.

    ``apply_request`` validates and applies a request (raising a
    :class:`~acker_service.batch.BatchError` that changes nothing), ``advance``
    expires what the clock says is due, ``subscribe`` streams a spout's
    outcomes, ``close`` ends those streams at shutdown.
    """

    def __init__(
        self, config: ServerConfig, clock: Callable[[], float] | None = None, incarnation: int | None = None
    ) -> None:
        clock = clock or time.monotonic  # None: real time (callers can pass an optional clock through)
        self.config = config
        self.incarnation = incarnation or new_incarnation()
        self.ledger = new_ledger(
            config.engine,
            config.message_timeout,
            config.buckets,
            clock,
            timeout_mode=config.timeout_mode,
            max_tree_lifetime=config.max_tree_lifetime,
        )
        # Which roots are ours, the layout changes that move them and a restarted replica's catch-up.
        self.membership = Membership(config, self.ledger, self._settle, self._applied)
        self.hub = OutcomeHub(
            config.retain_outcomes,
            config.retain_seconds,
            self.incarnation,
            clock,
            subscriber_buffer_bytes=config.subscriber_buffer_bytes,
        )
        self.metrics = AckerMetrics(
            self.ledger.stats,
            self.hub,
            shard_index=self.membership.place[0],
            shard_count=self.membership.place[1],
            engine=config.engine,
        )
        self.metrics.catchup = self.membership.catchup
        self.metrics.transfers = self.membership.transfers
        self._closing = False
        # Called once at close: each open ApplyStream's way to end itself (see apply_stream).
        self.closing_callbacks: set[Callable[[], None]] = set()

    @property
    def pending_trees(self) -> int:
        """Trees started and not yet ended."""
        return self.ledger.pending_trees

    def apply_request(self, data: bytes) -> ColumnarResult:
        """Decode, validate whole and apply serialized ``ApplyRequest`` bytes; route the outcomes (the hot path).

        Raises a :class:`~acker_service.batch.BatchError` that changes nothing,
        also for bytes that are not an ``ApplyRequest``.
        """
        membership = self.membership
        if not membership.steady:  # a layout change, a catch-up, or no place in the layout
            return membership.apply(data)
        # Due trees collect in slices on the ticker, not in Apply's latency; a due
        # tree the batch touches still expires first (exactly one outcome).
        result = self.ledger.apply(data, membership.limits, max_expired=0)
        self._applied(result)
        return result

    def _applied(self, result: ColumnarResult) -> None:
        self._settle(result.ended)
        # Not ends, so no latency or outcome metrics: only the spout must know.
        self.hub.publish(result.timeout_resets)
        self.metrics.batch_operations.observe(result.operations)

    def advance(self) -> int:
        """Expire every due tree and old retained outcomes at once; return how many trees timed out."""
        timed_out, _ = self.ledger.advance(None)
        self._settle(timed_out)
        self.hub.expire()
        return len(timed_out)

    def advance_slice(self, max_expired: int = EXPIRY_SLICE) -> tuple[int, bool]:
        """Expire at most ``max_expired`` due trees and old retained outcomes.

        Returns how many trees timed out and whether more are due: the caller
        yields to the event loop and calls again while they are.
        """
        timed_out, more = self.ledger.advance(max_expired)
        self._settle(timed_out)
        self.hub.expire()
        return len(timed_out), more

    def _settle(self, ended: OutcomeColumns) -> None:
        """Record and route the outcomes of ended trees, refresh the scrape-time gauges."""
        if len(ended):
            self.metrics.complete_latency.observe_many(ended.latency_seconds())
            self.hub.publish(ended)
        self.metrics.refresh_gauges(self.ledger.pending_trees, self.ledger.orphan_entries)

    async def subscribe(
        self, spout: str, *, incarnation: int, after_sequence: int, limit: int
    ) -> AsyncGenerator[OutcomeChunk, None]:
        """Yield the spout's retained outcomes after the resume position, then live ones, ``limit`` at a time.

        Ends by raising :class:`SubscribeRefused`: a bad name, a newer
        subscription of the same spout, or shutdown (after everything retained
        was yielded). Close the iterator (``contextlib.aclosing``) when the
        stream ends early, so the subscription is released at once.
        """
        try:
            check_spout_name(spout)
        except ValueError as exc:
            raise BadSpoutName(f"{exc}; name the spout used in INIT operations") from None
        if self._closing:
            raise ShardClosing("this acker is shutting down; subscribe again later")
        bound = self.config.max_subscriptions
        if bound and self.hub.subscribers >= bound and not self.hub.is_subscribed(spout):
            # A takeover replaces a stream and is allowed; a new spout would exceed the bound.
            raise TooManySubscriptions(
                f"this acker has {self.hub.subscribers} open subscriptions, its maximum (--max-subscriptions "
                f"{bound}); close unused spouts or raise the limit"
            )
        wakeup = asyncio.Event()
        subscription = self.hub.subscribe(
            spout, incarnation=incarnation, after_sequence=after_sequence, wake=wakeup.set
        )
        try:
            while True:
                if subscription.superseded:
                    raise Superseded(
                        f"a newer Subscribe for spout {clip(spout)} took over; one subscription per spout per acker"
                    )
                chunk = self.hub.take(subscription, limit)
                if chunk is not None:
                    yield chunk
                elif self._closing:
                    # Everything retained was sent; the spout resumes from its position elsewhere.
                    raise ShardClosing("this acker is shutting down; resubscribe with your position")
                else:
                    wakeup.clear()
                    await wakeup.wait()
        finally:
            self.hub.unsubscribe(subscription)

    # -- operating a running shard: inspect trees, fail them by hand ------------

    def inspect(self, roots: list[int], oldest: int) -> tuple[list[TreeInfo], list[TreeInfo]]:
        """The state of ``roots`` and the ``oldest`` oldest pending trees; a BatchError refuses bad input."""
        check_roots(
            roots,
            shard_index=self.config.shard_index,
            shard_count=self.config.shard_count,
            replicas=self.config.replicas,
        )
        check_oldest(oldest)
        return self.ledger.inspect(roots), self.ledger.oldest(oldest) if oldest else []

    def force_fail(self, roots: list[int]) -> OutcomeColumns:
        """End the pending trees among ``roots`` FAILED now and route the outcomes; a BatchError refuses bad input."""
        check_roots(
            roots,
            shard_index=self.config.shard_index,
            shard_count=self.config.shard_count,
            replicas=self.config.replicas,
        )
        ended = self.ledger.force_fail(roots)
        self._settle(ended)
        return ended

    def force_fail_spout(self, spout: str) -> OutcomeColumns:
        """End every pending tree of ``spout`` FAILED now and route the outcomes."""
        try:
            check_spout_name(spout)
        except ValueError as exc:
            raise BadSpoutName(str(exc)) from None
        ended = self.ledger.force_fail_spout(spout)
        self._settle(ended)
        return ended

    def tree_ages(self) -> tuple[list[int], float, float]:
        """Pending trees counted by age over :data:`~acker_service.operate.AGE_BUCKETS`, the age sum, and the oldest's age.

        The oldest age is 0 with nothing pending. Both are counted here, at a
        metrics scrape, never per operation.
        """
        counts, total = self.ledger.age_histogram(AGE_BUCKETS)
        oldest = self.ledger.oldest(1)
        return counts, total, oldest[0].age_seconds if oldest else 0.0

    def close(self) -> None:
        """End every subscription once it has yielded what is retained, and every ApplyStream (shutdown)."""
        self._closing = True
        self.hub.wake_all()
        for callback in list(self.closing_callbacks):
            callback()

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called (shutdown)."""
        return self._closing
