"""Per-spout outcome retention, sequence numbers and resume positions, with no I/O.

Every outcome routed to a spout gets the next sequence number of that spout
(1, 2, 3, ... per acker incarnation) and is appended to the spout's retention
log. The log is bounded by count and by age; it is also the only buffer a
subscriber has. While a spout is subscribed, outcomes it has not received yet
are not evicted by the count bound but kept up to ``subscriber_buffer_bytes``
(flow control: the stream takes what it can send, the rest waits in the log),
so a burst such as a mass timeout reaches a spout that keeps up. Only a spout
that is gone, or so slow that its backlog passes the byte bound, loses
outcomes, which is counted as dropped. One subscription per spout: a new one
takes over and the older one is told it was superseded.

Outcomes stay columns here, as they come from the ledger: each log is four
numpy arrays that are only ever appended to (a full log moves its live part
into new arrays), so a chunk handed to a subscriber is a view that later
publishes never overwrite, and the servicer writes it to the wire without a
Python object per outcome.

The hub is driven from one thread (the server's event loop), so it has no
locks; the counters it exposes are plain ints that another thread may read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .outcome_columns import OutcomeColumns

__all__ = ["OutcomeHub", "Subscription", "OutcomeChunk"]

Clock = Callable[[], float]

# Memory one retained outcome costs: root, latency and time (8 bytes each) and the
# outcome code (1), twice that at worst while a log's arrays have room to grow into.
OUTCOME_BYTES = 50
# A new log's first arrays (outcomes); they double as the log grows.
_FIRST_CAPACITY = 1024


class OutcomeChunk(NamedTuple):
    """Consecutive outcomes of one spout: outcome ``i`` has sequence ``first_sequence + i``."""

    first_sequence: int
    roots: np.ndarray  # uint64
    outcomes: np.ndarray  # uint8, Outcome values
    latency_micros: np.ndarray  # uint64
    dropped: int


class Subscription:
    """One subscriber's position in its spout's log (the last sequence handed to it)."""

    __slots__ = ("spout", "cursor", "superseded", "_log", "_wake", "_header_due", "_gap")

    def __init__(self, spout: str, log: _SpoutLog, cursor: int, gap: int, wake: Callable[[], None]) -> None:
        self.spout = spout
        self.cursor = cursor
        self.superseded = False  # a newer Subscribe for the same spout took over
        self._log = log
        self._wake = wake
        self._header_due = True  # the first take answers even with no outcomes
        self._gap = gap  # outcomes the subscriber asked for that were already evicted

    def wake(self) -> None:
        """Tell the subscriber something changed (new outcomes, or a takeover)."""
        self._wake()


class _SpoutLog:
    """Retained outcomes of one spout: array index ``head`` holds sequence ``first_seq``, ``size`` is the end."""

    __slots__ = (
        "roots",
        "outcomes",
        "latencies",
        "times",
        "size",
        "head",
        "first_seq",
        "delivered",
        "unreported_drops",
        "subscription",
        "active_at",
    )

    def __init__(self, first_seq: int, now: float) -> None:
        self.roots = np.empty(0, np.uint64)
        self.outcomes = np.empty(0, np.uint8)
        self.latencies = np.empty(0, np.uint64)
        self.times = np.empty(0, np.float64)  # publish time of each outcome (clock order)
        self.size = 0
        self.head = 0
        self.first_seq = first_seq
        self.delivered = 0  # highest sequence handed to any subscriber
        self.unreported_drops = 0  # evicted undelivered since the last chunk handed out
        self.subscription: Subscription | None = None
        self.active_at = now  # last outcome appended or subscription ended

    def __len__(self) -> int:
        return self.size - self.head

    def append(self, roots: np.ndarray, outcomes: np.ndarray, micros: np.ndarray, now: float) -> None:
        """Append outcomes; only ever written past ``size``, so views handed out stay as they were."""
        n = len(roots)
        if self.size + n > len(self.roots):
            live = len(self)
            capacity = max(_FIRST_CAPACITY, 2 * (live + n))
            for name in ("roots", "outcomes", "latencies", "times"):
                old = getattr(self, name)
                new = np.empty(capacity, old.dtype)
                new[:live] = old[self.head : self.size]
                setattr(self, name, new)
            self.head, self.size = 0, live
        end = self.size + n
        self.roots[self.size : end] = roots
        self.outcomes[self.size : end] = outcomes
        self.latencies[self.size : end] = micros
        self.times[self.size : end] = now
        self.size = end
        self.active_at = now

    @property
    def next_seq(self) -> int:
        """The sequence number the next outcome will get."""
        return self.first_seq + len(self)

    @property
    def undelivered(self) -> int:
        """Outcomes in the log that no subscriber has received yet (the newest ones)."""
        return min(len(self), self.next_seq - 1 - max(self.delivered, self.first_seq - 1))

    def evict(self, n: int) -> int:
        """Drop the ``n`` oldest outcomes; return how many of them no subscriber had received."""
        last_evicted = self.first_seq + n - 1
        undelivered = max(0, last_evicted - max(self.delivered, self.first_seq - 1))
        self.head += n
        self.first_seq += n
        self.unreported_drops += undelivered
        if self.head == self.size and len(self.roots) > _FIRST_CAPACITY:
            # Empty after a burst: give the memory back (views handed out keep theirs alive).
            self.roots, self.outcomes, self.latencies, self.times = (
                np.empty(0, a.dtype) for a in (self.roots, self.outcomes, self.latencies, self.times)
            )
            self.head = self.size = 0
        return undelivered


class OutcomeHub:
    """Routes resolutions into per-spout retention logs and hands them to subscribers.

    ``subscriber_buffer_bytes`` bounds, per subscribed spout, the outcomes
    waiting for its stream; ``retain_outcomes`` bounds what is kept otherwise.

    >>> hub = OutcomeHub(retain_outcomes=10, retain_seconds=60, incarnation=7, clock=lambda: 0.0)
    >>> sub = hub.subscribe("s", incarnation=0, after_sequence=0, wake=lambda: None)
    >>> hub.take(sub).first_sequence  # the first take always answers, to confirm the subscription
    1
    """

    def __init__(
        self,
        retain_outcomes: int,
        retain_seconds: float,
        incarnation: int,
        clock: Clock = time.monotonic,
        subscriber_buffer_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if retain_outcomes < 1 or retain_seconds <= 0:
            raise ValueError("retention needs retain_outcomes >= 1 and retain_seconds > 0")
        if subscriber_buffer_bytes < 0:
            raise ValueError("subscriber_buffer_bytes must be zero or more")
        self.retain_outcomes = retain_outcomes
        # A subscribed spout's backlog is kept up to this many outcomes (never fewer than retain_outcomes).
        self.subscriber_backlog = max(retain_outcomes, subscriber_buffer_bytes // OUTCOME_BYTES)
        self.retain_seconds = float(retain_seconds)
        self.incarnation = incarnation
        self._clock = clock
        self._logs: dict[str, _SpoutLog] = {}
        # The highest sequence any forgotten log had reached: a log made again for
        # the same name continues above it, so a spout resuming with an old
        # position never mistakes new outcomes for ones it already processed.
        self._sequence_floor = 0
        self.retained = 0  # outcomes held, all spouts
        self.dropped_total = 0  # outcomes evicted before any subscriber received them
        self.subscribers = 0

    def _log(self, spout: str) -> _SpoutLog:
        log = self._logs.get(spout)
        if log is None:
            log = self._logs[spout] = _SpoutLog(self._sequence_floor + 1, self._clock())
        return log

    def publish(self, columns: OutcomeColumns) -> None:
        """Append each outcome to its spout's log, evict over the count bound, wake subscribers."""
        if not len(columns):
            return
        now = self._clock()
        roots, outcomes, micros = columns.roots, columns.outcomes, columns.latency_micros
        touched = []
        for spout, where in columns.by_spout():
            log = self._log(spout)
            if where is None:
                log.append(roots, outcomes, micros, now)
            else:
                log.append(roots[where], outcomes[where], micros[where], now)
            touched.append(log)
        self.retained += len(columns)
        self._bound_and_wake(touched)

    def _bound_and_wake(self, touched: list[_SpoutLog]) -> None:
        for log in touched:
            self._trim(log)
            if log.subscription is not None:
                log.subscription.wake()

    def _trim(self, log: _SpoutLog) -> None:
        """Enforce the bounds: the count for a spout without a stream, the byte bound on a stream's backlog."""
        excess = len(log) - self.retain_outcomes
        if excess <= 0:
            return
        if log.subscription is None:
            self._evict(log, excess)
            return
        # Subscribed: received outcomes go first (they are only kept for a resume);
        # undelivered ones only when the backlog passes the byte bound (too slow a reader).
        undelivered = log.undelivered
        delivered = len(log) - undelivered
        overflow = undelivered - self.subscriber_backlog
        n = delivered + overflow if overflow > 0 else min(excess, delivered)
        if n > 0:
            self._evict(log, n)

    def expire(self) -> int:
        """Evict outcomes older than ``retain_seconds``, forget idle spouts; return how many outcomes were evicted.

        A spout is idle when no subscription is open, nothing is retained and
        nothing happened for ``retain_seconds``: its state would otherwise stay
        forever (spout names include a process id, so every restart adds one).
        """
        cutoff = self._clock() - self.retain_seconds
        evicted = 0
        idle = []
        for spout, log in self._logs.items():
            if len(log) and log.times[log.head] < cutoff:
                # Times are appended in clock order, so the old ones form a prefix.
                n = int(np.searchsorted(log.times[log.head : log.size], cutoff))
                if self._evict(log, n):
                    # Undelivered drops are news for the next subscriber: keep the log another window.
                    log.active_at = cutoff + self.retain_seconds
                evicted += n
                if log.subscription is not None and log.unreported_drops:
                    log.subscription.wake()
            if log.subscription is None and not len(log) and log.active_at <= cutoff:
                idle.append(spout)
        for spout in idle:
            # Drops never reported on a stream stay counted in dropped_total.
            self._sequence_floor = max(self._sequence_floor, self._logs.pop(spout).next_seq - 1)
        if len(idle) > len(self._logs):
            self._logs = dict(self._logs)  # a dict never shrinks its table on deletion; a copy does
        return evicted

    def _evict(self, log: _SpoutLog, n: int) -> int:
        undelivered = log.evict(n)
        self.dropped_total += undelivered
        self.retained -= n
        return undelivered

    def subscribe(self, spout: str, *, incarnation: int, after_sequence: int, wake: Callable[[], None]) -> Subscription:
        """Start a subscription, taking over any older one for the same spout.

        With this hub's ``incarnation`` the subscriber gets exactly the outcomes
        after ``after_sequence``; otherwise it starts at the oldest retained one.
        """
        log = self._log(spout)
        if incarnation == self.incarnation:
            # A position beyond what exists (a client bug) is clamped to "everything seen".
            cursor = min(after_sequence, log.next_seq - 1)
            # Outcomes already handed to an earlier stream but not processed, and since evicted.
            gap = max(0, min(log.delivered, log.first_seq - 1) - cursor)
        else:
            cursor, gap = 0, 0
        subscription = Subscription(spout, log, cursor, gap, wake)
        previous = log.subscription
        if previous is not None:
            previous.superseded = True
            previous.wake()
        else:
            self.subscribers += 1
        log.subscription = subscription
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """End a subscription (a no-op for one already taken over)."""
        log = subscription._log
        if log.subscription is subscription:
            log.subscription = None
            log.active_at = self._clock()
            self.subscribers -= 1
            # The spout is gone: its backlog falls back to the count bound.
            self._trim(log)

    def take(self, subscription: Subscription, limit: int = 4096) -> OutcomeChunk | None:
        """The next up to ``limit`` outcomes for the subscriber, or None if there is nothing to say."""
        if subscription.superseded:
            return None
        log = subscription._log
        start = max(subscription.cursor + 1, log.first_seq)
        end = min(log.next_seq, start + limit)
        dropped = log.unreported_drops + subscription._gap
        if end <= start and not dropped and not subscription._header_due:
            return None
        i0 = log.head + (start - log.first_seq)
        i1 = i0 + max(0, end - start)
        # Views, not copies: the log never writes where it already wrote.
        chunk = OutcomeChunk(start, log.roots[i0:i1], log.outcomes[i0:i1], log.latencies[i0:i1], dropped)
        subscription.cursor = max(subscription.cursor, end - 1)
        subscription._header_due = False
        subscription._gap = 0
        log.delivered = max(log.delivered, end - 1)
        log.unreported_drops = 0
        if len(log) > self.retain_outcomes:
            self._trim(log)  # what the stream took is kept for a resume within the count bound only
        return chunk

    def wake_all(self) -> None:
        """Wake every subscriber (for example so streams can end at shutdown)."""
        for log in self._logs.values():
            if log.subscription is not None:
                log.subscription.wake()

    def is_subscribed(self, spout: str) -> bool:
        """True if a subscription for ``spout`` is open."""
        log = self._logs.get(spout)
        return log is not None and log.subscription is not None

    @property
    def tracked_spouts(self) -> int:
        """Spouts the hub holds state for (a log, a sequence counter), subscribed or not."""
        return len(self._logs)

    def retained_for(self, spout: str) -> int:
        """Outcomes currently retained for one spout."""
        log = self._logs.get(spout)
        return len(log) if log is not None else 0
