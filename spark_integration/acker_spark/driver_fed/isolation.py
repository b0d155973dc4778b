"""Poison isolation: find the record whose processing raises by replaying a failed job's records in halves.

When a Spark job over a micro-batch raises (one of its tasks failed on every
retry), any of the records it held may be the poison and the others are
innocent. Charging each of them an attempt would dead-letter the innocent
along with the poison once ``max_attempts`` is spent. :class:`Isolation`
instead takes the failed deliveries of such a job over (the *suspects*) and
hands them back as two halves (*probes*), each to run as a job of its own,
with no attempt counted. A half whose job succeeds is acked; a half whose job
raises again is split again. A record whose job raises while it runs alone is
*convicted*: that failure is charged (one attempt) and it is replayed alone,
after the policy's backoff, until ``max_attempts`` deliveries were made; then
its failure is final and carries the job's :class:`~acker_spark.job_errors.JobError`;
a convict whose exception the policy dead-letters at once (``ValueError`` and the
other poison types, or any type outside ``retry_on``) is final on its first conviction.

A job that raises may take longer than the acker's message timeout (Spark
retries the failing task first), so its trees can time out before it ends.
The failures of deliveries whose job is still running are therefore held
until it ends: they become suspects if it raises, and are handed back to the
caller to charge as usual (:meth:`Isolation.job_succeeded`) if it does not.

A poison record among ``n`` costs about ``2 log2(n)`` extra jobs plus its own
``max_attempts`` runs; the ``n - 1`` others are acked.

Pure bookkeeping (no Spark, no gRPC, the clock injected), shared by every
driver that runs jobs over batches of :class:`~acker_spark.sources.Delivery`.
Not thread-safe: the caller holds its lock around every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..job_errors import JobError
from ..replay_policy import ReplayPolicy
from ..sources import Delivery

__all__ = ["Isolation", "Verdict", "Failure"]

_Id = tuple[str, int]  # (key, attempt): one delivery
Failure = tuple[Delivery, Any]
"""``(delivery, reason)``: a failed delivery and the caller's reason (an Outcome), held and handed back as given."""


class Verdict:
    """What :meth:`Isolation.settle` decided for one failed delivery."""

    NOT_MINE = None  # not a suspect: the caller's replay schedule decides (an attempt is charged)
    HELD = False  # taken over: it comes back from :meth:`Isolation.pop_probe`, not final
    FINAL = True  # convicted with no attempt left: dead-letter it


@dataclass
class _Group:
    """The suspects of one failed job: outcomes still to come, and the deliveries that failed."""

    error: JobError
    outstanding: set[_Id]
    failed: list[Delivery] = field(default_factory=list)


class Isolation:
    """The suspects of failed jobs, the probes to run next and the convicted records' causes.

    The caller reports every delivery it emits (:meth:`emitted`), every job
    it starts (:meth:`job_started`) and how it ended (:meth:`job_failed`,
    :meth:`job_succeeded`), and every outcome (:meth:`settle`), and runs each
    batch :meth:`pop_probe` returns as a job of its own.
    """

    def __init__(self, policy: ReplayPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.clock = clock
        self._inflight: set[_Id] = set()  # emitted, outcome not yet settled
        self._groups: dict[_Id, _Group] = {}  # suspect -> its failed job's group
        self._convicted: dict[_Id, JobError] = {}  # ran alone, its job raised: outcome awaited
        self._probes: list[tuple[float, int, list[Delivery]]] = []  # heap by due time
        self._seq = itertools.count()
        self._errors: dict[str, JobError] = {}  # key -> the last job error that convicted it
        self._final: list[Failure] = []  # convicted, out of attempts, settled outside settle(): see take_final
        self._aborted: JobError | None = None  # see abort()
        self._running: set[_Id] = set()  # deliveries of jobs not ended yet
        self._early: dict[_Id, Failure] = {}  # ... that failed meanwhile (a timeout): held until the job ends

    # -- what the caller reports ---------------------------------------------

    def emitted(self, deliveries: Sequence[Delivery]) -> None:
        """Deliveries about to be emitted (before their outcome can arrive)."""
        self._inflight.update((d.key, d.attempt) for d in deliveries)

    def withdrawn(self, deliveries: Sequence[Delivery]) -> None:
        """Deliveries reported by :meth:`emitted` that were not emitted after all."""
        self._inflight.difference_update((d.key, d.attempt) for d in deliveries)

    def job_started(self, deliveries: Sequence[Delivery]) -> None:
        """A job over ``deliveries`` starts: their failures are held until it ends."""
        self._running.update((d.key, d.attempt) for d in deliveries)

    def job_succeeded(self, deliveries: Sequence[Delivery]) -> list[Failure]:
        """The job over ``deliveries`` returned: the failures held meanwhile, for the caller to charge as usual."""
        ids = [(d.key, d.attempt) for d in deliveries]
        self._running.difference_update(ids)
        return [self._early.pop(i) for i in ids if i in self._early]

    def job_failed(self, deliveries: Sequence[Delivery], error: JobError) -> None:
        """A job over ``deliveries`` raised ``error``: its unacked deliveries become suspects (or convicted, if alone)."""
        if self._aborted is not None:
            self.job_succeeded(deliveries)  # nothing more to learn: their failures are final anyway
            return
        ids = [(d.key, d.attempt) for d in deliveries]
        self._running.difference_update(ids)
        early = [self._early.pop(i) for i in ids if i in self._early]
        unsettled = {i for i in ids if i in self._inflight and i not in self._groups}
        if len(ids) == 1:
            # Alone in its job: no other record can be blamed.
            if unsettled:
                self._convicted[ids[0]] = error
            for failure in early:  # it failed (timed out) before the job raised: charge it now
                if self._charge(failure, error) is Verdict.FINAL:
                    self._final.append(failure)
            return
        group = _Group(error, unsettled, [d for d, _ in early])
        for i in unsettled:
            self._groups[i] = group
        if not unsettled:
            self._split(group)

    def abort(self, error: JobError) -> list[Delivery]:
        """Stop replaying (a configuration error no replay cures): every failure from now on is final with ``error``.

        Returns the deliveries held here (probes not run, suspects' and held
        failures) for the caller to dead-letter; outcomes still awaited will
        be final when they come.
        """
        self._aborted = error
        held = [d for _, _, probe in self._probes for d in probe]
        held += [d for d, _ in self._early.values()]
        held += [d for group in {id(g): g for g in self._groups.values()}.values() for d in group.failed]
        self._probes.clear()
        self._early.clear()
        for group in self._groups.values():
            group.failed.clear()
        for d in held:
            self._errors[d.key] = error
        return held

    def settle(self, acked: Sequence[Delivery], failed: Sequence[Failure]) -> list[bool | None]:
        """A batch of outcomes: the :class:`Verdict` for each of ``failed`` (acked ones need none)."""
        for d in acked:
            i = (d.key, d.attempt)
            self._inflight.discard(i)
            self._convicted.pop(i, None)  # it passed after all (the failure was transient)
            self._errors.pop(d.key, None)
            group = self._groups.pop(i, None)
            if group is not None:
                self._resolve(group, i, None)
        return [self._verdict_on_failure(d) for d in failed]

    def _verdict_on_failure(self, failure: Failure) -> bool | None:
        d = failure[0]
        i = (d.key, d.attempt)
        self._inflight.discard(i)
        if self._aborted is not None:
            self._groups.pop(i, None)
            self._convicted.pop(i, None)
            self._errors[d.key] = self._errors.get(d.key, self._aborted)
            return Verdict.FINAL
        group = self._groups.pop(i, None)
        if group is not None:
            self._resolve(group, i, d)
            return Verdict.HELD
        if i in self._running:
            self._early[i] = failure
            return Verdict.HELD
        error = self._convicted.pop(i, None)
        if error is None:
            return Verdict.NOT_MINE
        return self._charge(failure, error)

    def _charge(self, failure: Failure, error: JobError) -> bool:
        """A convicted record's failure: one attempt charged, replayed alone after the backoff or final."""
        d = failure[0]
        self._errors[d.key] = error
        if d.attempt >= self.policy.max_attempts or not self.policy.retries(str(error)):
            return Verdict.FINAL  # out of attempts, or an exception the policy dead-letters at once (poison)
        # Alone again: a convicted record must not poison another batch.
        due = self.clock() + self.policy.delay(d.attempt)
        heapq.heappush(self._probes, (due, next(self._seq), [d._replace(attempt=d.attempt + 1)]))
        return Verdict.HELD

    def _resolve(self, group: _Group, i: _Id, failed: Delivery | None) -> None:
        group.outstanding.discard(i)
        if failed is not None:
            group.failed.append(failed)
        if not group.outstanding:
            self._split(group)

    def _split(self, group: _Group) -> None:
        """Every suspect of ``group`` has its outcome: the failed ones go back in two halves, due now."""
        # Sorted by key: the same halves for the same records, so a run can be reproduced.
        rest = sorted(group.failed, key=lambda d: d.key)
        half = (len(rest) + 1) // 2
        now = self.clock()
        for part in (rest[:half], rest[half:]):
            if part:
                heapq.heappush(self._probes, (now, next(self._seq), part))

    # -- what the caller runs ---------------------------------------------------

    def pop_probe(self, room: int) -> list[Delivery]:
        """The next due probe if it has at most ``room`` deliveries (run it as a job of its own), else []."""
        if not self._probes or self._probes[0][0] > self.clock() or len(self._probes[0][2]) > room:
            return []
        return heapq.heappop(self._probes)[2]

    def push_back(self, deliveries: Sequence[Delivery]) -> None:
        """A probe (or part of one) that could not be emitted: it is due again at once."""
        if deliveries:
            heapq.heappush(self._probes, (self.clock(), next(self._seq), list(deliveries)))

    def next_due(self) -> float | None:
        """When the earliest probe is due (clock time), or None."""
        return self._probes[0][0] if self._probes else None

    def take_final(self) -> list[Failure]:
        """Final failures decided outside :meth:`settle` (a convict that timed out before its job raised), once."""
        final, self._final = self._final, []
        return final

    def error_of(self, key: str) -> JobError | None:
        """The job error that convicted record ``key``, if it was convicted (and not acked since)."""
        return self._errors.get(key)

    @property
    def busy(self) -> bool:
        """True while a probe waits to run or a suspect's or convict's outcome is awaited."""
        return bool(self._probes or self._groups or self._convicted or self._early)
