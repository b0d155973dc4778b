"""The driver-fed pipeline's replay schedule: failed deliveries waiting for their backoff.

Failed deliveries wait here until their backoff is due. First deliveries the
spout could not take (``max_pending`` trees in flight) wait as the lookahead,
so the source is not read past them before they go out. Every operation has a
batch form (``retry_many``, ``pop_due_many``, ``push_back_many``) that reads
the clock once. Not thread-safe on its own: callers hold their lock around
every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence

from ..replay_policy import ReplayPolicy
from ..sources import Delivery

__all__ = ["ReplaySchedule"]


class ReplaySchedule:
    """Deliveries waiting to be emitted: due-time ordered replays, then pushed-back first deliveries in order."""

    def __init__(self, policy: ReplayPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.clock = clock
        self._replays: list[tuple[float, int, Delivery]] = []  # heap by due time
        self._seq = itertools.count()  # ties broken in arrival order; Deliveries never compared
        self._lookahead: deque[Delivery] = deque()

    def retry(self, failed: Delivery) -> bool:
        """Queue the next delivery of ``failed`` after its backoff; False if it has used every attempt."""
        return self.retry_many([failed])[0]

    def retry_many(self, failed: Sequence[Delivery], causes: Sequence[str | None] | None = None) -> list[bool]:
        """:meth:`retry` for each of ``failed``, reading the clock once; True where a replay was queued.

        ``causes`` (one per delivery, None where none is known): a failure whose cause the
        policy dead-letters at once is not queued, whatever attempts it has left.
        """
        now, max_attempts, delay = self.clock(), self.policy.max_attempts, self.policy.delay
        retries = self.policy.retries
        if causes is None:
            queued = [d.attempt < max_attempts for d in failed]
        else:
            queued = [d.attempt < max_attempts and retries(c) for d, c in zip(failed, causes)]
        items = [
            (now + delay(d.attempt), next(self._seq), d._replace(attempt=d.attempt + 1))
            for d, ok in zip(failed, queued)
            if ok
        ]
        if len(items) > len(self._replays):
            # Many at once: one O(n) heapify beats n pushes.
            self._replays.extend(items)
            heapq.heapify(self._replays)
        else:
            for item in items:
                heapq.heappush(self._replays, item)
        return queued

    def push_back(self, delivery: Delivery) -> None:
        """Return a delivery that could not be emitted now: it goes out first next time."""
        self.push_back_many([delivery])

    def push_back_many(self, deliveries: Sequence[Delivery]) -> None:
        """Return deliveries that could not be emitted now, in the order given: they go out first next time."""
        now = self.clock()
        firsts = []
        for delivery in deliveries:
            if delivery.attempt == 1:
                firsts.append(delivery)
            else:
                heapq.heappush(self._replays, (now, next(self._seq), delivery))
        self._lookahead.extendleft(reversed(firsts))  # ahead of those pushed back earlier, in order

    def pop_due(self) -> Delivery | None:
        """The next delivery to emit: a replay whose time has come, else a pushed-back one, else None."""
        due = self.pop_due_many(1)
        return due[0] if due else None

    def pop_due_many(self, limit: int | None) -> list[Delivery]:
        """Up to ``limit`` (None: all) deliveries to emit: due replays in due order, then pushed-back ones."""
        now = self.clock()
        out: list[Delivery] = []
        while self._replays and self._replays[0][0] <= now and (limit is None or len(out) < limit):
            out.append(heapq.heappop(self._replays)[2])
        while self._lookahead and (limit is None or len(out) < limit):
            out.append(self._lookahead.popleft())
        return out

    def drain(self) -> list[Delivery]:
        """Remove and return every queued delivery, due or not (a run that stops replaying)."""
        out = [item[2] for item in sorted(self._replays)] + list(self._lookahead)
        self._replays.clear()
        self._lookahead.clear()
        return out

    def next_due(self) -> float | None:
        """When the earliest queued replay is due (clock time), or None if none is queued."""
        return self._replays[0][0] if self._replays else None

    @property
    def waiting(self) -> int:
        """Replays queued (not counting a pushed-back first delivery)."""
        return len(self._replays)

    @property
    def empty(self) -> bool:
        """True when no replay is queued and nothing was pushed back."""
        return not self._replays and not self._lookahead
