"""SourcePipeline: records read by Spark on the executors, trees started there, replays by re-reading the source.

The driver never holds a record. ``pipeline.run(spark.read.text(dir), job)``
runs rounds of Spark jobs:

1. The first round reads the whole source. Its tasks start each record's tree
   where they read it (:class:`~acker_spark.executor_read.source_reader.SourceReader`), log
   the roots to the checkpoint's emission log, and the job's bolts ack them.
2. After each job the driver reads the round's emission log into its
   :class:`~acker_spark.tracking.book.ReplayBook` (a numpy record table) and settles
   the outcomes the :class:`~acker_spark.tracking.outcome_feed.OutcomeFeed` journaled,
   in bulk.
3. Failed, timed-out and lost deliveries wait their backoff (``ReplayPolicy``),
   then a replay round re-reads the source and keeps exactly those identities,
   with the next attempt number (a new root each). After ``max_attempts`` a
   record's last payload is read once more and written to the dead-letter store.

In-memory sources (``records_from(...)``, a list of ``(key, value)``) are copied once into the checkpoint
and read from there (:mod:`.memory_source`); a ``TextDirectorySource`` becomes ``spark.read.text``.

A tree lost because a bolt could not deliver its acks ends as ``ACKS_UNDELIVERED`` (a run dead-lettering
one raises ``AcksUndelivered`` naming the shards); a shard unreachable past ``shard_down_after`` raises ``ShardDown``.

Everything the driver knows is in the checkpoint directory (:mod:`.checkpoint`): a driver killed at
any moment and started again on it finishes the run, losing no record and redoing none already acked.

This module is the driver's loop: ``run``, its rounds and its replays. What it calls has a module each:
:mod:`.pipeline_options`, :mod:`.source_open` (the source, its rounds' frames), :mod:`.run_guards` (what
stops a run), :mod:`.undelivered_acks`, :mod:`acker_spark.output.run_output` (the output commits) and
:mod:`acker_spark.progress.driver_progress` (the progress view).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acker_client import ClusterClient
from acker_client.pending import cluster_backstop

from ..budget import BudgetExceeded, FailureBudget
from ..causes import CHECKPOINT_PROPERTY
from ..dead_letter import DeadLetterStore, Select
from ..job_errors import JobError, job_error
from ..output.run_output import RunOutput
from ..progress.display import resolve_mode
from ..progress.driver_progress import DriverProgress
from ..queues.contract import is_queue_source
from ..redrive import RedriveReport
from ..run_report import AcksUndelivered, RunStopped, ShardDown, SourceStats, fills_run_stats
from ..session import spark_context_of
from ..steps.frames import TRACKING_COLUMN
from ..tracking.book import ReplayBook
from ..tracking.checkpoint import Checkpoint, Manifest, SourceSection
from ..tracking.emission_log import RoundFilter, RoundRows, read_round, write_filter
from ..tracking.identity import IdentitySpec, resolve_identity
from .hung_round import HungRound
from .job_check import JobWritesItself, OutputForgotten, OutputNotReturned, check_job, not_returned_message
from .memory_source import DuplicateIdentity, is_dataframe
from .pipeline_options import PipelineOptions
from .run_guards import RunGuards
from .shard_watch import DownTooLong
from .source_open import SourceFrames, open_run, source_frame
from .source_reader import reader_schema
from .undelivered_acks import UndeliveredAcks

__all__ = [
    "AcksUndelivered",
    "BudgetExceeded",
    "DuplicateIdentity",
    "JobWritesItself",
    "OutputForgotten",
    "OutputNotReturned",
    "PipelineOptions",
    "RunStopped",
    "ShardDown",
    "SourcePipeline",
    "SourceStats",
]

log = logging.getLogger(__name__)

_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(PipelineOptions))


class SourcePipeline:
    """Runs ``job`` over a DataFrame read by Spark, each record tracked from the executor that reads it.

    ``cluster`` is the driver's client (for the outcome streams and for failing
    the trees of a failed job); executors get their own client for the same
    addresses. ``checkpoint`` is a directory the driver and every executor can
    write (a shared filesystem on a cluster). Every other setting is a keyword
    argument named as a field of :class:`~acker_spark.executor_read.pipeline_options.PipelineOptions`
    (``policy=``, ``output=``, ``dead_letters=``, ``budget=``, ``progress=``, ...,
    documented there), or all of them at once as ``options=`` (keywords given
    beside it replace its fields).
    """

    def __getattr__(self, name: str) -> Any:
        # pipeline.policy, pipeline.output, ...: every setting still reads as an attribute (it lives in options).
        options = self.__dict__.get("options")
        if options is not None and name in _OPTION_NAMES:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(
        self,
        spark: Any,
        cluster: ClusterClient,
        checkpoint: str | Path,
        *,
        options: PipelineOptions | None = None,
        **settings: Any,
    ) -> None:
        base = options if options is not None else PipelineOptions()
        self.options = dataclasses.replace(base, **settings) if settings else base
        self.spark = spark
        self.cluster = cluster
        self.checkpoint = Checkpoint(checkpoint)
        self.book: ReplayBook | None = None  # opened with the checkpoint (the run's salt is in it)
        self.stats = SourceStats()
        self._manifest = Manifest("source", "", 0)  # the checkpoint's, once run opens it
        self._frames: SourceFrames | None = None
        self._output: RunOutput | None = None
        self._feed: Any = None
        self._read_all = False  # a round read the whole source (the manifest's source_done once all settled)
        opts = self.options
        self._guards = RunGuards(spark, cluster, self.checkpoint.path, opts, self._backstop)
        self._view = DriverProgress(
            log,
            self._guards.watch,
            mode=resolve_mode(opts.progress),
            file_interval=opts.progress_file_interval,
            log_interval=opts.log_interval,
            clock=opts.clock,
            on_progress=opts.on_progress,
        )
        self._undelivered = UndeliveredAcks(lambda: self.checkpoint.save_manifest(self._manifest), log)

    # -- the run --------------------------------------------------------------------------

    @fills_run_stats
    def run(self, source: Any, job: Callable[[Any], object], *, key: str | None = None) -> SourceStats:
        """Process every record of ``source`` until each is acked or dead-lettered (resuming the checkpoint's run).

        ``source`` is a DataFrame read by Spark, or an in-memory source
        (``records_from(...)``, ``generated_sentences(...)``, a list of
        ``Record`` or ``(key, value)`` tuples: copied once into the checkpoint,
        identified by their keys) or a ``TextDirectorySource``. ``job(tracked)``
        gets the source's columns (``key`` and ``value`` for an in-memory
        source) plus ``_record_key``, ``_attempt`` and ``_acker_ids`` and must
        run the actions that complete the work (its bolts ack the rows).
        ``key`` names a unique, non-null column of a DataFrame as the record
        identity; without it, file sources are identified by file and position
        (see :mod:`acker_spark.tracking.identity`).

        A queue (:class:`~acker_spark.queues.QueueSource`: Redis Streams,
        RabbitMQ) is drained in bounded batches, each copied into the
        checkpoint keyed by broker id and acked at the broker after its output
        is committed (:mod:`acker_spark.queues.drain`).
        """
        if is_queue_source(source):  # drained batch by batch, each batch a run of a sibling pipeline
            from ..queues.drain import drain_queue

            if key is not None:
                raise ValueError(f"key={key!r}: a queue's messages are identified by their broker ids, not a column")
            return drain_queue(self, source, job)
        opts = self.options
        df, key, copy = source_frame(self.spark, self.checkpoint, source, key, self.stats)
        spec = resolve_identity(self.spark, df, key)
        # Before any record is read or the checkpoint changes: a forgotten output or a job writing for itself.
        check_job(self.spark, reader_schema(df.schema), job, opts.output)
        self._open(df, open_run(self.spark, self.checkpoint, spec, copy, opts.name, self.stats))
        replicas = getattr(self.cluster, "replicas", 1)
        log.info(
            "%s run %s: %d ackers, replicas %d (%s), checkpoint %s, output %s",
            "resuming" if self.stats.resumed else "starting",
            self._manifest.name,
            self.cluster.shard_count,
            replicas,
            "each tree kept by two ackers" if replicas == 2 else "an acker's loss replays its trees",
            self.checkpoint.path,
            opts.output.describe() if opts.output is not None else "none (the job writes its own)",
        )
        backstop = opts.spout_timeout if opts.spout_timeout is not None else self._backstop()
        from ..tracking.outcome_feed import OutcomeFeed

        self._undelivered.start()
        self._feed = OutcomeFeed(self.cluster, self._manifest.name, self.checkpoint, opts.journal_interval).start()
        self._book.attach(self._feed)
        self._guards.attach(self._feed)
        sc = spark_context_of(self.spark)
        if sc is not None:  # the bolts write why records failed into the checkpoint (classic Spark)
            sc.setLocalProperty(CHECKPOINT_PROPERTY, str(self.checkpoint.path))
        state = "stopped"
        try:
            self._restore(backstop)
            self._publish(in_job=False)
            self._view.start(self._manifest.name, self.checkpoint.path, self._feed, RoundRows(self.checkpoint.path))
            self._loop(job, backstop)
            self._commit_acked()
            if self._output is not None:
                self._output.drop_staged()  # every ACKED delivery's rows are committed: the rest is never needed
            state = "finished"
        finally:
            self._view.stop(state, lambda: self._publish(in_job=False))
            if sc is not None:
                sc.setLocalProperty(CHECKPOINT_PROPERTY, None)
            self._guards.detach()
            self._feed.close()
        self._view.report(self._filled_stats)
        self._undelivered.check(self._book, self._run, self._filled_stats(), opts.on_undelivered)
        return self.stats

    def sibling(self, checkpoint: Path, dead_letters: DeadLetterStore, budget: FailureBudget | None) -> SourcePipeline:
        """A pipeline configured like this one, with another checkpoint, dead-letter table and budget, adding to
        this one's output (a redrive chunk's, a queue batch's: see :meth:`PipelineOptions.sibling`)."""
        return SourcePipeline(self.spark, self.cluster, checkpoint, options=self.options.sibling(dead_letters, budget))

    def redrive(
        self,
        dead_letters: DeadLetterStore,
        job: Callable[[Any], object],
        *,
        select: Select | None = None,
        rate: float | None = None,
        key: str | None = None,
        schema: Any = None,
        chunk_seconds: float = 10.0,
        redrive_id: str | None = None,
        folder: str | Path | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        budget: FailureBudget | None = None,
    ) -> RedriveReport:
        """Send the selected dead letters through ``job`` again as new deliveries; each at most once, also across kills.

        Each chunk of letters is a run of a pipeline configured like this one
        (:meth:`sibling`), with a checkpoint of its own under ``folder``
        (default: ``<checkpoint>/redrives``); called again after a kill, it
        finishes the killed redrive. The arguments:
        :func:`~acker_spark.executor_read.redrive_source.redrive_letters`.
        """
        from .redrive_source import redrive_letters

        base = Path(folder) if folder is not None else self.checkpoint.path / "redrives"
        report = redrive_letters(
            self.spark,
            self.sibling,
            base,
            dead_letters,
            job,
            clock=clock if clock is not None else self.options.clock,
            select=select,
            rate=rate,
            key=key,
            schema=schema,
            chunk_seconds=chunk_seconds,
            redrive_id=redrive_id,
            sleep=sleep,
            budget=budget,
        )
        output = self.options.output
        report.output = output.describe() if output is not None else "none"
        return report

    def _open(self, df: Any, manifest: Manifest) -> None:
        """The checkpoint's run is open: its book, the frames of its rounds, its output's commit log."""
        self._manifest = manifest
        spec = IdentitySpec.from_json(self._run.identity)
        opts = self.options
        self._frames = SourceFrames(
            df, spec, manifest, self.checkpoint, self.cluster.addresses, opts.security, opts.client_options
        )
        self.book = ReplayBook(self.checkpoint, manifest.salt, opts.policy, opts.clock)
        if opts.output is not None:
            self._output = RunOutput(self.checkpoint.path, manifest, opts, self.cluster.addresses)

    @property
    def _run(self) -> SourceSection:
        """The manifest's source section: the source's identity and how far the run got."""
        assert self._manifest.source is not None, "opened by _open"
        return self._manifest.source

    @property
    def _book(self) -> ReplayBook:
        """The run's book (opened by :meth:`_open`)."""
        assert self.book is not None, "the book opens with the checkpoint"
        return self.book

    @property
    def _source(self) -> SourceFrames:
        """The frames of the run's rounds (made by :meth:`_open`)."""
        assert self._frames is not None, "made when the run opens"
        return self._frames

    def _restore(self, backstop: float) -> None:
        """Rebuild the book from the checkpoint; finish a half-done commit; fail the trees left in flight."""
        rounds = range(self._run.next_round)
        self._book.restore(rounds)
        self._read_all = self._run.source_done
        if self._read_all and not self._book.started():
            # Marked done by a run that read nothing (a job that returned its output to a pipeline without
            # output= ran no action): not a finished night. Read the source again.
            log.warning(
                "checkpoint %s was marked done by a run that read no record (its job ran no action over the "
                "source): reading the source again",
                self.checkpoint.path,
            )
            self._read_all = False
            self._run.source_done = False
            self.checkpoint.save_manifest(self._manifest)
        if self._output is not None:
            # A commit a killed driver left half-done: finished with the same rows, before any new one.
            self.stats.output_rows += self._output.resume(self.spark)
        self._book.fail_left_in_flight(self.cluster, rounds, backstop, "driver")

    def _loop(self, job: Callable[[Any], object], backstop: float) -> None:
        """Rounds until every record read is acked or dead: the first read, then the replays as they fall due."""
        book, guards, opts = self._book, self._guards, self.options
        while True:
            guards.check_run(self._filled_stats)
            if not self._read_all:
                self._read_all = self._run_round(job, book.first_read(), backstop)
            book.settle_feed()
            book.expire()
            guards.check_stalled(book, backstop, bool(self._undelivered.errors), self._filled_stats)
            if opts.commit_every == "round" and not book.in_flight():
                self._commit_acked()
            book.write_dead_letters(opts.dead_letters, self._source.read_dead)
            guards.check_budget(book, self._filled_stats)
            due = book.due_replays()
            if len(due):
                rows, roots = book.replay_filter(due)
                if self._run_round(job, rows, backstop):  # every replayed record must have been found again
                    self._source.found_again(book.not_found(roots))
                continue
            self._view.report(self._filled_stats)
            if self._read_all and not book.busy():
                # Done only now: every record read is acked or dead (a read that emitted nothing is done too,
                # but a run that stops before this point leaves the source to be read again).
                if not self._run.source_done:
                    self._run.source_done = True
                    self.checkpoint.save_manifest(self._manifest)
                return
            self._publish(in_job=False, every=self._view.interval)
            self._view.log_line(self._filled_stats)
            self._feed.wait(book.wait_time(opts.progress_interval))

    def _run_round(self, job: Callable[[Any], object], rows: RoundFilter, backstop: float) -> bool:
        """Run one job over the source (filtered by ``rows``); add what it started; True if the job succeeded."""
        round_no = self._run.next_round
        path = write_filter(self.checkpoint.path, round_no, rows)
        self._run.next_round = round_no + 1
        self.checkpoint.save_manifest(self._manifest)  # before any task can start a tree of this round
        tracked = self._source.frame(round_no, str(path))
        ok = True
        stop: JobError | None = None
        self._publish(in_job=True, round_no=round_no, first_read=rows.mode != "select")
        guard = self._guards.round_watch(round_no, rows, self._book, self._manifest.name)
        watch = guard.watch
        try:
            with guard.group, watch:
                result = job(tracked)
                if self.options.output is not None:
                    self._stage(result, round_no)
        except (OutputNotReturned, OutputForgotten, JobWritesItself):
            raise  # the job is wrong, not unlucky: a replay would fail the same way
        except Exception as err:  # noqa: BLE001 - any job failure is handled the same way
            ok = False
            error = job_error(err)
            stop = error if error.configuration else None
            if watch.verdict is None:  # a job the watch cancelled did not fail: the run stops below
                self.stats.job_errors += 1
                self._guards.job_failed(err)
                if stop is None:
                    log.warning(
                        "round %d's Spark job failed; its unfinished records will be replayed: %s", round_no, error
                    )
        finally:
            guard.close()
        job_ended = self.options.clock()
        if isinstance(watch.verdict, (HungRound, DownTooLong)):
            ok = False  # the round did not finish: what it did not read is read by the next one
            log.warning("round %d: %s", round_no, watch.verdict)
        self.stats.jobs += 1
        if ok:
            self._guards.job_succeeded(round_no)
        # What the round's tasks started, refusing a source whose identities are not unique.
        self._book.add_round(self._source.unique(read_round(self.checkpoint.path, round_no)), round_no)
        self._publish(in_job=False, round_no=round_no)
        self._book.start_deadline(round_no, backstop)
        self._undelivered.collect(self._book, self._run, self.stats)
        self._guards.after_round(
            self._book, round_no, guard, ok, stop, job_ended, self._source.read_dead, self._filled_stats
        )
        return ok

    # -- output (hooks a subclass may wrap: the benches time them) -------------------------

    def _stage(self, result: Any, round_no: int) -> None:
        """Stage the job's output DataFrame under the checkpoint (executors stage, then ack, each batch)."""
        if not is_dataframe(result) or TRACKING_COLUMN not in result.columns:
            raise OutputNotReturned(not_returned_message(self.options.output, result))
        assert self._output is not None, "an output has its commit log"
        self.stats.staged_rows += self._output.stage(result, round_no)

    def _commit_acked(self) -> None:
        """Commit the output of every ACKED delivery no commit took yet."""
        if self._output is None:
            return
        rows = self._output.commit_acked(self.spark, self._book.acked_since)
        if rows is not None:
            self.stats.output_rows += rows
            self.stats.output_commits += 1

    # -- the view of the run ------------------------------------------------------------------

    def _publish(
        self, *, in_job: bool, round_no: int | None = None, first_read: bool = True, every: float = 0.0
    ) -> None:
        """Driver thread, where the book is consistent: the baseline the progress reporter adds live counts to.

        ``every``: skip if one was published less than that many seconds ago
        (the wait loop turns often; filling the stats reads the whole table).
        """
        if self._feed is None or self.book is None or not self._view.due(every):
            return
        stats, memory = self._filled_stats(), self._run.memory_source
        self._view.publish(
            stats,
            self._feed.counts()[1],
            records=stats.emitted if self._read_all else (int(memory["records"]) if memory else None),
            round_no=round_no if round_no is not None else max(0, self._run.next_round - 1),
            in_job=in_job,
            first_read=first_read,
        )

    def _filled_stats(self) -> SourceStats:
        """The run's stats, filled from the book now."""
        self._book.fill_stats(self.stats)
        return self.stats

    def _backstop(self) -> float:
        return cluster_backstop(self.cluster)
