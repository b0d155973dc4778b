"""What stops a SourcePipeline run, or one of its rounds, instead of letting it wait or fail for ever.

:class:`RunGuards` holds the driver's guards in one place:

- the shard watch (:class:`~acker_spark.executor_read.shard_watch.ShardWatch`): a shard
  unreachable longer than ``shard_down_after`` stops the run with
  :class:`~acker_spark.run_report.ShardDown`, between rounds and while a
  round's job rides the outage out; after a failed job every shard is probed;
- Spark jobs failing in a row more than ``policy.max_attempts`` times stop the
  run (:class:`~acker_spark.run_report.RunStopped`): the job is broken, not unlucky;
- the failure budget (:class:`~acker_spark.budget.FailureBudget`), between
  rounds and while a round's job runs (its Spark job group is cancelled);
- the stall check: a successful job none of whose trees ever settled emitted
  rows that nothing acks (unless an outcome stream broke while the job ran:
  an acker that went down may have taken the trees with it, and they end at
  the backstop);
- a hung round (:mod:`~acker_spark.executor_read.hung_round`): every tree ended,
  the job runs on.

:meth:`RunGuards.round_watch` assembles the checks watched while a round's job
runs (:class:`~acker_spark.executor_read.round_watch.RoundWatch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acker_client import ClusterClient, ShardUnavailable

from ..budget import BudgetExceeded
from ..job_errors import JobError, job_error
from ..round_stop import clear_stop, request_stop
from ..run_report import RunStopped, ShardDown, SourceStats
from ..tracking.book import PayloadReader, ReplayBook
from ..tracking.emission_log import RoundFilter
from ..tracking.round_tally import RoundTally
from .hung_round import HungRoundCheck
from .job_group import JobGroup
from .pipeline_options import PipelineOptions
from .round_watch import Check, RoundWatch
from .shard_watch import DownTooLong, ShardWatch

__all__ = ["RoundGuard", "RunGuards"]

Stats = Callable[[], SourceStats]
"""The run's stats, filled from the book now (an error carries them)."""


@dataclass
class RoundGuard:
    """A round's job group, the watch over its job, the budget's tally of it and its hung-round check."""

    group: JobGroup
    watch: RoundWatch
    tally: RoundTally | None
    hung: HungRoundCheck | None
    feed: Any

    def close(self) -> None:
        """The job returned: the hung-round check stops observing the outcome feed."""
        if self.hung is not None:
            self.feed.taps.remove(self.hung.observe)


class RunGuards:
    """The guards of one pipeline run over ``cluster`` (see the module); ``backstop()`` is the trees' timeout."""

    def __init__(
        self,
        spark: Any,
        cluster: ClusterClient,
        checkpoint: Path,
        options: PipelineOptions,
        backstop: Callable[[], float],
    ) -> None:
        self.spark = spark
        self.cluster = cluster
        self.checkpoint = checkpoint
        self.options = options
        self.backstop = backstop
        self.watch = ShardWatch(cluster, options.clock)
        self.failed_jobs = 0  # in a row
        self.last_error: Exception | None = None
        self.job_ends: dict[int, float] = {}  # round -> when its job succeeded (stall check)
        self._breaks_at_start: dict[int, int] = {}  # round -> the outcome streams' breaks when its job started
        self._feed: Any = None

    def attach(self, feed: Any) -> None:
        """The run starts: the watch hears the client's errors and sees the outcome streams that are closed."""
        self._feed = feed
        self.watch.silent = feed.closed_streams  # a dead shard is seen even when nothing is sent to it
        self.cluster.add_error_listener(self.watch)

    def detach(self) -> None:
        """The run ended: the client's errors are no longer this run's."""
        self.cluster.remove_error_listener(self.watch)

    # -- between rounds ---------------------------------------------------------------------

    def check_run(self, stats: Stats) -> None:
        """Before each turn of the loop: stop on a shard down too long, or on too many failed jobs in a row."""
        self.check_shards(stats)
        if self.failed_jobs > self.options.policy.max_attempts:
            last = job_error(self.last_error) if self.last_error is not None else None
            raise RunStopped(
                f"{self.failed_jobs} Spark jobs in a row failed (last: {last}); stopping: the"
                " checkpoint keeps the run's progress, fix the job and run again",
                last,
                stats(),
            )

    def check_shards(self, stats: Stats) -> None:
        """Raise ShardDown if a shard has been unreachable longer than ``shard_down_after``."""
        if self.options.shard_down_after is None:
            return
        down = self.watch.down_longer_than(self.options.shard_down_after)
        if down is not None:
            raise ShardDown(*down, stats())

    def check_budget(self, book: ReplayBook, stats: Stats) -> None:
        """Between rounds: stop the run if the records dead-lettered so far are past the budget."""
        if self.options.budget is None:
            return
        error = book.budget_error(self.options.budget)
        if error is not None:
            error.stats = stats()
            raise error

    def check_stalled(self, book: ReplayBook, backstop: float, undelivered: bool, stats: Stats) -> None:
        """Stop a run whose successful job left every one of its trees pending: emitted rows that nothing acks.

        ``undelivered``: bolts reported acks they could not deliver (those explain it).
        """
        limit = self.options.stall_after if self.options.stall_after is not None else backstop / 2
        now = self.options.clock()
        for round_no, ended in list(self.job_ends.items()):
            if now - ended < limit:
                continue
            del self.job_ends[round_no]
            breaks_at_start = self._breaks_at_start.pop(round_no, None)
            trees = book.round_stalled(round_no)
            if not trees:
                continue
            if len(book.undelivered) or undelivered or self.watch.down():
                continue  # acks that could not be delivered explain it: they end as ACKS_UNDELIVERED
            if breaks_at_start is not None and self._stream_breaks() != breaks_at_start:
                # An acker went down (or was cut off) while the job ran: a restarted one has lost the trees
                # it held, which then end at the backstop and are replayed. Not a job that acks nothing.
                continue
            raise RunStopped(
                f"round {round_no}'s Spark job succeeded {now - ended:.0f} s ago but none of its"
                f" {trees} trees has completed: rows a bolt emitted were never acked by a later step. "
                "Likely cause: the job ends with a Spark action or writer after a bolt (e.g."
                " bolt.apply_df(df).write.parquet(...)), or filters a bolt's output outside a bolt. Return the"
                " output DataFrame with SourcePipeline(..., output=FileOutput(...)) (exactly-once), or end the"
                " job with a sink bolt that emits nothing. The checkpoint keeps the run's state.",
                None,
                stats(),
            )

    # -- a round's job ----------------------------------------------------------------------

    def _stream_breaks(self) -> int:
        """The outcome streams' breaks so far (0 before the run attaches its feed)."""
        return self._feed.stream_breaks() if self._feed is not None else 0

    def job_succeeded(self, round_no: int) -> None:
        """A round's job succeeded: the failures in a row start again, the stall check starts for the round."""
        self.failed_jobs = 0
        self.job_ends[round_no] = self.options.clock()

    def job_failed(self, err: Exception) -> None:
        """A round's job failed (not cancelled by its watch): one more failure in a row."""
        self.failed_jobs += 1
        self.last_error = err

    def round_watch(self, round_no: int, rows: RoundFilter, book: ReplayBook, run_name: str) -> RoundGuard:
        """The round's job group and its watch: the failure budget (the executors' files), a shard down, a hung task.

        The hung-task check observes the outcome feed from now on; the caller
        closes the guard once the job has returned.
        """
        options = self.options
        self._breaks_at_start[round_no] = self._stream_breaks()  # the stall check's witness of an acker outage
        group = JobGroup(self.spark, f"{run_name}-r{round_no}", f"acker round {round_no}")
        checks: list[Check] = []
        tally = None
        if options.budget is not None:
            budget, tally = options.budget, book.round_tally(round_no, rows)
            checks.append(lambda: book.budget_error(budget, tally))
        if options.shard_down_after is not None:
            # A shard dead past the bound stops the run even while a job rides the outage out.
            bound, shards = options.shard_down_after, self.watch
            checks.append(lambda: shards.check_bound(bound))
        hung = None
        if options.hang_grace is not None:
            # Executors cut from the ackers are quiet too: cancelled only after the backstop (hung_round.py).
            silent_after = options.spout_timeout if options.spout_timeout is not None else self.backstop()
            hung = HungRoundCheck(
                self.checkpoint,
                round_no,
                options.clock,
                options.hang_grace,
                silent_after=silent_after,
                shard_count=self.cluster.shard_count,
            )
            self._feed.taps.append(hung.observe)
            checks.append(hung)
        clear_stop(self.checkpoint)  # a stopped round's marker must not stop this one
        checkpoint = self.checkpoint

        def cancel() -> None:
            request_stop(checkpoint, f"round {round_no}: {type(watch.verdict).__name__}")  # tasks, per batch
            group.cancel()  # and Spark, for tasks not running a bolt or reader that looks

        watch = RoundWatch(checks, cancel, clock=options.clock, interval=options.watch_interval)
        return RoundGuard(group, watch, tally, hung, self._feed)

    def after_round(
        self,
        book: ReplayBook,
        round_no: int,
        guard: RoundGuard,
        ok: bool,
        stop: JobError | None,
        job_ended: float,
        payloads: PayloadReader,
        stats: Stats,
    ) -> None:
        """After a round's job, its trees added to the book: stop the run if its watch or its failure says so.

        A job the watch cancelled for the budget stops the run
        (:meth:`stop_round`), one it cancelled for a shard down too long raises
        ShardDown; a failed job (``ok`` false) has its trees failed at the ackers
        so they are replayed without waiting, and stops the run if it failed on
        a misconfiguration (``stop``), else every shard is probed.
        """
        verdict = guard.watch.verdict
        if isinstance(verdict, BudgetExceeded):
            self.stop_round(book, round_no, guard, job_ended, payloads, stats)
        if isinstance(verdict, DownTooLong):
            book.fail_round(self.cluster, round_no)  # replayed by the next run, once the shard is back
            raise ShardDown(verdict.shard, verdict.seconds, stats())
        if ok:
            return
        book.fail_round(self.cluster, round_no)
        if stop is not None:
            # A replay cannot cure a wrong address list or credentials: stop, keeping the checkpoint.
            raise RunStopped(
                f"round {round_no}'s Spark job failed on a misconfiguration: {stop}. The run stopped (nothing "
                "replayed, the job's unfinished trees failed); the checkpoint keeps its progress: fix the "
                "configuration and run again with the same checkpoint",
                stop,
                stats(),
            )
        self.probe_shards()

    def stop_round(
        self,
        book: ReplayBook,
        round_no: int,
        guard: RoundGuard,
        job_ended: float,
        payloads: PayloadReader,
        stats: Stats,
    ) -> None:
        """The watch cancelled the round's job for the budget: fail its unfinished trees, write the dead letters
        due, stop the run.

        The trees the job left unfinished are failed at the ackers (their
        records are replayed by the next run); the records it never read stay
        unread in the checkpoint. What is settled now is dead-lettered, so the
        error names real records; the rest settles on the next run.
        """
        book.fail_round(self.cluster, round_no)
        verdict: BudgetExceeded = guard.watch.verdict
        budget, tally = self.options.budget, guard.tally
        assert budget is not None and tally is not None, "the budget is the only check that stops a round"
        # How far past its bound the round went: what its tasks had failed for good when the job stopped.
        seen = book.dead_count + tally.failed_for_good()  # the letters of this round are not written yet
        allowed = budget.allowed(verdict.read)
        dead_past = max(0, seen - allowed) if allowed is not None else 0
        book.settle_feed()
        book.write_dead_letters(self.options.dead_letters, payloads)
        # The counts: the tasks' (outcomes may still be on their way) or the book's, whichever saw more;
        # the examples: the dead letters' (they name record keys), else the executors' causes.
        dead, read = max(seen, book.dead_count), max(verdict.read, book.read_count)
        causes = book.dead_causes.top() if len(book.dead_causes) else verdict.causes
        error = budget.error(dead, read, causes)
        error.read_after = max(0, book.read_count - verdict.read)  # records read after the budget was seen passed
        error.seconds_after = max(0.0, job_ended - (guard.watch.decided_at or job_ended))  # until the job had stopped
        error.dead_past = dead_past
        error.stats = stats()
        raise error

    def probe_shards(self) -> None:
        """After a failed job: ask every shard for its Describe, marking those that do not answer as down.

        The driver sends little itself (the executors init and ack), so its
        client's error listener alone may never see a dead shard; a job failing
        because its tasks could not reach one is when to look.
        """
        for shard in range(self.cluster.shard_count):
            try:
                self.cluster.describe(shard)
            except ShardUnavailable as err:
                self.watch(err)
            except Exception:  # noqa: BLE001 - it answered (a refusal, an old server): reachable
                continue
