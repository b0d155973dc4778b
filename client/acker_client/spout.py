"""Spout: starts tuple trees, keeps the pending map and backstop, and calls on_ack / on_fail exactly once per emit."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from acker_protocol.wire import Outcome

from .errors import AckerError, ShardUnavailable, SpoutFull
from .ids import new_id
from .subscription import OutcomeSubscription
from .tuples import MessageId, TrackedTuple

__all__ = ["Spout", "SpoutStats", "default_backstop"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpoutStats:
    """Counts of one spout; ``emitted == acked + failed + timed_out + lost + pending`` at every moment."""

    emitted: int
    acked: int
    failed: int
    timed_out: int
    lost: int
    late_outcomes: int  # outcomes for roots no longer pending (ignored)
    pending: int
    outcomes_dropped: int = 0  # reported by ackers: evicted from retention before delivery
    reconnects: int = 0  # outcome streams re-opened
    timeout_resets: int = 0  # backstops restarted because a tree's acker timeout was reset
    streams_down: int = 0  # shards whose outcome stream is broken now (their backstop is paused)
    backstop_paused_seconds: float = 0.0  # total time backstops stood still while streams were down
    # The ClusterClient's delivery figures (ClientStats), here so one place shows the spout's health:
    operations_waiting: int = 0  # in batches waiting for a shard's connection now
    operations_retried: int = 0
    operations_dropped: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    shard_states: tuple[str, ...] = ()  # each shard's connection as the client last saw it


def default_backstop(message_timeout: float, buckets: int) -> float:
    """The spout's timeout: the latest an acker can expire a tree, plus a margin for delivery."""
    # An acker expires a tree between T and T + T/(b-1) after its init.
    latest = message_timeout + message_timeout / max(buckets - 1, 1)
    return latest + max(1.0, 0.2 * message_timeout)


class _Pending:
    __slots__ = ("message_id", "deadline", "shard")

    def __init__(self, message_id: Any, deadline: float, shard: int) -> None:
        self.message_id = message_id
        self.deadline = deadline  # on the shard's backstop clock (see _ShardClock)
        self.shard = shard


class _ShardClock:
    """A shard's backstop clock: the spout's clock minus the time the shard's outcome stream was down.

    While the stream is broken, outcomes the acker produces (ACKED, or the
    TIMED_OUT it decides during the outage) wait in its retention for the
    resume, so the backstop must not count that time against the trees. A
    single outage pauses the clock for at most ``max_pause`` seconds, so a
    stream that never comes back still ends in LOST callbacks.
    """

    __slots__ = ("paused", "down_since", "max_pause")

    def __init__(self, max_pause: float) -> None:
        self.paused = 0.0  # finished outages, each capped
        self.down_since: float | None = None
        self.max_pause = max_pause

    def now(self, clock_now: float) -> float:
        return clock_now - self.paused - self.current_pause(clock_now)

    def current_pause(self, clock_now: float) -> float:
        if self.down_since is None:
            return 0.0
        return min(clock_now - self.down_since, self.max_pause)

    def set_down(self, down: bool, clock_now: float) -> None:
        if down and self.down_since is None:
            self.down_since = clock_now
        elif not down and self.down_since is not None:
            self.paused += self.current_pause(clock_now)
            self.down_since = None


_STOP = object()
# Outcomes an acker sends that end a tree.
_ENDS = frozenset({Outcome.ACKED, Outcome.FAILED, Outcome.TIMED_OUT})


class Spout:
    """Starts one tuple tree per emitted record and reports each record's fate exactly once.

    ``on_ack(message_id)`` and ``on_fail(message_id, reason)`` are called from
    one background thread, one call at a time. The spout subscribes to every
    acker's outcome stream; if an outcome never arrives (an acker died with its
    ledger, a shard was unreachable), its own backstop timeout fails the record
    with :attr:`Outcome.LOST <acker_protocol.wire.Outcome.LOST>`.
    ``reason`` is the :class:`~acker_protocol.wire.Outcome`: FAILED (a tuple
    was failed), TIMED_OUT (the acker's timeout) or LOST.

    The backstop restarts when an acker reports that a tree's timeout was
    reset. It counts time per shard, and stands still while that shard's
    outcome stream is broken (for at most ``timeout`` seconds per outage): an
    acker keeps the outcomes it produced during a network blip and delivers
    them on resume, so the record gets the acker's outcome (ACKED, FAILED,
    TIMED_OUT), not LOST.
    """

    def __init__(
        self,
        cluster,
        *,
        on_ack: Callable[[Any], None],
        on_fail: Callable[[Any, Outcome], None],
        name: str | None = None,
        max_pending: int = 10_000,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        check_interval: float | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.cluster = cluster
        self.on_ack = on_ack
        self.on_fail = on_fail
        self.name = name or f"spout-{socket.gethostname()}-{os.getpid()}-{new_id():016x}"
        self.max_pending = max_pending
        self.timeout = timeout if timeout is not None else self._default_timeout()
        self._clock = clock
        self._check_interval = check_interval or min(1.0, max(self.timeout / 10, 0.05))
        self._pending: dict[int, _Pending] = {}
        # Per shard, roots in deadline order (every entry gets the same timeout).
        self._order: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(cluster.shard_count)]
        self._shard_clocks = [_ShardClock(self.timeout) for _ in range(cluster.shard_count)]
        self._cond = threading.Condition()
        self._undelivered = 0
        self._counts = dict.fromkeys(
            ("emitted", "acked", "failed", "timed_out", "lost", "late", "dropped", "timeout_resets"), 0
        )
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._subscriptions: list[OutcomeSubscription] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._started = False
        self._closed = False

    def _default_timeout(self) -> float:
        timeouts = []
        for shard in range(self.cluster.shard_count):
            try:
                info = self.cluster.describe(shard)
            except ShardUnavailable as exc:
                log.warning("backstop: %s", exc)
                continue
            timeouts.append(default_backstop(info.message_timeout_seconds, info.buckets))
        if not timeouts:
            raise ShardUnavailable([], "no acker answered Describe; cannot choose the spout's backstop timeout")
        return max(timeouts)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Spout:
        """Subscribe to every acker and start the backstop and callback threads (idempotent)."""
        with self._cond:
            if self._started:
                return self
            if self._closed:
                raise AckerError("this spout is closed")
            self._started = True
        self.cluster.add_error_listener(self._on_batch_error)
        for shard in range(self.cluster.shard_count):
            sub = OutcomeSubscription(
                self.cluster,
                shard,
                self.name,
                self._on_outcome,
                on_dropped=self._on_dropped,
                on_state=self._on_stream_state,
            )
            self._subscriptions.append(sub.start())
        for target, label in ((self._dispatch_loop, "callbacks"), (self._backstop_loop, "backstop")):
            thread = threading.Thread(target=target, name=f"acker-spout-{label}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop; records still pending are failed as LOST so that every emit gets its one callback."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            return
        self._stopping.set()
        for sub in self._subscriptions:
            sub.close(timeout)
        self.cluster.remove_error_listener(self._on_batch_error)
        with self._cond:
            leftover = list(self._pending)
        for root in leftover:
            self._resolve(root, Outcome.LOST)
        self._calls.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> Spout:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def subscriptions(self) -> tuple[OutcomeSubscription, ...]:
        """The per-shard outcome streams (for monitoring and tests)."""
        return tuple(self._subscriptions)

    # -- emitting ------------------------------------------------------------

    def emit(self, record: Any, message_id: Any, *, block: bool = True, timeout: float | None = None) -> TrackedTuple:
        """Start a tree for ``record`` and return the tracked tuple to send on; SpoutFull if still full after ``timeout``."""
        return self._emit(record, message_id, 1, block, timeout)[0]

    def try_emit(self, record: Any, message_id: Any) -> TrackedTuple | None:
        """Like :meth:`emit`, but return None at once when ``max_pending`` trees are in flight."""
        try:
            return self._emit(record, message_id, 1, False, None)[0]
        except SpoutFull:
            return None

    def emit_to(
        self, record: Any, message_id: Any, targets: int, *, block: bool = True, timeout: float | None = None
    ) -> list[TrackedTuple]:
        """Start one tree whose record goes to ``targets`` consumers: one tracked tuple (edge) per target."""
        if targets < 1:
            raise ValueError("targets must be at least 1")
        return self._emit(record, message_id, targets, block, timeout)

    def _emit(
        self, record: Any, message_id: Any, targets: int, block: bool, timeout: float | None
    ) -> list[TrackedTuple]:
        if not self._started:
            self.start()
        root = new_id()
        edges = [new_id() for _ in range(targets)]
        value = 0
        for edge in edges:
            value ^= edge
        self._admit(root, message_id, block, timeout)
        try:
            self.cluster.init(root, value, self.name)
        except AckerError as exc:
            # The batch holding this init was dropped; the error listener has
            # already failed its roots as LOST, so the caller sees no exception.
            log.debug("init of root %d not delivered: %s", root, exc)
        return [TrackedTuple(record, MessageId.single(root, edge)) for edge in edges]

    def _admit(self, root: int, message_id: Any, block: bool, timeout: float | None) -> None:
        with self._cond:
            if self._closed:
                raise AckerError("this spout is closed")
            if len(self._pending) >= self.max_pending:
                if not block:
                    raise SpoutFull(f"{self.max_pending} records pending in spout {self.name!r}")
                if not self._cond.wait_for(lambda: len(self._pending) < self.max_pending, timeout):
                    raise SpoutFull(
                        f"{self.max_pending} records still pending in spout {self.name!r} after {timeout} s"
                    )
            shard = root % len(self._order)
            deadline = self._shard_clocks[shard].now(self._clock()) + self.timeout
            self._pending[root] = _Pending(message_id, deadline, shard)
            self._order[shard][root] = None
            self._counts["emitted"] += 1

    # -- outcomes ------------------------------------------------------------

    def _on_outcome(self, root: int, outcome: int, latency_micros: int) -> None:
        if outcome in _ENDS:
            self._resolve(root, Outcome(outcome))
        elif outcome == Outcome.TIMEOUT_RESET:
            self._restart_backstop(root)
        else:
            # LOST is the spout's own verdict, never an acker's; anything else is from a newer acker.
            log.warning("ignoring unknown outcome %d for root %d", outcome, root)

    def _restart_backstop(self, root: int) -> None:
        """A reset_timeout gave the tree a fresh acker timeout: give it a fresh backstop too."""
        with self._cond:
            entry = self._pending.get(root)
            if entry is None:
                return  # already settled: a reset after the end changes nothing
            entry.deadline = self._shard_clocks[entry.shard].now(self._clock()) + self.timeout
            # Moved last, so the shard's order stays deadline order (check_timeouts relies on it).
            self._order[entry.shard].move_to_end(root)
            self._counts["timeout_resets"] += 1

    def _on_stream_state(self, shard: int, connected: bool) -> None:
        """A shard's outcome stream broke (pause its backstop clock) or is open again (resume it)."""
        with self._cond:
            self._shard_clocks[shard].set_down(not connected, self._clock())

    def _on_dropped(self, count: int) -> None:
        with self._cond:
            self._counts["dropped"] += count
        log.warning("spout %r: %d outcomes were dropped by an acker; the backstop will fail them", self.name, count)

    def _on_batch_error(self, error: AckerError) -> None:
        # Inits that never reached an acker would wait for the backstop; fail them now.
        for root in getattr(error, "init_roots", ()):
            self._resolve(root, Outcome.LOST)

    def _resolve(self, root: int, outcome: Outcome) -> bool:
        """Settle ``root`` once: the first outcome wins, later ones are counted as late."""
        with self._cond:
            entry = self._pending.pop(root, None)
            if entry is None:
                self._counts["late"] += 1
                return False
            del self._order[entry.shard][root]
            self._counts[outcome.name.lower()] += 1
            self._undelivered += 1
            self._cond.notify_all()
        self._calls.put((outcome, entry.message_id))
        return True

    def _dispatch_loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            outcome, message_id = item
            try:
                if outcome is Outcome.ACKED:
                    self.on_ack(message_id)
                else:
                    self.on_fail(message_id, outcome)
            except Exception:  # the user's bug must not stop the other records' callbacks
                log.exception("spout %r: callback for %r raised", self.name, message_id)
            finally:
                with self._cond:
                    self._undelivered -= 1
                    self._cond.notify_all()

    # -- backstop ------------------------------------------------------------

    def check_timeouts(self) -> int:
        """Fail as LOST every record pending longer than the backstop timeout; return how many."""
        expired = []
        with self._cond:
            clock_now = self._clock()
            for order, shard_clock in zip(self._order, self._shard_clocks):
                now = shard_clock.now(clock_now)
                # A shard's order is deadline order: every entry gets the same timeout.
                for root in order:
                    if self._pending[root].deadline > now:
                        break
                    expired.append(root)
        return sum(self._resolve(root, Outcome.LOST) for root in expired)

    def _backstop_loop(self) -> None:
        while not self._stopping.wait(self._check_interval):
            try:
                self.check_timeouts()
            except Exception:
                log.exception("spout %r: backstop check failed", self.name)

    # -- state ---------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Records emitted and not yet settled."""
        with self._cond:
            return len(self._pending)

    @property
    def stats(self) -> SpoutStats:
        """A consistent snapshot of the counts."""
        client = getattr(self.cluster, "stats", None)
        with self._cond:
            c = self._counts
            clock_now = self._clock()
            return SpoutStats(
                emitted=c["emitted"],
                acked=c["acked"],
                failed=c["failed"],
                timed_out=c["timed_out"],
                lost=c["lost"],
                late_outcomes=c["late"],
                pending=len(self._pending),
                outcomes_dropped=c["dropped"],
                reconnects=sum(s.reconnects for s in self._subscriptions),
                timeout_resets=c["timeout_resets"],
                streams_down=sum(1 for sc in self._shard_clocks if sc.down_since is not None),
                backstop_paused_seconds=round(
                    sum(sc.paused + sc.current_pause(clock_now) for sc in self._shard_clocks), 3
                ),
                operations_waiting=getattr(client, "operations_waiting", 0),
                operations_retried=getattr(client, "operations_retried", 0),
                operations_dropped=getattr(client, "operations_dropped", 0),
                dropped_by_reason=dict(getattr(client, "dropped_by_reason", {})),
                shard_states=tuple(getattr(client, "shard_states", ())),
            )

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending and every callback has returned; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._undelivered, timeout)
