"""The replaying spout behind both drivers: the batch pipeline and the Structured Streaming source.

:class:`ReplayingSpout` emits :class:`~acker_spark.sources.Delivery` values as
tuple trees through :class:`acker_client.Spout`, a batch at a time
(``Spout.try_emit_many``). The delivery itself is the message id, so the
client spout's pending map is the only one. When a tree fails, times out or
is lost, the next delivery of its record is queued after the policy's backoff,
until ``max_attempts`` deliveries were made. Outcomes arrive from the client
spout a batch at a time (``on_outcomes``) and are scheduled for replay in one
step; the driver learns them per delivery through ``on_outcome(delivery,
outcome, final)`` or per batch through ``on_outcomes(acked, failed)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from acker_client import ClusterClient, Spout, TrackedTuple
from acker_protocol.wire import Outcome

from ..replay_policy import ReplayPolicy
from ..sources import Delivery
from .isolation import Isolation, Verdict
from .replays import ReplaySchedule

__all__ = ["ReplayingSpout", "OnOutcome", "OnOutcomes"]

log = logging.getLogger(__name__)

OnOutcome = Callable[[Delivery, Outcome, bool], None]
"""``on_outcome(delivery, outcome, final)``: ``final`` is False when another delivery of the record was queued
(or the spout was closing); a final failure is the driver's to dead-letter."""

OnOutcomes = Callable[[list[Delivery], list[tuple[Delivery, Outcome, bool]]], None]
"""``on_outcomes(acked, failed)``: the deliveries whose tree completed (final), and ``(delivery, reason,
final)`` for the rest, ``final`` as in :data:`OnOutcome`. One call per batch of outcomes."""


class ReplayingSpout:
    """Emits deliveries (due replays first, then fresh records) and schedules failed records for replay.

    ``cond`` guards the schedule and the count of unsettled deliveries; a driver
    may pass its own condition to wait on it for outcomes. Give ``on_outcome``
    (per delivery) or ``on_outcomes`` (per batch); it runs on the client
    spout's callback thread, and a delivery counts as unsettled until it
    returns, so whoever sees :meth:`busy` turn False finds its effects done.

    ``isolation`` (an :class:`~acker_spark.driver_fed.isolation.Isolation` guarded by
    ``cond``) sees every delivery emitted and every outcome first: the failed
    deliveries it holds as suspects are not scheduled here (no attempt is
    charged); the driver emits its probes with :meth:`emit_exactly`.

    ``cause_of(delivery, outcome)`` (called with ``cond`` held) gives the cause a
    bolt reported for a failed delivery, if any: a cause the policy dead-letters
    at once (``ReplayPolicy.retries``) makes the failure final without a replay.
    """

    def __init__(
        self,
        cluster: ClusterClient,
        *,
        on_outcome: OnOutcome | None = None,
        on_outcomes: OnOutcomes | None = None,
        name: str | None = None,
        max_pending: int = 1_000,
        policy: ReplayPolicy | None = None,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        backstop_clock: Callable[[], float] = time.monotonic,
        cond: threading.Condition | None = None,
        isolation: Isolation | None = None,
        cause_of: Callable[[Delivery, Outcome], str | None] | None = None,
    ) -> None:
        if (on_outcome is None) == (on_outcomes is None):
            raise ValueError("give exactly one of on_outcome (per delivery) and on_outcomes (per batch)")
        self.cond = cond or threading.Condition()
        self.schedule = ReplaySchedule(policy or ReplayPolicy(), clock)
        self._on_outcome = on_outcome
        self._on_outcomes = on_outcomes
        self._unsettled = 0
        self._closing = False
        self.isolation = isolation
        self.cause_of = cause_of
        self.spout = Spout(
            cluster,
            on_outcomes=self._take_outcomes,
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
        """Deliveries emitted whose outcome callback (``on_outcome`` / ``on_outcomes``) has not returned yet."""
        with self.cond:
            return self._unsettled

    def busy(self) -> bool:
        """True while a delivery is unsettled or a record waits for its replay."""
        with self.cond:
            held = self.isolation is not None and self.isolation.busy
            return bool(self._unsettled) or not self.schedule.empty or held

    def take(self, limit: int | None, fresh: Callable[[], Delivery | None]) -> list[TrackedTuple]:
        """Emit up to ``limit`` deliveries (None: no limit): due replays first, then ``fresh()`` ones.

        Takes no more than fit under ``max_pending`` now, and emits them in one
        batch. A delivery that could not be emitted goes out first next time.
        """
        room = self.spout.max_pending - self.spout.pending  # only outcomes change it meanwhile: it only grows
        if limit is not None:
            room = min(room, limit)
        if room <= 0:
            return []
        with self.cond:
            deliveries = self.schedule.pop_due_many(room)
        while len(deliveries) < room:
            delivery = fresh()  # the driver's code: called without the lock
            if delivery is None:
                break
            deliveries.append(delivery)
        if not deliveries:
            return []
        emitted, rest = self._emit(deliveries)
        if rest:
            with self.cond:
                self.schedule.push_back_many(rest)
        return emitted

    def emit_exactly(self, deliveries: list[Delivery]) -> tuple[list[TrackedTuple], list[Delivery]]:
        """Emit these deliveries (an isolation probe) as they are: ``(emitted, not emitted)``, nothing scheduled."""
        return self._emit(deliveries)

    def _emit(self, deliveries: list[Delivery]) -> tuple[list[TrackedTuple], list[Delivery]]:
        with self.cond:
            self._unsettled += len(deliveries)  # before emit: the outcomes may come at once
            if self.isolation is not None:
                self.isolation.emitted(deliveries)
        try:
            emitted = self.spout.try_emit_many(deliveries, deliveries)
        except BaseException:
            self._withdraw(deliveries)
            with self.cond:
                self.schedule.push_back_many(deliveries)
            raise
        rest = deliveries[len(emitted) :]
        if rest:
            self._withdraw(rest)
        return emitted, rest

    def _withdraw(self, deliveries: list[Delivery]) -> None:
        """Deliveries taken but not emitted: no longer unsettled."""
        with self.cond:
            self._unsettled -= len(deliveries)
            if self.isolation is not None:
                self.isolation.withdrawn(deliveries)
            self.cond.notify_all()

    def _take_outcomes(self, acked: list[Any], failed: list[tuple[Any, Outcome]]) -> None:
        """A batch of outcomes from the client spout: queue the replays, then tell the driver."""
        with self.cond:
            # A tree cut short by close() is no failure of the record: neither replayed nor final.
            # Queued before the driver's callback runs: an error there must not lose the replay.
            if self._closing:
                finals = [False] * len(failed)
            else:
                finals = self._triage(acked, failed)
        failures = [(delivery, reason, final) for (delivery, reason), final in zip(failed, finals)]
        try:
            if self._on_outcomes is not None:
                self._on_outcomes(acked, failures)
            else:
                self._each(acked, failures)
        finally:
            with self.cond:
                self._unsettled -= len(acked) + len(failed)
                self.cond.notify_all()

    def _triage(self, acked: list[Delivery], failed: list[tuple[Delivery, Outcome]]) -> list[bool]:
        """Whether each failure is final: the isolation's verdict for its suspects, the schedule's for the rest."""
        if self.isolation is None:
            return [not queued for queued in self._retry(failed)]
        verdicts = self.isolation.settle(acked, failed)
        mine = [f for f, v in zip(failed, verdicts) if v is Verdict.NOT_MINE]
        queued = iter(self._retry(mine))
        return [not next(queued) if v is Verdict.NOT_MINE else bool(v) for v in verdicts]

    def charge(self, failed: list[tuple[Delivery, Outcome]]) -> list[bool]:
        """Schedule the replays of failures the isolation held and handed back (caller holds ``cond``); True: final."""
        return [not queued for queued in self._retry(failed)]

    def _retry(self, failed: list[tuple[Delivery, Outcome]]) -> list[bool]:
        """Queue the replays of ``(delivery, reason)`` failures, each with its cause if one is known."""
        deliveries = [d for d, _ in failed]
        if self.cause_of is None:
            return self.schedule.retry_many(deliveries)
        return self.schedule.retry_many(deliveries, [self.cause_of(d, o) for d, o in failed])

    def _each(self, acked: list[Delivery], failures: list[tuple[Delivery, Outcome, bool]]) -> None:
        """The per-delivery callback for every delivery of the batch; one's error does not skip the others."""
        on_outcome = self._on_outcome
        assert on_outcome is not None
        calls = [(d, Outcome.ACKED, True) for d in acked] + failures
        for delivery, outcome, final in calls:
            try:
                on_outcome(delivery, outcome, final)
            except Exception:
                log.exception("on_outcome for %r (%s) raised", delivery.key, outcome.name)
