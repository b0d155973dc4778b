"""The replay schedule shared by the batch pipeline and the streaming spout.

Failed deliveries wait here until their backoff is due. A first delivery the
spout could not take (``max_pending`` trees in flight) waits as the lookahead,
so the source is not read past it before it goes out. Not thread-safe on its
own: callers hold their lock around every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from .sources import Delivery

__all__ = ["ReplayPolicy", "ReplaySchedule"]


@dataclass(frozen=True)
class ReplayPolicy:
    """How often and how soon a failed record is delivered again."""

    max_attempts: int = 5  # deliveries in all, the first one included
    backoff_base: float = 0.5  # seconds before the first replay
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base < 0 or self.backoff_cap < 0 or self.backoff_factor < 1:
            raise ValueError("backoff_base and backoff_cap must be >= 0 and backoff_factor >= 1")

    def delay(self, attempts_made: int) -> float:
        """Seconds to wait before delivery number ``attempts_made + 1``."""
        return min(self.backoff_cap, self.backoff_base * self.backoff_factor ** max(0, attempts_made - 1))


class ReplaySchedule:
    """Deliveries waiting to be emitted: due-time ordered replays, then at most one pushed-back first delivery."""

    def __init__(self, policy: ReplayPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.clock = clock
        self._replays: list[tuple[float, int, Delivery]] = []  # heap by due time
        self._seq = itertools.count()  # ties broken in arrival order; Deliveries never compared
        self._lookahead: Delivery | None = None

    def retry(self, failed: Delivery) -> bool:
        """Queue the next delivery of ``failed`` after its backoff; False if it has used every attempt."""
        if failed.attempt >= self.policy.max_attempts:
            return False
        due = self.clock() + self.policy.delay(failed.attempt)
        heapq.heappush(self._replays, (due, next(self._seq), failed._replace(attempt=failed.attempt + 1)))
        return True

    def push_back(self, delivery: Delivery) -> None:
        """Return a delivery that could not be emitted now: it goes out first next time."""
        if delivery.attempt == 1:
            self._lookahead = delivery
        else:
            heapq.heappush(self._replays, (self.clock(), next(self._seq), delivery))

    def pop_due(self) -> Delivery | None:
        """The next delivery to emit: a replay whose time has come, else the pushed-back one, else None."""
        if self._replays and self._replays[0][0] <= self.clock():
            return heapq.heappop(self._replays)[2]
        delivery, self._lookahead = self._lookahead, None
        return delivery

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
        return not self._replays and self._lookahead is None
