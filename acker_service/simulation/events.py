"""The simulated world's clock, event queue and lossy network: deterministic from one ``random.Random``.

Events are ``(time, sequence)``-ordered, so two events at the same instant run
in the order they were scheduled and a run is a pure function of its seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NetworkFaults:
    """How the network misbehaves: each message is lost, duplicated, and delayed (which reorders) at random."""

    loss: float = 0.0
    duplicate: float = 0.0
    min_delay: float = 0.001
    max_delay: float = 0.05


class World:
    """Simulated time, the pending events and the network between the actors."""

    def __init__(self, rng: random.Random, faults: NetworkFaults, trace: list[str] | None = None) -> None:
        self.rng = rng
        self.faults = faults
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self._trace = trace
        self.tally: dict[str, int] = {}  # what happened how often (batches, chunks, refusals), for the summary

    def clock(self) -> float:
        """The simulated monotonic clock (what every ledger is given)."""
        return self.now

    @property
    def tracing(self) -> bool:
        """Whether a trace is kept (callers skip formatting per-operation lines otherwise)."""
        return self._trace is not None

    def log(self, message: str) -> None:
        """Record one line of the run's trace (kept only when a trace was asked for)."""
        if self._trace is not None:
            self._trace.append(f"{self.now:9.4f} {message}")

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to the run's tally of ``what``."""
        self.tally[what] = self.tally.get(what, 0) + n

    def at(self, delay: float, action: Callable[..., None], *args: Any) -> None:
        """Run ``action(*args)`` ``delay`` simulated seconds from now."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0.0, delay), self._seq, action, args))

    def send(self, action: Callable[..., None], *args: Any) -> None:
        """Deliver a message through the faulty network: maybe never, maybe twice, after a random delay."""
        f = self.faults
        if self.rng.random() < f.loss:
            return
        copies = 2 if self.rng.random() < f.duplicate else 1
        for _ in range(copies):
            self.at(self.rng.uniform(f.min_delay, f.max_delay), action, *args)

    def run_until(self, end: float) -> None:
        """Run every event due up to ``end``, then set the clock to ``end``."""
        queue = self._queue
        while queue and queue[0][0] <= end:
            when, _, action, args = heapq.heappop(queue)
            self.now = when
            action(*args)
        self.now = max(self.now, end)
