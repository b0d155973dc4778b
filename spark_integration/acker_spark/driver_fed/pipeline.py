"""Driver side: a spout that feeds Spark in micro-batches and replays exactly the records that failed.

:class:`GuaranteedPipeline` pulls records from a source, starts one tuple tree
per record through the :class:`~acker_spark.driver_fed.replaying_spout.ReplayingSpout`
it shares with the streaming source, runs the user's job on an RDD
(or a DataFrame) of the batch's TrackedTuples, and receives each tree's
outcome. Failed, timed-out and lost records are delivered again as new trees
after an exponential backoff, up to ``max_attempts`` deliveries; then they go
to the dead-letter table. When a job raises, its records are not charged an
attempt: they are replayed in halves, each half a job of its own, until the
record that makes it raise runs alone (:mod:`acker_spark.driver_fed.isolation`); that
record's dead letter names the exception.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, Literal

from acker_client import AckerError, ClusterClient, MessageId, TrackedTuple, new_id
from acker_protocol.wire import Outcome

from ..budget import CauseTally, FailureBudget
from ..dead_letter import DeadLetter, DeadLetterStore
from ..job_errors import JobError, job_error
from ..replay_policy import ReplayPolicy
from ..run_report import AcksUndelivered, PipelineStats, RecordsFailed, ShardDown
from ..session import default_parallelism, spark_context_of
from ..shard_watch import ProgressLine, ShardWatch
from ..sources import Delivery, Record
from ..steps.executor import CommitErrors, tracked_bolts
from ..steps.frames import delivery_frame
from ..steps.step import CommitBaseline
from .isolation import Isolation
from .replaying_spout import ReplayingSpout

__all__ = [
    "AcksUndelivered",
    "RecordsFailed",
    "ShardDown",
    "PipelineStats",
    "GuaranteedPipeline",
    "run_untracked",
    "Job",
]

log = logging.getLogger(__name__)

Job = Callable[[Any], object]
"""``job(batch)``: runs the Spark actions that complete the work for one micro-batch.

``batch`` is an RDD of TrackedTuple[Delivery], or with ``as_dataframe=True`` a
DataFrame with columns ``key``, ``value``, ``attempt`` and ``_acker_ids``.
"""


class GuaranteedPipeline:
    """Runs a Spark job over a source with per-record tracking, replay and dead letters.

    Example (needs Spark and ackers)::

        pipeline = GuaranteedPipeline(spark, ClusterClient(addresses), dead_letters=DeadLetterStore(db))
        stats = pipeline.run(records, job)

    ``job(batch)`` must complete the work (run the actions) before it returns;
    the bolts inside it ack the trees. ``on_outcome(delivery, outcome)`` is called
    once per delivery from the spout's callback thread (``outcome`` is an
    :class:`~acker_protocol.wire.Outcome`: ACKED, FAILED, TIMED_OUT or LOST);
    ``on_outcomes(acked, failed)`` once per batch of outcomes, with the acked
    deliveries and ``(delivery, outcome)`` pairs for the others (either hook,
    or both, may be given); ``on_progress(stats)`` from the driver thread;
    ``on_dead_letter(letter)`` once per dead-lettered record, from the driver
    thread, with its reason, attempts and cause (the exception that convicted
    it, see :mod:`acker_spark.driver_fed.isolation`).
    Outcomes are counted, scheduled for replay and queued for the dead-letter
    table a batch at a time.

    ``policy`` decides per exception type (``ReplayPolicy.dead_letter_at_once``,
    ``retry_on``): a record convicted by a ``ValueError`` or failed with one as
    its reason is dead-lettered at once, a ``TimeoutError`` is replayed.
    ``budget`` (default ``FailureBudget()``: more than 5% of the records taken
    from the source, from 100 on, dead-lettered; None: no budget) is checked
    after every job (at most ``max_pending`` records): past it, ``run`` writes
    the dead letters due and raises :class:`~acker_spark.budget.BudgetExceeded`
    naming the top causes; the source is not read further.
    """

    def __init__(
        self,
        spark: Any,
        cluster: ClusterClient,
        *,
        name: str | None = None,
        max_pending: int = 1_000,
        batch_size: int | None = None,
        partitions: int | None = None,
        policy: ReplayPolicy = ReplayPolicy(),
        dead_letters: DeadLetterStore | None = None,
        spout_timeout: float | None = None,
        on_progress: Callable[[PipelineStats], None] | None = None,
        on_outcome: Callable[[Delivery, Outcome], None] | None = None,
        on_outcomes: Callable[[list[Delivery], list[tuple[Delivery, Outcome]]], None] | None = None,
        progress_interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        on_undelivered: Literal["raise", "warn"] = "raise",
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        on_job_error: Literal["raise", "warn"] = "raise",
        shard_down_after: float | None = 120.0,
        log_interval: float = 10.0,
        budget: FailureBudget | None = FailureBudget(),
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if on_undelivered not in ("raise", "warn"):
            raise ValueError(f'on_undelivered must be "raise" or "warn", got {on_undelivered!r}')
        self.on_undelivered = on_undelivered
        if on_job_error not in ("raise", "warn"):
            raise ValueError(f'on_job_error must be "raise" or "warn", got {on_job_error!r}')
        self.on_job_error = on_job_error
        # A shard unreachable this long stops the run (ShardDown) instead of a silent wait; None waits forever.
        self.shard_down_after = shard_down_after
        self._watch = ShardWatch(cluster, clock)
        self._progress = ProgressLine(log, self._watch, log_interval, clock)
        # None on Spark Connect: no RDDs and no accumulators there, DataFrame jobs only.
        self.sc = spark_context_of(spark)
        self._spark = spark if spark is not self.sc else None
        self.cluster = cluster
        # A fresh name per pipeline: outcomes retained for an earlier run's spout
        # must not be delivered to this one.
        self.name = name or f"acker-spark-{new_id():016x}"
        self.max_pending = max_pending
        self.batch_size = batch_size or max_pending
        self.partitions = partitions or default_parallelism(spark)
        self.policy = policy
        self.budget = budget
        self._dead_causes = CauseTally()  # the dead letters' causes by kind, for the budget's error
        self.dead_letters = dead_letters
        self.spout_timeout = spout_timeout
        self.on_progress = on_progress
        self.on_outcome = on_outcome
        self.on_outcomes = on_outcomes
        self.on_dead_letter = on_dead_letter
        self.progress_interval = progress_interval
        self.clock = clock
        self.stats = PipelineStats()
        self._cond = threading.Condition()
        self._spout: ReplayingSpout | None = None  # one per run
        self._dead: list[tuple[Delivery, Outcome]] = []  # written by the driver thread
        self._exhausted = False
        self._as_dataframe = False
        self._value_type: Any = None
        # Acks-undelivered bookkeeping (see _collect_commit_errors): the bolts' reports
        # when the run started, the deliveries whose acks were dropped, and the run's own report.
        self._baseline = CommitBaseline()
        self._undelivered: set[tuple[str, int]] = set()  # (key, attempt)
        self._errors: dict[str, CommitErrors] = {}
        self._dead_undelivered = 0  # records dead-lettered as ACKS_UNDELIVERED
        self._isolation = Isolation(policy, clock)  # guarded by _cond
        self._fail_reasons: dict[str, str] = {}  # key -> the reason its last collector.fail gave (driver thread)
        self._job_causes: dict[str, None] = {}  # causes of dead letters convicted by a job error, in order
        self._stopped: JobError | None = None  # the configuration error that stopped the run

    # -- the driver loop -------------------------------------------------------

    def run(
        self,
        source: Iterable[Record | tuple[str, Any]],
        job: Job,
        *,
        as_dataframe: bool = False,
        value_type: Any = None,
    ) -> PipelineStats:
        """Process every record of ``source`` until each is acked or dead-lettered; return the stats.

        ``as_dataframe=True`` hands ``job`` a DataFrame (``key``, ``value`` of
        ``value_type``, a Spark DataType defaulting to string, ``attempt``,
        ``_acker_ids``) instead of an RDD; its bolts use ``Bolt.apply_df``.
        """
        if self._exhausted or self.stats.attempts:
            raise RuntimeError("a GuaranteedPipeline runs once; create a new one for another source")
        if not as_dataframe and self.sc is None:
            raise TypeError("Spark Connect has no RDDs: run(source, job, as_dataframe=True) with DataFrame bolts")
        self._as_dataframe, self._value_type = as_dataframe, value_type
        self._baseline.start()
        spout = self._spout = ReplayingSpout(
            self.cluster,
            on_outcomes=self._on_outcomes,
            name=self.name,
            max_pending=self.max_pending,
            policy=self.policy,
            timeout=self.spout_timeout,
            clock=self.clock,
            backstop_clock=self.clock,
            cond=self._cond,
            isolation=self._isolation,
            cause_of=self._cause_of,
        )
        spout.start()
        self.cluster.add_error_listener(self._watch)
        try:
            records = iter(source)
            while True:
                self._check_shards()
                probe = self._take_probe(spout)
                if probe:
                    self._run_job(job, probe)
                    self._after_job()
                    continue
                batch = self._take_batch(spout, records)
                if batch:
                    self._run_job(job, batch)
                    self._after_job()
                    continue
                self._write_dead_letters()
                self._check_budget()
                if self._finished():
                    break
                self._log_progress()
                self._wait()
                self._report()
        finally:
            self.cluster.remove_error_listener(self._watch)
            spout.close()
        self._write_dead_letters()
        self._report()
        self._check_undelivered()
        self._check_job_errors()
        return self.stats

    def _after_job(self) -> None:
        """After each job (at most ``max_pending`` records): its final failures dead-lettered, the budget checked."""
        self._write_dead_letters()
        self._check_budget()
        self._report()

    def _check_budget(self) -> None:
        """Stop the run (:class:`~acker_spark.budget.BudgetExceeded`) once its dead letters pass the budget."""
        if self.budget is None or self._stopped is not None:
            return  # a run stopped on a misconfiguration says so itself (RecordsFailed)
        stats = self.snapshot()
        # Records whose acks could not be delivered are the ackers' reachability, not the records':
        # AcksUndelivered and ShardDown report those.
        dead = stats.dead_lettered - self._dead_undelivered
        if self.budget.exceeded(dead, stats.emitted):
            error = self.budget.error(dead, stats.emitted, self._dead_causes.top())
            error.stats = stats
            raise error

    def _check_shards(self) -> None:
        """Raise ShardDown if a shard has been unreachable longer than ``shard_down_after``."""
        if self.shard_down_after is None:
            return
        down = self._watch.down_longer_than(self.shard_down_after)
        if down is not None:
            raise ShardDown(*down, self.snapshot())

    def _log_progress(self) -> None:
        """While the driver waits: one INFO line per ``log_interval`` with the counts and any shard it waits on."""
        self._progress.tick(self.snapshot)

    def _check_job_errors(self) -> None:
        """Raise (or warn) if records were dead-lettered because a job raised, or the run stopped on a misconfiguration."""
        if not self._job_causes and self._stopped is None:
            return
        error = RecordsFailed(self.snapshot(), list(self._job_causes), self._stopped)
        if self.on_job_error == "raise" or self._stopped is not None:
            raise error
        log.warning("%s", error)

    def _check_undelivered(self) -> None:
        """Raise (or warn) if a record was dead-lettered because its acks could not be delivered.

        Deliveries that failed so but were acked on a replay (a short outage) are
        in the stats and the log only: the run did its work.
        """
        if not self.stats.acks_undelivered:
            return
        error = AcksUndelivered(self.snapshot(), dict(self._errors))
        if self._dead_undelivered and self.on_undelivered == "raise":
            raise error
        log.warning("%s", error)

    def _take_batch(self, spout: ReplayingSpout, records: Iterator[Any]) -> list[TrackedTuple]:
        room = min(self.batch_size, self.max_pending - spout.pending)
        batch = spout.take(room, lambda: self._fresh(records))
        for tracked in batch:
            self._count_delivery(tracked.value)
        return batch

    def _take_probe(self, spout: ReplayingSpout) -> list[TrackedTuple]:
        """The next isolation probe, emitted alone (its deliveries are replays with no attempt charged)."""
        with self._cond:
            probe = self._isolation.pop_probe(self.max_pending - spout.pending)
        if not probe:
            return []
        emitted, rest = spout.emit_exactly(probe)
        with self._cond:
            self._isolation.push_back(rest)
        for tracked in emitted:
            self._count_delivery(tracked.value, probe=True)
        return emitted

    def _fresh(self, records: Iterator[Any]) -> Delivery | None:
        """The first delivery of the source's next record, or None once it is exhausted."""
        if self._exhausted:
            return None
        try:
            key, value = next(records)
        except StopIteration:
            self._exhausted = True
            return None
        return Delivery(str(key), value, 1)

    def _count_delivery(self, delivery: Delivery, *, probe: bool = False) -> None:
        with self._cond:
            self.stats.attempts += 1
            if delivery.attempt == 1 and not probe:
                self.stats.emitted += 1
            else:
                self.stats.replayed += 1
                self.stats.replayed_keys.add(delivery.key)

    def _run_job(self, job: Job, batch: list[TrackedTuple]) -> None:
        deliveries = [t.value for t in batch]
        with self._cond:
            self._isolation.job_started(deliveries)
        try:
            job(self._batch_input(batch))
        except Exception as err:  # noqa: BLE001 - any job failure is handled the same way
            # Spark gave up on a task (it failed on every retry). Trees the job
            # did finish stay acked; failing the rest now replays them without
            # waiting for their timeout.
            error = job_error(err)
            if error.configuration:
                self._stop(batch, error)
                return
            log.warning(
                "Spark job over %d records failed, replaying its unfinished records%s: %s",
                len(batch),
                " in halves" if len(batch) > 1 else " alone",
                error,
            )
            with self._cond:
                self.stats.job_errors += 1
                # Before the trees are failed: their outcomes must find them suspects.
                self._isolation.job_failed(deliveries, error)
                self._dead.extend(self._isolation.take_final())
            self._fail_trees(batch)
            self._collect_fail_reasons(batch)
        else:
            # The bolts' reasons before the failures held meanwhile are charged: a reason the
            # policy dead-letters at once (a ValueError) must not be replayed.
            self._collect_fail_reasons(batch)
            self._charge_held(deliveries)
        self._collect_commit_errors(batch)
        with self._cond:
            self.stats.jobs += 1

    def _stop(self, batch: list[TrackedTuple], error: JobError) -> None:
        """A job failed on a misconfiguration: stop reading and replaying; every unfinished record is dead-lettered."""
        log.error("Spark job failed on a misconfiguration, stopping the run: %s", error)
        spout = self._spout
        assert spout is not None
        with self._cond:
            self.stats.job_errors += 1
            self._stopped = error
            self._exhausted = True  # the source is not read further
            held = self._isolation.abort(error) + spout.schedule.drain()
            self._dead.extend((d, Outcome.FAILED) for d in held)
            self._cond.notify_all()
        self._fail_trees(batch)

    def _charge_held(self, deliveries: list[Delivery]) -> None:
        """The job returned: failures held while it ran (timeouts) are charged and replayed as usual."""
        spout = self._spout
        assert spout is not None
        with self._cond:
            held = self._isolation.job_succeeded(deliveries)
            if held:
                finals = spout.charge(held)
                self._dead.extend(failure for failure, final in zip(held, finals) if final)
                self._cond.notify_all()

    def _collect_fail_reasons(self, batch: list[TrackedTuple]) -> None:
        """Remember the reasons bolts gave ``collector.fail(t, reason)`` for this batch's trees (dead-letter causes)."""
        reasons: dict[int, str] = {}
        for bolt in tracked_bolts():
            reasons.update(bolt.reasons())
        if not reasons:
            return
        with self._cond:  # read by the spout's thread (_cause_of)
            for tracked in batch:
                for root in tracked.message_id.roots:
                    reason = reasons.get(root)
                    if reason is not None:
                        self._fail_reasons[tracked.value.key] = reason
                        break

    def _cause_of(self, delivery: Delivery, outcome: Outcome) -> str | None:
        """The reason a bolt gave for failing ``delivery`` (``_cond`` held): the policy decides on it."""
        return self._fail_reasons.get(delivery.key) if outcome is Outcome.FAILED else None

    def _collect_commit_errors(self, batch: list[TrackedTuple]) -> None:
        """Read the bolts' commit reports (Spark accumulators, complete once the job's actions returned)."""
        fresh = self._baseline.since()  # this run's share only: a bolt may have run before
        if not fresh:
            return
        roots = frozenset().union(*(r.roots for r in fresh.values()))
        with self._cond:
            first = not self._errors
            self._errors = fresh
            self.stats.commit_errors = {name: r.errors for name, r in fresh.items()}
            for tracked in batch:
                if not roots.isdisjoint(tracked.message_id.roots):
                    self._undelivered.add((tracked.value.key, tracked.value.attempt))
        if first:
            # The driver's log, at once: the executors' warnings may be on other machines.
            causes = sorted({c for r in fresh.values() for c in r.causes})
            log.warning(
                "executors could not deliver acks of bolts %s: %s; the affected records will fail as ACKS_UNDELIVERED",
                ", ".join(sorted(fresh)),
                "; ".join(causes),
            )

    def _batch_input(self, batch: list[TrackedTuple]) -> Any:
        """The micro-batch as the job receives it: an RDD of TrackedTuples, or a tracked DataFrame."""
        if self._as_dataframe:
            return delivery_frame(self._session(), batch, self.partitions, self._value_type)
        return self.sc.parallelize(batch, min(self.partitions, len(batch)))

    def _session(self) -> Any:
        if self._spark is None:
            self._spark = _session_of(self.sc)
        return self._spark

    def _fail_trees(self, batch: list[TrackedTuple]) -> None:
        for tracked in batch:
            for root in tracked.message_id.roots:
                self.cluster.fail(root)
        try:
            self.cluster.flush()
        except AckerError as err:
            # The spout's backstop reports these trees as lost: still replayed.
            log.warning("could not fail the trees of a failed job: %s", err)

    def _finished(self) -> bool:
        with self._cond:
            busy = self._spout is not None and self._spout.busy()
            return self._exhausted and not busy and not self._dead

    def _wait(self) -> None:
        with self._cond:
            timeout = self.progress_interval
            due = self._spout.schedule.next_due() if self._spout is not None else None
            probe = self._isolation.next_due()
            if probe is not None:
                due = probe if due is None else min(due, probe)
            if due is not None:
                timeout = max(0.0, min(timeout, due - self.clock()))
            self._cond.wait(timeout)

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.snapshot())

    def snapshot(self) -> PipelineStats:
        """A consistent copy of the stats, with ``pending`` and ``awaiting_replay`` filled in."""
        with self._cond:
            spout = self._spout
            self.stats.pending = spout.unsettled if spout is not None else 0
            self.stats.awaiting_replay = (spout.schedule.waiting if spout is not None else 0) + len(self._dead)
            return replace(self.stats, replayed_keys=set(self.stats.replayed_keys))

    # -- outcomes (the spout's callback thread) ----------------------------------

    def _on_outcomes(self, acked: list[Delivery], failed: list[tuple[Delivery, Outcome, bool]]) -> None:
        """Count a batch of outcomes, queue its final failures for the dead-letter table, call the user's hooks."""
        with self._cond:
            stats = self.stats
            stats.acked += len(acked)
            # A timeout or loss of a delivery whose acks a bolt could not deliver is
            # reported as what it is, to the stats, the callbacks and the dead letters.
            failed = [(d, self._reason(d, o), final) for d, o, final in failed]
            for delivery, outcome, final in failed:
                if outcome is Outcome.FAILED:
                    stats.failed += 1
                elif outcome in (Outcome.TIMED_OUT, Outcome.LIFETIME_EXCEEDED):  # the cap is a timeout too
                    stats.timed_out += 1
                elif outcome is Outcome.ACKS_UNDELIVERED:
                    stats.acks_undelivered += 1
                else:
                    stats.lost += 1
                if final:
                    self._dead.append((delivery, outcome))
            self._cond.notify_all()
        if self.on_outcome is not None:
            calls = [(d, Outcome.ACKED) for d in acked] + [(d, o) for d, o, _ in failed]
            for delivery, outcome in calls:
                try:
                    self.on_outcome(delivery, outcome)
                except Exception:  # one delivery's hook error must not skip the others'
                    log.exception("on_outcome for %r (%s) raised", delivery.key, outcome.name)
        if self.on_outcomes is not None:
            self.on_outcomes(acked, [(d, o) for d, o, _ in failed])

    def _reason(self, delivery: Delivery, outcome: Outcome) -> Outcome:
        """ACKS_UNDELIVERED for a timeout or loss of a delivery whose acks a bolt could not deliver (lock held)."""
        if outcome in (Outcome.TIMED_OUT, Outcome.LOST):
            try:
                self._undelivered.remove((delivery.key, delivery.attempt))
            except KeyError:
                return outcome
            return Outcome.ACKS_UNDELIVERED
        return outcome

    def _late_reason(self, delivery: Delivery, reason: Outcome) -> Outcome:
        """The dead letter's reason, counted anew if a bolt's report came after the outcome (the job had not returned)."""
        if reason not in (Outcome.TIMED_OUT, Outcome.LOST):
            return reason
        with self._cond:
            late = self._reason(delivery, reason)
            if late is not reason:
                if reason is Outcome.TIMED_OUT:
                    self.stats.timed_out -= 1
                else:
                    self.stats.lost -= 1
                self.stats.acks_undelivered += 1
        return late

    def _write_dead_letters(self) -> None:
        with self._cond:
            dead, self._dead = self._dead, []
        if not dead:
            return
        dead = [(delivery, self._late_reason(delivery, reason)) for delivery, reason in dead]
        self._dead_undelivered += sum(1 for _, reason in dead if reason is Outcome.ACKS_UNDELIVERED)
        with self._cond:
            errors = [self._isolation.error_of(d.key) for d, _ in dead]
        at = time.time()
        # A record convicted by a job error failed: its tree may have timed out first, while Spark retried the task.
        letters = [
            DeadLetter(
                d.key,
                d.value,
                reason if error is None else Outcome.FAILED,
                d.attempt,
                at,
                self._cause(d, reason, error),
            )
            for (d, reason), error in zip(dead, errors)
        ]
        if self.dead_letters is not None:
            self.dead_letters.add_letters(letters)  # one transaction for the batch
        else:
            for letter in letters:
                log.error(
                    "record %s failed %d times (last: %s%s); no dead-letter store",
                    letter.key,
                    letter.attempts,
                    letter.reason.name,
                    f", {letter.cause}" if letter.cause else "",
                )
        with self._cond:
            self.stats.dead_lettered += len(dead)
        for letter in letters:
            if letter.reason is not Outcome.ACKS_UNDELIVERED:
                self._dead_causes.add(letter.key, letter.cause)
        if self.on_dead_letter is not None:
            for letter in letters:
                try:
                    self.on_dead_letter(letter)
                except Exception:  # one record's hook error must not skip the others'
                    log.exception("on_dead_letter for %r raised", letter.key)

    def _cause(self, delivery: Delivery, reason: Outcome, error: JobError | None) -> str | None:
        """The dead letter's cause: the job error that convicted the record, or the reason its bolt failed it."""
        if error is not None:
            self._job_causes[str(error)] = None
            return str(error)
        if reason is Outcome.FAILED:
            return self._fail_reasons.get(delivery.key)
        return None


def run_untracked(
    spark: Any,
    source: Iterable[Record | tuple[str, Any]],
    job: Job,
    *,
    batch_size: int = 1_000,
    partitions: int | None = None,
    on_progress: Callable[[PipelineStats], None] | None = None,
    as_dataframe: bool = False,
    value_type: Any = None,
) -> PipelineStats:
    """Run the same micro-batches with no acker: no outcomes, no replay (the overhead baseline).

    A job error propagates: without tracking nothing could replay the batch.
    ``as_dataframe`` and ``value_type`` are as in :meth:`GuaranteedPipeline.run`.
    """
    sc = spark_context_of(spark)
    if not as_dataframe and sc is None:
        raise TypeError("Spark Connect has no RDDs: run_untracked(..., as_dataframe=True) with DataFrame bolts")
    slices = partitions or default_parallelism(spark)
    stats = PipelineStats()
    records = iter(source)
    while True:
        batch = [
            TrackedTuple(Delivery(str(k), v, 1), MessageId.EMPTY) for k, v in itertools.islice(records, batch_size)
        ]
        if not batch:
            return stats
        if as_dataframe:
            session = spark if spark is not sc else _session_of(sc)
            job(delivery_frame(session, batch, slices, value_type))
        else:
            job(sc.parallelize(batch, min(slices, len(batch))))
        stats.emitted += len(batch)
        stats.attempts += len(batch)
        stats.acked += len(batch)
        stats.jobs += 1
        if on_progress is not None:
            on_progress(stats)


def _session_of(sc: Any) -> Any:
    """The SparkSession over ``sc`` (for callers that passed a SparkContext): the active one, or a new one."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext is sc:
        return active
    return SparkSession(sc)
