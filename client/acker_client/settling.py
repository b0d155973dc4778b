"""The outcome side of a spout: takes trees off the pending map a batch at a time and queues them for the callbacks.

:class:`Settlement` owns the spout's lock, its pending map
(:class:`~acker_client.pending.PendingTrees`), its counters and the callback
thread. Every way a tree can end (an acker's outcome, the backstop, a dropped
init batch, ``close``) goes through it, so the first outcome for a root wins
and anything later is counted as late. A batch of outcomes costs one lock
round and one queue item, however many records it settles.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from acker_protocol.wire import Outcome

from .pending import PendingTrees
from .replica_outcomes import ReplicaOutcomes

__all__ = ["Settlement", "Settled", "CallBack", "SpoutStats"]

log = logging.getLogger(__name__)

Settled = tuple[list[Any], list[tuple[Any, Outcome]]]
"""One batch for the callbacks: acked message ids, and ``(message id, reason)`` pairs of the failed."""
CallBack = Callable[[list[Any], list[tuple[Any, Outcome]]], None]

_STOP = object()
_ACKED = int(Outcome.ACKED)
_OUTCOME_OF = {int(o): o for o in Outcome}
_COUNTER = {o: o.name.lower() for o in Outcome}
_COUNTER[Outcome.LIFETIME_EXCEEDED] = "timed_out"  # a timeout at the acker's lifetime cap
COUNTERS = ("emitted", "acked", "failed", "timed_out", "lost", "late", "dropped", "timeout_resets", "duplicates")


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
    # Shards whose outcome stream is broken now (their trees' backstop is paused; with replicas 2,
    # only the trees both of whose replicas' streams are down).
    streams_down: int = 0
    backstop_paused_seconds: float = 0.0  # total time backstops stood still while streams were down
    # The ClusterClient's delivery figures (ClientStats), here so one place shows the spout's health:
    operations_waiting: int = 0  # in batches waiting for a shard's connection now
    operations_retried: int = 0
    operations_dropped: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    shard_states: tuple[str, ...] = ()  # each shard's connection as the client last saw it
    # With replicas 2: second outcomes of trees the partner replica had already settled (ignored).
    duplicate_outcomes: int = 0


class Settlement:
    """Settles a spout's trees and runs ``call_back(acked, failed)`` for each settled batch on one thread.

    ``cond`` guards ``pending``, ``counts`` and ``undelivered`` (records
    settled whose callback has not returned); the emitting side takes it too.
    Everything here is called without the lock held, except where a method
    says otherwise.
    """

    def __init__(
        self,
        name: str,
        pending: PendingTrees,
        clock: Callable[[], float],
        call_back: CallBack,
        replicas: ReplicaOutcomes | None = None,
    ) -> None:
        self.name = name
        self.pending = pending
        self.replicas = replicas if replicas is not None else ReplicaOutcomes(1, pending.timeout)
        self.clock = clock
        self.cond = threading.Condition()
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.undelivered = 0
        self._call_back = call_back
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._dispatch_loop, name="acker-spout-callbacks", daemon=True)

    # -- the callback thread ---------------------------------------------------------

    def start(self) -> threading.Thread:
        """Start the callback thread; return it (the spout joins it on close)."""
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Let the callback thread finish what is queued, then end."""
        self._calls.put(_STOP)

    def idle(self) -> bool:
        """With the lock held: nothing pending and every callback returned."""
        return not self.pending and not self.undelivered

    def _dispatch_loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            acked, failed = item
            try:
                self._call_back(acked, failed)
            except Exception:  # call_back guards the user's code; this only guards call_back itself
                log.exception("spout %r: callbacks for %d records failed", self.name, len(acked) + len(failed))
            finally:
                with self.cond:
                    self.undelivered -= len(acked) + len(failed)
                    self.cond.notify_all()

    def _settled(self, acked: list[Any], failed: list[tuple[Any, Outcome]]) -> None:
        """With the lock held: count what was just taken off the pending map, and wake emits waiting for room."""
        if not acked and not failed:
            return
        counts = self.counts
        counts["acked"] += len(acked)
        for _, reason in failed:
            counts[_COUNTER[reason]] += 1
        self.undelivered += len(acked) + len(failed)
        self.cond.notify_all()

    def _hand_over(self, acked: list[Any], failed: list[tuple[Any, Outcome]]) -> None:
        """Queue one batch for the callback thread (after the lock is released)."""
        if acked or failed:
            self._calls.put((acked, failed))

    # -- ways a tree ends ---------------------------------------------------------

    def ends(self, shard: int, roots: list[int], outcomes: np.ndarray) -> None:
        """Settle ``roots`` (of one shard) with the acker's ``outcomes``, in order: the first for a root wins."""
        acked: list[Any] = []
        failed: list[tuple[Any, Outcome]] = []
        with self.cond:
            entries = self.pending.pop_many(shard, roots)
            if (outcomes == _ACKED).all():  # the common batch: acks only
                acked = [entry[1] for entry in entries if entry is not None]
            else:
                for entry, code in zip(entries, outcomes.tolist()):
                    if entry is not None:
                        if code == _ACKED:
                            acked.append(entry[1])
                        else:
                            failed.append((entry[1], _OUTCOME_OF[code]))
            self._count_unmatched(roots, entries, len(acked) + len(failed))
            self._settled(acked, failed)
        self._hand_over(acked, failed)

    def _count_unmatched(self, roots: list[int], entries: list[Any], matched: int) -> None:
        """With the lock held: the one place a replica's second outcome is told from a late one, and ignored."""
        replicas = self.replicas
        if replicas.replicas == 1:
            self.counts["late"] += len(roots) - matched
            return
        now = self.clock()
        replicas.settled((r for r, e in zip(roots, entries) if e is not None), now)
        if matched < len(roots):
            duplicates = replicas.duplicates(r for r, e in zip(roots, entries) if e is None)
            self.counts["duplicates"] += duplicates
            self.counts["late"] += len(roots) - matched - duplicates

    def restart(self, shard: int, roots: list[int]) -> None:
        """Fresh backstops for the pending ``roots`` of ``shard`` (their acker timeout was reset)."""
        with self.cond:
            # Settled roots are skipped: a reset after the end changes nothing.
            self.counts["timeout_resets"] += self.pending.restart_many(shard, roots, self.clock())

    def lose(self, roots: Iterable[int]) -> int:
        """Fail every pending root of ``roots`` as LOST; the others count as late. How many were pending.

        ``roots`` are inits one replica missed: with replicas 2 only those every replica missed are lost.
        """
        roots = list(roots)
        if not roots:
            return 0
        with self.cond:
            roots = self.replicas.missed_inits(roots, self.clock())
            entries = [self.pending.pop(root) for root in roots]
            failed = [(entry[1], Outcome.LOST) for entry in entries if entry is not None]
            self.counts["late"] += len(roots) - len(failed)
            self._settled([], failed)
        self._hand_over([], failed)
        return len(failed)

    def expire(self) -> int:
        """Fail as LOST every root whose backstop deadline has passed; how many."""
        with self.cond:
            self.replicas.prune(self.clock())
            failed = [(mid, Outcome.LOST) for mid in self.pending.pop_expired(self.clock())]
            self._settled([], failed)
        self._hand_over([], failed)
        return len(failed)

    def lose_all(self) -> int:
        """Fail everything still pending as LOST (the spout is closing); how many."""
        with self.cond:
            failed = [(mid, Outcome.LOST) for mid in self.pending.pop_all()]
            self._settled([], failed)
        self._hand_over([], failed)
        return len(failed)

    # -- figures ---------------------------------------------------------------------

    def stats(self, subscriptions: Sequence[Any], client: Any) -> SpoutStats:
        """A consistent snapshot of the counts, with the streams' and the client's (ClientStats) figures."""
        with self.cond:
            c = self.counts
            clock_now = self.clock()
            clocks = self.pending.clocks
            return SpoutStats(
                emitted=c["emitted"],
                acked=c["acked"],
                failed=c["failed"],
                timed_out=c["timed_out"],
                lost=c["lost"],
                late_outcomes=c["late"],
                pending=len(self.pending),
                outcomes_dropped=c["dropped"],
                reconnects=sum(s.reconnects for s in subscriptions),
                timeout_resets=c["timeout_resets"],
                streams_down=self.pending.streams_down,
                backstop_paused_seconds=round(sum(sc.paused + sc.current_pause(clock_now) for sc in clocks), 3),
                operations_waiting=getattr(client, "operations_waiting", 0),
                operations_retried=getattr(client, "operations_retried", 0),
                operations_dropped=getattr(client, "operations_dropped", 0),
                dropped_by_reason=dict(getattr(client, "dropped_by_reason", {})),
                shard_states=tuple(getattr(client, "shard_states", ())),
                duplicate_outcomes=c["duplicates"],
            )
