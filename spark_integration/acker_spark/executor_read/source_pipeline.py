"""SourcePipeline: records read by Spark on the executors, trees started there, replays by re-reading the source.

The driver never holds a record. ``pipeline.run(spark.read.text(dir), job)``
runs rounds of Spark jobs:

1. The first round reads the whole source. Its tasks start each record's tree
   where they read it (:class:`~acker_spark.executor_read.source_reader.SourceReader`), log
   the roots to the checkpoint's emission log, and the job's bolts ack them.
2. After each job the driver reads the round's emission log into its
   :class:`~acker_spark.executor_read.book.ReplayBook` (a numpy record table) and settles
   the outcomes the :class:`~acker_spark.executor_read.outcome_feed.OutcomeFeed` journaled,
   in bulk.
3. Failed, timed-out and lost deliveries wait their backoff (``ReplayPolicy``),
   then a replay round re-reads the source and keeps exactly those identities,
   with the next attempt number (a new root each). After ``max_attempts`` a
   record's last payload is read once more and written to the dead-letter store.

In-memory sources (``records_from(...)``, ``generated_sentences(...)``, a list
of ``Record`` or ``(key, value)`` tuples) take the same path: the driver copies
them once into the checkpoint as Parquet and the rounds read that copy, keyed
by the records' keys (:mod:`acker_spark.executor_read.memory_source`); a
``TextDirectorySource`` becomes ``spark.read.text`` over its files.

A tree that timed out or was lost because a bolt could not deliver its acks
(executors that cannot reach a shard) ends as ``ACKS_UNDELIVERED``, and a run
that dead-letters such a record raises :class:`~acker_spark.run_report.AcksUndelivered`
naming the unreachable shards; a shard the driver finds unreachable longer
than ``shard_down_after`` stops the run with :class:`~acker_spark.run_report.ShardDown`.

Everything the driver knows is in the checkpoint directory
(:mod:`acker_spark.executor_read.checkpoint`): a driver killed at any moment and started again
with the same checkpoint (and the same source and job) finishes the run
without losing a record or processing again one already acked.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from acker_client import ClusterClient, ShardUnavailable, new_id
from acker_client.pending import cluster_backstop
from acker_protocol.wire import Outcome

from ..budget import BudgetExceeded, FailureBudget
from ..causes import CHECKPOINT_PROPERTY
from ..dead_letter import DeadLetterStore, Select
from ..job_errors import JobError, job_error
from ..job_group import JobGroup
from ..output import FileOutput, Output, OutputCommits, OutputStager, TableOutput
from ..output.stager import stager_schema
from ..progress_display import ProgressMode, ProgressReporter, resolve_mode
from ..redrive import Redrive, RedriveReport
from ..replay_policy import ReplayPolicy
from ..round_stop import clear_stop, request_stop
from ..run_progress import Baseline, Live, ProgressMeter
from ..run_report import AcksUndelivered, RunStopped, ShardDown, SourceStats
from ..session import default_parallelism, spark_context_of
from ..shard_watch import ProgressLine, ShardWatch
from ..sources import TextDirectorySource
from ..steps.frames import TRACKING_COLUMN
from ..steps.step import CommitBaseline, CommitErrors
from .book import DeadLetterRow, ReplayBook, round_slot
from .checkpoint import Checkpoint, Manifest, SourceSection
from .emission_log import RoundFilter, RoundRows, read_round, write_filter
from .hung_round import HungRound, HungRoundCheck
from .identity import (
    IdentitySpec,
    UnstableIdentity,
    apply_pinned_conf,
    check_unchanged,
    resolve_identity,
)
from .memory_source import COPY_DIR, KEY, DuplicateIdentity, is_dataframe, is_utf8, text_frame, write_records
from .record_table import ACKED, FAILED, PENDING
from .round_tally import RoundTally
from .round_watch import Check, RoundWatch
from .source_reader import ATTEMPT_COLUMN, IDENT_COLUMN, KEY_COLUMN, SourceReader, reader_schema

__all__ = [
    "AcksUndelivered",
    "BudgetExceeded",
    "DuplicateIdentity",
    "OutputNotReturned",
    "RunStopped",
    "ShardDown",
    "SourcePipeline",
    "SourceStats",
]

log = logging.getLogger(__name__)


_UNUSED = np.zeros(0, dtype=np.uint64)
_PEEK_ROUND = 99_999  # the filter file of dead-letter reads (they start no trees and log nothing)


class OutputNotReturned(TypeError):
    """A pipeline with an output ran a job that did not return its output DataFrame."""


class SourcePipeline:
    """Runs ``job`` over a DataFrame read by Spark, each record tracked from the executor that reads it.

    ``cluster`` is the driver's client (for the outcome streams and for failing
    the trees of a failed job); executors get their own client for the same
    addresses (``security`` and ``client_options`` as for a Bolt).
    ``checkpoint`` is a directory the driver and every executor can write
    (a shared filesystem on a cluster). ``name`` is the spout name (default:
    the checkpoint's, or a fresh one). ``journal_interval``: how often outcomes
    that arrive during a job are journaled (each write is an ``fsync``; what a
    crash leaves unjournaled is still retained by the ackers).
    ``on_undelivered``: ``"raise"`` (:class:`AcksUndelivered` once every record
    is settled, if one was dead-lettered because its acks could not be
    delivered) or ``"warn"``. ``shard_down_after``: seconds a shard may stay
    unreachable before ``run`` raises :class:`ShardDown` (None: wait forever);
    ``log_interval``: seconds between progress lines naming such a shard.

    ``output``: where the job's output goes, exactly once per record
    (:class:`~acker_spark.output.FileOutput`, :class:`~acker_spark.output.TableOutput`
    or :class:`~acker_spark.output.BatchOutput`); the job then returns its
    output DataFrame instead of running an action, the executors stage and ack
    it batch by batch, and the rows of the deliveries that ACKED are committed
    with Spark's writer once at the end (``commit_every="end"``) or whenever
    every started tree has settled (``"round"``). ``stall_after``: seconds after
    a successful job with none of its trees settled before the run stops,
    naming rows that no later step acked (default: half the backstop timeout).

    ``progress``: how a run shows its progress while it runs, Spark jobs
    included: ``"bar"`` (a rich progress bar on stderr: records read, acked,
    pending, replaying, dead, rate, ETA), ``"log"`` (that line at INFO every
    ``log_interval`` seconds while a job runs), ``"auto"`` (default: a bar when
    stderr is a terminal, else log lines) or None. Whatever it is, the run
    writes the same figures to ``progress.json`` in the checkpoint every
    ``progress_file_interval`` seconds, which ``acker-ctl progress --checkpoint
    DIR`` shows from another terminal. ``on_progress(stats)`` is still called
    from the driver thread between rounds.
    ``budget``: the run's :class:`~acker_spark.budget.FailureBudget` (default: stop
    once more than 5% of the records read, from 100 read, failed for good;
    None: never stop for failed records). It is checked every
    ``watch_interval`` seconds while a round's job runs (its Spark job group is
    cancelled at once) and between rounds; ``run`` then raises
    :class:`~acker_spark.budget.BudgetExceeded` naming the top causes, and the
    records not processed yet stay in the checkpoint. ``hang_grace``: a round
    whose job runs on although every tree it started has ended, some failed
    from outside (``acker-ctl fail``, a time limit), and no tree was started for
    ``hang_grace`` seconds, has a hung task: its job is cancelled and the
    failed records are replayed or dead-lettered as after a failed job (None:
    wait for the job).
    """

    def __init__(
        self,
        spark: Any,
        cluster: ClusterClient,
        checkpoint: str | Path,
        *,
        name: str | None = None,
        policy: ReplayPolicy = ReplayPolicy(),
        dead_letters: DeadLetterStore | None = None,
        spout_timeout: float | None = None,
        progress_interval: float = 0.25,
        journal_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        security: Any = None,
        client_options: dict[str, Any] | None = None,
        on_progress: Callable[[SourceStats], None] | None = None,
        on_undelivered: Literal["raise", "warn"] = "raise",
        shard_down_after: float | None = 120.0,
        log_interval: float = 10.0,
        output: Output | None = None,
        commit_every: Literal["round", "end"] = "end",
        stall_after: float | None = None,
        progress: ProgressMode = "auto",
        progress_file_interval: float = 2.0,
        budget: FailureBudget | None = FailureBudget(),
        watch_interval: float = 0.1,
        hang_grace: float | None = 5.0,
    ) -> None:
        if commit_every not in ("round", "end"):
            raise ValueError(f'commit_every must be "round" or "end", got {commit_every!r}')
        self.budget = budget
        self.watch_interval = watch_interval
        self.hang_grace = hang_grace
        self.output = output
        self.commit_every = commit_every
        self.stall_after = stall_after
        self._commits: OutputCommits | None = None
        self._committed = _UNUSED  # roots whose output a commit took (sorted)
        self._job_ends: dict[int, float] = {}  # round -> when its job succeeded (stall check)
        if on_undelivered not in ("raise", "warn"):
            raise ValueError(f'on_undelivered must be "raise" or "warn", got {on_undelivered!r}')
        self.on_undelivered = on_undelivered
        self.shard_down_after = shard_down_after
        self.spark = spark
        self.cluster = cluster
        self.checkpoint = Checkpoint(checkpoint)
        self.name = name
        self.policy = policy
        self.dead_letters = dead_letters
        self.spout_timeout = spout_timeout
        self.progress_interval = progress_interval
        self.journal_interval = journal_interval
        self.clock = clock
        self.security = security
        self.client_options = dict(client_options or {})
        self.on_progress = on_progress
        self.progress = progress
        self._progress_mode = resolve_mode(progress)  # refuses a wrong value here, not at the end of a run
        self.progress_file_interval = progress_file_interval
        self.log_interval = log_interval
        self._baseline_view = Baseline()  # replaced whole by the driver thread, read by the reporter's
        self._published_at: float | None = None
        self._reporter: ProgressReporter | None = None
        self._round_rows: RoundRows | None = None
        self.book: ReplayBook | None = None  # opened with the checkpoint (the run's salt is in it)
        self.stats = SourceStats()
        self._manifest = Manifest("source", "", 0)  # the checkpoint's, once run opens it
        self._feed: Any = None
        self._failed_jobs = 0  # in a row
        self._last_error: Exception | None = None
        self._watch = ShardWatch(cluster, clock)
        self._progress = ProgressLine(log, self._watch, log_interval, clock)
        # Acks-undelivered bookkeeping: the bolts' reports when the run started (they count
        # from their creation) and this run's reports; the book keeps the roots whose acks were dropped.
        self._baseline = CommitBaseline()
        self._errors: dict[str, CommitErrors] = {}

    # -- the run --------------------------------------------------------------------------

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
        (see :mod:`acker_spark.executor_read.identity`).
        """
        df, key, copy = self._source_frame(source, key)
        spec = resolve_identity(self.spark, df, key)
        self._open(spec, copy)
        replicas = getattr(self.cluster, "replicas", 1)
        log.info(
            "%s run %s: %d ackers, replicas %d (%s), checkpoint %s, output %s",
            "resuming" if self.stats.resumed else "starting",
            self._manifest.name,
            self.cluster.shard_count,
            replicas,
            "each tree kept by two ackers" if replicas == 2 else "an acker's loss replays its trees",
            self.checkpoint.path,
            self.output.describe() if self.output is not None else "none (the job writes its own)",
        )
        backstop = self.spout_timeout if self.spout_timeout is not None else self._backstop()
        from .outcome_feed import OutcomeFeed

        self._baseline.start()
        self._feed = OutcomeFeed(self.cluster, self._manifest.name, self.checkpoint, self.journal_interval).start()
        self._book.attach(self._feed)
        self.cluster.add_error_listener(self._watch)
        sc = spark_context_of(self.spark)
        if sc is not None:  # the bolts write why records failed into the checkpoint (classic Spark)
            sc.setLocalProperty(CHECKPOINT_PROPERTY, str(self.checkpoint.path))
        state = "stopped"
        try:
            self._restore(backstop)
            self._start_progress()
            self._loop(df, job, backstop)
            self._commit_acked()
            if self._commits is not None:
                self._commits.drop_staged()  # every ACKED delivery's rows are committed: the rest is never needed
            state = "finished"
        finally:
            if self._reporter is not None:
                self._stop_progress(state)
            if sc is not None:
                sc.setLocalProperty(CHECKPOINT_PROPERTY, None)
            self.cluster.remove_error_listener(self._watch)
            self._feed.close()
        self._book.fill_stats(self.stats)
        self._report()
        self._check_undelivered()
        return self.stats

    # -- redrive --------------------------------------------------------------------------

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
    ) -> RedriveReport:
        """Send the selected dead letters through ``job`` again as new deliveries; each at most once, also across kills.

        ``select``: :class:`~acker_spark.dead_letter.Select` by cause kind
        and/or keys (default ``Select()``: every letter not yet acked by a redrive).
        ``rate``: most records sent per second (default uncapped), in chunks
        of ``rate * chunk_seconds`` records. The records are the letters'
        stored rows, read as a Parquet source keyed by ``key`` (default: the
        column holding the letters' keys, else an added ``_dead_letter_key``),
        cast to ``schema`` (a DDL string or StructType) when given; each chunk
        is a run of a pipeline configured like this one, with a checkpoint of
        its own under ``folder`` (default: ``<checkpoint>/redrives``), and an
        output in ``append`` mode. Each letter ends ``acked`` or ``dead`` (with
        its new cause) in ``dead_letters``. Called again after a kill, it
        finishes the killed redrive (see :mod:`acker_spark.redrive`).
        ``clock`` and ``sleep`` pace the chunks (default: the pipeline's clock, ``time.sleep``).
        """
        from .redrive_source import SourceChunks

        base = Path(folder) if folder is not None else self.checkpoint.path / "redrives"
        chunks = SourceChunks(
            self.spark, self._sibling, job, key=key, schema=schema, files=default_parallelism(self.spark)
        )
        return Redrive(
            dead_letters,
            chunks,
            base,
            select=select,
            rate=rate,
            chunk_seconds=chunk_seconds,
            redrive_id=redrive_id,
            clock=clock if clock is not None else self.clock,
            sleep=sleep,
        ).run()

    def _sibling(self, checkpoint: Path, dead_letters: DeadLetterStore) -> SourcePipeline:
        """A pipeline configured like this one, with another checkpoint and dead-letter table (a redrive chunk's)."""
        output = self.output
        if isinstance(output, (FileOutput, TableOutput)) and output.mode != "append":
            # The redrive adds to what the run wrote: "overwrite" would drop it, "error" refuse it.
            output = dataclasses.replace(output, mode="append")
        return SourcePipeline(
            self.spark,
            self.cluster,
            checkpoint,
            policy=self.policy,
            dead_letters=dead_letters,
            spout_timeout=self.spout_timeout,
            progress_interval=self.progress_interval,
            journal_interval=self.journal_interval,
            clock=self.clock,
            security=self.security,
            client_options=self.client_options,
            on_progress=self.on_progress,
            on_undelivered=self.on_undelivered,
            shard_down_after=self.shard_down_after,
            output=output,
            commit_every=self.commit_every,
            stall_after=self.stall_after,
            log_interval=self.log_interval,
            progress=self.progress,
            progress_file_interval=self.progress_file_interval,
            budget=self.budget,
            watch_interval=self.watch_interval,
            hang_grace=self.hang_grace,
        )

    def _source_frame(self, source: Any, key: str | None) -> tuple[Any, str | None, dict[str, Any] | None]:
        """The DataFrame the rounds read, its key column, and for a new copy of an in-memory source its description."""
        manifest = self.checkpoint.manifest("source")
        copied = manifest is not None and manifest.source is not None and manifest.source.memory_source is not None
        if is_dataframe(source) or (isinstance(source, TextDirectorySource) and is_utf8(source.encoding)):
            if copied:
                raise UnstableIdentity(
                    f"the checkpoint {self.checkpoint.path} holds a copy of an in-memory source; this source is "
                    "read by Spark: pass the in-memory source again (it is not re-read), or use a new checkpoint"
                )
            if isinstance(source, TextDirectorySource):
                if key is not None:
                    raise ValueError("a TextDirectorySource's lines are identified by file and position: no key=")
                return text_frame(self.spark, source), None, None
            return source, key, None
        if key is not None:
            raise ValueError(
                f"key={key!r} names a DataFrame column; an in-memory source's records are identified by their keys"
            )
        folder = self.checkpoint.path / COPY_DIR
        if copied:
            # The copy is the source now: the iterable is not read again (a generator could not be).
            return self.spark.read.parquet(str(folder)), KEY, None
        if manifest is not None:
            raise UnstableIdentity(
                f"the checkpoint {self.checkpoint.path} belongs to a run over a DataFrame source, not an in-memory "
                "one: pass that source again, or use a new checkpoint directory"
            )
        count = write_records(source, folder, default_parallelism(self.spark))
        self.stats.copied = count
        log.info("copied %d in-memory records into %s", count, folder)
        return self.spark.read.parquet(str(folder)), KEY, {"folder": COPY_DIR, "records": count}

    def _open(self, spec: IdentitySpec, copy: dict[str, Any] | None = None) -> None:
        """Start a new checkpoint, or check that this source is the one the checkpoint's run was reading."""
        manifest = self.checkpoint.manifest("source")
        if manifest is None:
            manifest = Manifest(
                "source",
                self.name or f"acker-source-{new_id():016x}",
                new_id(),
                source=SourceSection(spec.as_json(), memory_source=copy),
            )
            apply_pinned_conf(self.spark, spec)
            self.checkpoint.save_manifest(manifest)
        else:
            assert manifest.source is not None, "a source checkpoint has its section"
            recorded = IdentitySpec.from_json(manifest.source.identity)
            check_unchanged(recorded, spec)
            if self.name is not None and self.name != manifest.name:
                raise ValueError(f"the checkpoint belongs to spout {manifest.name!r}, not {self.name!r}")
            apply_pinned_conf(self.spark, recorded)
            self.stats.resumed = True
        self._manifest = manifest
        self.spec = IdentitySpec.from_json(self._run.identity)
        self.book = ReplayBook(self.checkpoint, manifest.salt, self.policy, self.clock)
        if self.output is not None:
            self._commits = OutputCommits(self.checkpoint.path, manifest.name, self.output)

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

    def _restore(self, backstop: float) -> None:
        """Rebuild the book from the checkpoint; finish a half-done commit; fail the trees left in flight."""
        rounds = range(self._run.next_round)
        self._book.restore(rounds)
        if self._commits is not None:
            # A commit a killed driver left half-done: finished with the same rows, before any new one.
            commits = self._commits
            self.stats.output_rows += self._commit_step(lambda: commits.finish(self.spark))
            self._committed = self._commits.taken()
        self._book.fail_left_in_flight(self.cluster, rounds, backstop, "driver")

    def _loop(self, df: Any, job: Callable[[Any], object], backstop: float) -> None:
        while True:
            self._check_shards()
            if self._failed_jobs > self.policy.max_attempts:
                last = job_error(self._last_error) if self._last_error is not None else None
                self._book.fill_stats(self.stats)
                raise RunStopped(
                    f"{self._failed_jobs} Spark jobs in a row failed (last: {last}); stopping: the"
                    " checkpoint keeps the run's progress, fix the job and run again",
                    last,
                    self.stats,
                )
            if not self._run.source_done:
                skip = np.unique(self._book.table.idents)
                rows = RoundFilter("skip", skip, np.zeros(len(skip), dtype=np.uint16)) if len(skip) else _ALL
                if self._run_round(df, job, rows, backstop):
                    self._run.source_done = True
                    self.checkpoint.save_manifest(self._manifest)
            book = self._book
            book.settle_feed()
            book.expire()
            self._check_stalled(backstop)
            if self.commit_every == "round" and not len(book.table.pending()):
                self._commit_acked()
            book.write_dead_letters(self.dead_letters, lambda dead: self._dead_payloads(df, dead))
            self._check_budget()
            due = book.due_replays()
            if len(due):
                idents, attempts = book.table.idents[due], book.table.attempts[due] + 1
                roots = book.table.roots[due]
                if self._run_round(df, job, RoundFilter("select", idents, attempts.astype(np.uint16)), backstop):
                    self._check_found(roots)
                continue
            self._report()
            if self._run.source_done and not book.busy():
                return
            self._publish(in_job=False, every=self._reporter.interval if self._reporter else 0.0)
            self._log_progress()
            self._feed.wait(book.wait_time(self.progress_interval))

    def _run_round(self, df: Any, job: Callable[[Any], object], rows: RoundFilter, backstop: float) -> bool:
        """Run one job over the source (filtered by ``rows``); add what it started; True if the job succeeded."""
        round_no = self._run.next_round
        path = write_filter(self.checkpoint.path, round_no, rows)
        self._run.next_round = round_no + 1
        self.checkpoint.save_manifest(self._manifest)  # before any task can start a tree of this round
        tracked = self._frame(df, round_no, str(path), peek=False)
        ok = True
        stop: JobError | None = None
        self._publish(in_job=True, round_no=round_no, first_read=rows.mode != "select")
        group, watch, tally, hung = self._round_watch(round_no, rows)
        try:
            with group, watch:
                result = job(tracked)
                if self.output is not None:
                    self._stage(result, round_no)
        except OutputNotReturned:
            raise  # the job is wrong, not unlucky: a replay would fail the same way
        except Exception as err:  # noqa: BLE001 - any job failure is handled the same way
            ok = False
            error = job_error(err)
            stop = error if error.configuration else None
            if watch.verdict is None:  # a job the watch cancelled did not fail: the run stops below
                self.stats.job_errors += 1
                self._failed_jobs += 1
                self._last_error = err
                if stop is None:
                    log.warning(
                        "round %d's Spark job failed; its unfinished records will be replayed: %s", round_no, error
                    )
        finally:
            if hung is not None:
                self._feed.taps.remove(hung.observe)
        job_ended = self.clock()
        if isinstance(watch.verdict, HungRound):
            ok = False  # the round did not finish: what it did not read is read by the next one
            log.warning("round %d: %s", round_no, watch.verdict)
        self.stats.jobs += 1
        if ok:
            self._failed_jobs = 0
            self._job_ends[round_no] = self.clock()
        self._add_round(round_no)
        self._publish(in_job=False, round_no=round_no)
        self._book.start_deadline(round_no, backstop)
        self._collect_commit_errors()
        if isinstance(watch.verdict, BudgetExceeded):
            self._stop_round(df, round_no, watch, tally, job_ended)
        if not ok:
            self._book.fail_round(self.cluster, round_no)
            if stop is not None:
                # A replay cannot cure a wrong address list or credentials: stop, keeping the checkpoint.
                self._book.fill_stats(self.stats)
                raise RunStopped(
                    f"round {round_no}'s Spark job failed on a misconfiguration: {stop}. The run stopped (nothing "
                    "replayed, the job's unfinished trees failed); the checkpoint keeps its progress: fix the "
                    "configuration and run again with the same checkpoint",
                    stop,
                    self.stats,
                )
            self._probe_shards()
        return ok

    # -- checks while a round's job runs ----------------------------------------------

    def _round_watch(
        self, round_no: int, rows: RoundFilter
    ) -> tuple[JobGroup, RoundWatch, RoundTally | None, HungRoundCheck | None]:
        """The round's job group and its watch: the failure budget (the executors' files) and a hung task.

        The hung-task check observes the outcome feed from now on; the caller
        removes it from the feed's taps once the job has returned.
        """
        group = JobGroup(self.spark, f"{self._manifest.name}-r{round_no}", f"acker round {round_no}")
        checks: list[Check] = []
        tally = None
        if self.budget is not None:
            book, budget, tally = self._book, self.budget, self._book.round_tally(round_no, rows)
            checks.append(lambda: book.budget_error(budget, tally))
        hung = None
        if self.hang_grace is not None:
            hung = HungRoundCheck(self.checkpoint.path, round_no, self.clock, self.hang_grace)
            self._feed.taps.append(hung.observe)
            checks.append(hung)
        clear_stop(self.checkpoint.path)  # a stopped round's marker must not stop this one

        def cancel() -> None:
            request_stop(self.checkpoint.path, f"round {round_no}: {type(watch.verdict).__name__}")  # tasks, per batch
            group.cancel()  # and Spark, for tasks not running a bolt or reader that looks

        watch = RoundWatch(checks, cancel, clock=self.clock, interval=self.watch_interval)
        return group, watch, tally, hung

    def _stop_round(
        self, df: Any, round_no: int, watch: RoundWatch, tally: RoundTally | None, job_ended: float
    ) -> None:
        """The watch cancelled the round's job: fail its unfinished trees, write the dead letters due, stop the run.

        The trees the job left unfinished are failed at the ackers (their
        records are replayed by the next run); the records it never read stay
        unread in the checkpoint. What is settled now is dead-lettered, so the
        error names real records; the rest settles on the next run.
        """
        book = self._book
        book.fail_round(self.cluster, round_no)
        verdict: BudgetExceeded = watch.verdict
        assert self.budget is not None and tally is not None, "the budget is the only check that stops a round"
        # How far past its bound the round went: what its tasks had failed for good when the job stopped.
        seen = book.dead_count + tally.failed_for_good()  # the letters of this round are not written yet
        allowed = self.budget.allowed(verdict.read)
        dead_past = max(0, seen - allowed) if allowed is not None else 0
        book.settle_feed()
        book.write_dead_letters(self.dead_letters, lambda dead: self._dead_payloads(df, dead))
        # The counts: the tasks' (outcomes may still be on their way) or the book's, whichever saw more;
        # the examples: the dead letters' (they name record keys), else the executors' causes.
        dead, read = max(seen, book.dead_count), max(verdict.read, book.read_count)
        causes = book.dead_causes.top() if len(book.dead_causes) else verdict.causes
        error = self.budget.error(dead, read, causes)
        error.read_after = max(0, book.read_count - verdict.read)  # records read after the budget was seen passed
        error.seconds_after = max(0.0, job_ended - (watch.decided_at or job_ended))  # until the job had stopped
        error.dead_past = dead_past
        book.fill_stats(self.stats)
        error.stats = self.stats
        raise error

    def _check_budget(self) -> None:
        """Between rounds: stop the run if the records dead-lettered so far are past the budget."""
        if self.budget is None:
            return
        error = self._book.budget_error(self.budget)
        if error is not None:
            self._book.fill_stats(self.stats)
            error.stats = self.stats
            raise error

    def _frame(self, df: Any, round_no: int, filter_path: str, *, peek: bool) -> Any:
        source = self.spec.with_columns(df)
        reader = SourceReader(
            self.spec,
            self._manifest.salt,
            self._manifest.name,
            str(self.checkpoint.path),
            round_no,
            filter_path,
            self.cluster.addresses,
            self.security,
            self.client_options,
            peek=peek,
        )
        return source.mapInArrow(reader, reader_schema(source.schema, peek=peek))

    def _add_round(self, round_no: int) -> None:
        """Add what a round's tasks started to the book, refusing a source whose identities are not unique."""
        emissions = read_round(self.checkpoint.path, round_no)
        if emissions.duplicates:
            raise DuplicateIdentity(
                f"{emissions.duplicates} records of the source share their identity with another record"
                f" ({self._identity_name()} is not unique): their trees would be mixed up. Use a unique key column."
            )
        self._book.add_round(emissions, round_no)

    def _check_found(self, roots: np.ndarray) -> None:
        """After a replay round read the whole source, every replayed record must have been found again."""
        missing = len(self._book.table.in_state(roots, FAILED))
        if missing:
            raise UnstableIdentity(
                f"{missing} failed records were not found again when the source was re-read: the source changed, "
                f"{self._identity_name()} is not stable across reads, or the job did not run over all of its "
                "input. The checkpoint keeps the run's state."
            )

    def _identity_name(self) -> str:
        return f"key column {self.spec.column!r}" if self.spec.kind == "key" else f"the {self.spec.kind} identity"

    # -- output ---------------------------------------------------------------------------

    def _stage(self, result: Any, round_no: int) -> None:
        """Stage the job's output DataFrame under the checkpoint (executors stage, then ack, each batch)."""
        if not is_dataframe(result) or TRACKING_COLUMN not in result.columns:
            raise OutputNotReturned(
                f"the pipeline has an output ({self.output.describe() if self.output else ''}), so the job must return"
                f" its output DataFrame (the rows its last bolt emitted, with {TRACKING_COLUMN!r}), not"
                f" {type(result).__name__}: return the DataFrame instead of writing it or running an action"
            )
        stager = OutputStager(
            str(self.checkpoint.path),
            round_no,
            self._manifest.salt,
            self.cluster.addresses,
            self.security,
            self.client_options,
        )
        counts = result.mapInArrow(stager, stager_schema()).collect()
        self.stats.staged_rows += sum(row[0] for row in counts)

    def _commit_acked(self) -> None:
        """Commit the output of every ACKED delivery no commit took yet."""
        if self._commits is None:
            return
        table = self._book.table
        acked = np.flatnonzero(table.state == ACKED)
        fresh = acked[~np.isin(table.roots[acked], self._committed)]
        if not len(fresh):
            return
        roots, commits, rounds = table.roots[fresh], self._commits, table.rounds[fresh]
        # Every delivery of these rounds ends in this commit: their staged rows need no selection.
        whole = bool(np.isin(table.roots[np.isin(table.rounds, np.unique(rounds))], roots).all())
        self.stats.output_rows += self._commit_step(lambda: commits.commit(self.spark, roots, rounds, whole=whole))
        self.stats.output_commits += 1
        self._committed = np.union1d(self._committed, roots)

    def _commit_step(self, step: Callable[[], int]) -> int:
        """Run a commit step; if it fails once decided, finish the commit again from its log (up to ``max_attempts``).

        A commit's Spark jobs fail like any other (an executor lost, a Python
        worker killed: with no task retries, as on ``local[n]``, the job
        fails at once). Finishing a decided commit again writes the same rows
        (the destination's staging is replaced), so a transient failure costs
        a retry instead of the run. A failure before the commit was decided
        (``mode="error"`` refusing the destination) leaves nothing to finish
        and is raised as it is.
        """
        assert self._commits is not None
        try:
            return step()
        except Exception as first:  # noqa: BLE001 - any failure of the write is retried the same way
            error: Exception = first
        for attempt in range(2, self.policy.max_attempts + 1):
            if not self._commits.unfinished():
                break
            log.warning("output commit failed (%s); finishing it again, attempt %d", job_error(error), attempt)
            try:
                return self._commits.finish(self.spark)
            except Exception as again:  # noqa: BLE001 - as above
                error = again
        raise error

    def _check_stalled(self, backstop: float) -> None:
        """Stop a run whose successful job left every one of its trees pending: emitted rows that nothing acks."""
        limit = self.stall_after if self.stall_after is not None else backstop / 2
        now = self.clock()
        for round_no, ended in list(self._job_ends.items()):
            if now - ended < limit:
                continue
            del self._job_ends[round_no]
            table = self._book.table
            mine = table.rounds == round_slot(round_no)
            if not mine.any() or (table.state[mine] != PENDING).any():
                continue
            if len(self._book.undelivered) or self._errors or self._watch.down():
                continue  # acks that could not be delivered explain it: they end as ACKS_UNDELIVERED
            self._book.fill_stats(self.stats)
            raise RunStopped(
                f"round {round_no}'s Spark job succeeded {now - ended:.0f} s ago but none of its"
                f" {int(mine.sum())} trees has completed: rows a bolt emitted were never acked by a later step. "
                "Likely cause: the job ends with a Spark action or writer after a bolt (e.g."
                " bolt.apply_df(df).write.parquet(...)), or filters a bolt's output outside a bolt. Return the"
                " output DataFrame with SourcePipeline(..., output=FileOutput(...)) (exactly-once), or end the"
                " job with a sink bolt that emits nothing. The checkpoint keeps the run's state.",
                None,
                self.stats,
            )

    # -- settling -------------------------------------------------------------------------

    def _collect_commit_errors(self) -> None:
        """After a job: the bolts' dropped task commits (Spark accumulators), their roots journaled, reasons fixed."""
        fresh = self._baseline.since()  # this run's share only: a bolt may have run before
        if not fresh:
            return
        first = not self._errors
        self._errors = fresh
        self.stats.commit_errors = {name: r.errors for name, r in fresh.items()}
        roots = frozenset().union(*(r.roots for r in fresh.values()))
        self._book.add_undelivered(np.fromiter(roots, dtype=np.uint64, count=len(roots)))
        causes = sorted({c for r in fresh.values() for c in r.causes} | set(self._run.commit_causes))
        if causes != self._run.commit_causes:
            self._run.commit_causes = causes[:16]
            self.checkpoint.save_manifest(self._manifest)
        if first:
            # The driver's log, at once: the executors' warnings may be on other machines.
            log.warning(
                "executors could not deliver acks of bolts %s: %s; the affected records will fail as ACKS_UNDELIVERED",
                ", ".join(sorted(fresh)),
                "; ".join(causes),
            )

    def _check_undelivered(self) -> None:
        """Raise (or warn) if a record was dead-lettered because its acks could not be delivered.

        Deliveries that failed so but were acked on a replay (a short outage)
        are in the stats and the log only: the run did its work.
        """
        if not self.stats.acks_undelivered:
            return
        errors = dict(self._errors)
        recorded = tuple(self._run.commit_causes)
        if recorded and not any(r.causes for r in errors.values()):  # a resumed run: the first driver's causes
            errors["earlier drivers"] = CommitErrors("earlier drivers", 0, frozenset(), recorded)
        error = AcksUndelivered(self.stats, errors)
        if self.on_undelivered == "raise" and self._book.dead_for_undelivered():
            raise error
        log.warning("%s", error)

    # -- unreachable shards ---------------------------------------------------------------

    def _check_shards(self) -> None:
        """Raise ShardDown if a shard has been unreachable longer than ``shard_down_after``."""
        if self.shard_down_after is None:
            return
        down = self._watch.down_longer_than(self.shard_down_after)
        if down is not None:
            raise ShardDown(*down, self._filled_stats())

    def _probe_shards(self) -> None:
        """After a failed job: ask every shard for its Describe, marking those that do not answer as down.

        The driver sends little itself (the executors init and ack), so its
        client's error listener alone may never see a dead shard; a job failing
        because its tasks could not reach one is when to look.
        """
        for shard in range(self.cluster.shard_count):
            try:
                self.cluster.describe(shard)
            except ShardUnavailable as err:
                self._watch(err)
            except Exception:  # noqa: BLE001 - it answered (a refusal, an old server): reachable
                continue

    def _log_progress(self) -> None:
        """While the driver waits: one INFO line per ``log_interval`` with the counts and any shard it waits on."""
        if self._progress_mode == "bar" and not self._watch.down():
            return  # the bar shows the counts; a shard it waits on still gets its line
        self._progress.tick(self._filled_stats)

    # -- progress in sight ----------------------------------------------------------------

    def _start_progress(self) -> None:
        """Start the reporter thread (bar, log lines, progress.json) from the restored book."""
        self._round_rows = RoundRows(self.checkpoint.path)
        self._publish(in_job=False)
        meter = ProgressMeter(self._manifest.name, self.clock, stale_after=max(10.0, 5 * self.progress_file_interval))
        self._reporter = ProgressReporter(
            meter,
            lambda: self._baseline_view,
            self._live,
            checkpoint=self.checkpoint.path,
            mode=self._progress_mode,
            logger=log,
            file_interval=self.progress_file_interval,
            log_interval=self.log_interval,
            clock=self.clock,
        ).start()

    def _stop_progress(self, state: str) -> None:
        """Write the last figures (``finished`` or ``stopped``); a failure here must not hide the run's own error."""
        assert self._reporter is not None
        try:
            self._publish(in_job=False)
            self._reporter.stop(state)
        except Exception:  # noqa: BLE001 - the view of the run, not the run
            log.warning("could not write the run's last progress figures", exc_info=True)
        self._reporter = None

    def _publish(
        self, *, in_job: bool, round_no: int | None = None, first_read: bool = True, every: float = 0.0
    ) -> None:
        """Driver thread, where the book is consistent: the baseline the reporter adds live counts to.

        ``every``: skip if one was published less than that many seconds ago
        (the wait loop turns often; filling the stats reads the whole table).
        """
        if self._feed is None or self.book is None:
            return
        now = self.clock()
        if every and self._published_at is not None and now - self._published_at < every:
            return
        self._published_at = now
        self._book.fill_stats(self.stats)
        _, taken = self._feed.counts()
        stats = self.stats
        memory = self._run.memory_source
        records = stats.emitted if self._run.source_done else (int(memory["records"]) if memory else None)
        self._baseline_view = Baseline(
            read=stats.emitted,
            acked=stats.acked,
            pending=stats.pending,
            replaying=stats.awaiting_replay,
            dead=stats.dead_lettered,
            records=records,
            round=round_no if round_no is not None else max(0, self._run.next_round - 1),
            in_job=in_job,
            first_read=first_read,
            acked_taken=taken[0],
            failed_taken=taken[1],
        )

    def _live(self, base: Baseline) -> Live:
        """Reporter thread: the outcomes the feed received, and the running round's rows logged so far."""
        arrived, _ = self._feed.counts()
        started = self._round_rows.count(base.round) if base.in_job and self._round_rows is not None else 0
        return Live(started, *arrived)

    def _filled_stats(self) -> SourceStats:
        self._book.fill_stats(self.stats)
        return self.stats

    # -- dead letters ---------------------------------------------------------------------

    def _dead_payloads(self, df: Any, dead: np.ndarray) -> list[DeadLetterRow]:
        """Each dead record's ``(key, payload, reason, attempts)``: its last attempt read again (a peek round)."""
        table = self._book.table
        idents, attempts, reasons = table.idents[dead], table.attempts[dead], table.reason[dead]
        path = write_filter(self.checkpoint.path, _PEEK_ROUND, RoundFilter("select", idents, attempts))
        rows = self._frame(df, _PEEK_ROUND, str(path), peek=True).toArrow().to_pylist()
        reason_of = dict(zip(idents.view(np.int64).tolist(), reasons.tolist()))
        cause_of = dict(zip(idents.view(np.int64).tolist(), map(self._book.cause_of, table.roots[dead].tolist())))
        letters: list[DeadLetterRow] = []
        for row in rows:
            key, attempt, ident = row.pop(KEY_COLUMN), row.pop(ATTEMPT_COLUMN), row.pop(IDENT_COLUMN)
            letters.append((key, row, Outcome(reason_of[ident]), attempt, cause_of[ident]))
        if len(letters) != len(idents):
            log.warning("%d dead records were not found again in the source (changed?)", len(idents) - len(letters))
        return letters

    # -- reporting ------------------------------------------------------------------------

    def _report(self) -> None:
        if self.on_progress is not None:
            self._book.fill_stats(self.stats)
            self.on_progress(self.stats)

    def _backstop(self) -> float:
        return cluster_backstop(self.cluster)


_ALL = RoundFilter("all", _UNUSED, np.zeros(0, dtype=np.uint16))
