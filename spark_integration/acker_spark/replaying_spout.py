"""The replaying spout behind both drivers: the batch pipeline and the Structured Streaming source.

:class:`ReplayingSpout` emits :class:`~acker_spark.sources.Delivery` values as
tuple trees through :class:`acker_client.Spout`. The delivery itself is the
message id, so the client spout's pending map is the only one. When a tree
fails, times out or is lost, the next delivery of its record is queued after
the policy's backoff, until ``max_attempts`` deliveries were made; the driver
learns every outcome through ``on_outcome(delivery, outcome, final)``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from acker_client import ClusterClient, Spout, TrackedTuple
from acker_protocol.wire import Outcome

from .replays import ReplayPolicy, ReplaySchedule
from .sources import Delivery

__all__ = ["ReplayingSpout", "OnOutcome"]

OnOutcome = Callable[[Delivery, Outcome, bool], None]
"""``on_outcome(delivery, outcome, final)``: ``final`` is False when another delivery of the record was queued
(or the spout was closing); a final failure is the driver's to dead-letter."""


class ReplayingSpout:
    """Emits deliveries (due replays first, then fresh records) and schedules failed records for replay.

    ``cond`` guards the schedule and the count of unsettled deliveries; a driver
    may pass its own condition to wait on it for outcomes. ``on_outcome`` runs
    on the client spout's callback thread; a delivery counts as unsettled until
    it returns, so whoever sees :meth:`busy` turn False finds its effects done.
    """

    def __init__(
        self,
        cluster: ClusterClient,
        *,
        on_outcome: OnOutcome,
        name: str | None = None,
        max_pending: int = 1_000,
        policy: ReplayPolicy | None = None,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        backstop_clock: Callable[[], float] = time.monotonic,
        cond: threading.Condition | None = None,
    ) -> None:
        self.cond = cond or threading.Condition()
        self.schedule = ReplaySchedule(policy or ReplayPolicy(), clock)
        self._on_outcome = on_outcome
        self._unsettled = 0
        self._closing = False
        self.spout = Spout(
            cluster,
            on_ack=self._acked,
            on_fail=self._failed,
            name=name,
            max_pending=max_pending,
            timeout=timeout,
            clock=backstop_clock,
        )

    def start(self) -> ReplayingSpout:
        """Subscribe to the ackers' outcomes."""
        self.spout.start()
        return self

    def close(self) -> None:
        """Close the client spout: trees still pending end LOST, reported as not final and not replayed."""
        with self.cond:
            self._closing = True
        self.spout.close()

    @property
    def pending(self) -> int:
        """Trees in flight (what ``max_pending`` bounds)."""
        return self.spout.pending

    @property
    def unsettled(self) -> int:
        """Deliveries emitted whose ``on_outcome`` has not returned yet."""
        with self.cond:
            return self._unsettled

    def busy(self) -> bool:
        """True while a delivery is unsettled or a record waits for its replay."""
        with self.cond:
            return bool(self._unsettled) or not self.schedule.empty

    def take(self, limit: int | None, fresh: Callable[[], Delivery | None]) -> list[TrackedTuple]:
        """Emit up to ``limit`` deliveries (None: no limit): due replays first, then ``fresh()`` ones.

        Stops early when ``fresh()`` has nothing or ``max_pending`` trees are in
        flight; a delivery that could not be emitted goes out first next time.
        """
        emitted: list[TrackedTuple] = []
        while limit is None or len(emitted) < limit:
            with self.cond:
                delivery = self.schedule.pop_due()
            if delivery is None:
                delivery = fresh()
                if delivery is None:
                    break
            with self.cond:
                self._unsettled += 1  # before emit: the outcome may come at once
            tracked = self.spout.try_emit(delivery, delivery)
            if tracked is None:
                with self.cond:
                    self._unsettled -= 1
                    self.schedule.push_back(delivery)
                break
            emitted.append(tracked)
        return emitted

    def _acked(self, delivery: Delivery) -> None:
        self._settle(delivery, Outcome.ACKED, True)

    def _failed(self, delivery: Delivery, outcome: Outcome) -> None:
        with self.cond:
            # A tree cut short by close() is no failure of the record: neither replayed nor final.
            # Queued before on_outcome runs: a driver's error there must not lose the replay.
            final = not self._closing and not self.schedule.retry(delivery)
        self._settle(delivery, outcome, final)

    def _settle(self, delivery: Delivery, outcome: Outcome, final: bool) -> None:
        try:
            self._on_outcome(delivery, outcome, final)
        finally:
            with self.cond:
                self._unsettled -= 1
                self.cond.notify_all()
