"""ArrowBolt: a tracked processing step over a DataFrame's Arrow batches (``mapInArrow``), column-wise.

``ArrowBolt(fn, addresses, schema="word string, n long")`` calls
``fn(batch, collector)`` once per Arrow batch of each partition. ``batch`` holds
the input's user columns (a ``pyarrow.RecordBatch``, or a pandas DataFrame with
``pandas=True``); ``fn`` emits output batches with ``collector.emit(out,
anchors)``, where ``anchors[k]`` is the input row output row ``k`` derives from
(-1: unanchored), and may fail input rows with ``collector.fail(rows)`` (an index
array, boolean mask or slice) or ack them early with ``collector.ack(rows)``.
**Every input row neither acked nor failed is acked when ``fn`` returns for its
batch** (Storm's BasicBolt), so ``fn`` must have done the row's work by then:
a sink writes its rows, then returns.

Everything per batch is numpy and pyarrow: ids are decoded from the Arrow
buffers, child edge ids derived in one expression, acks XOR-folded per root.
A batch's fails and folded acks are committed once the batch's output has
been handed on (``commit_every="batch"``, the default), tagged with a dedup key
derived from what they carry, so a task that dies half-way has already
committed the batches before the failure and a re-run that repeats a batch
exactly is ignored by the ackers; ``commit_every="task"`` holds them until the
partition is fully processed, as :class:`~acker_spark.steps.executor.Bolt` does, and
sends one commit tagged with the task's dedup key. It runs on classic Spark and
on Spark Connect alike (no ``df.rdd``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from acker_protocol.credentials import ChannelSecurity

from ..causes import CauseWriter, task_checkpoint
from ..job_errors import job_error
from ..round_stop import StopCheck
from ..session import spark_context_of
from .arrow_collector import ArrowCollector
from .frames import TRACKING_COLUMN, PairColumn, decode_ids, require_tracking_column, tracked_schema
from .fusion import map_in_arrow
from .isolation import NotIsolated, failure_rate, run_isolated
from .leases import LeaseKeeper, check_seconds
from .step import TrackedStep
from .time_limit import RecordTimeLimit, call_time_limit

__all__ = ["ArrowBolt", "ArrowFunction", "RecordTimeLimit"]

ArrowFunction = Callable[[Any, ArrowCollector], None]
"""``fn(batch, collector)``: emits with ``collector.emit(out, anchors)``, may ``fail``/``ack`` rows, returns None."""


class ArrowBolt(TrackedStep):
    """One columnar step of a tracked DataFrame pipeline: ``bolt.apply_df(df)`` runs it with ``mapInArrow``.

    ``schema`` (a StructType, a DDL string, or None for a sink that emits
    nothing) describes the emitted columns; the result has them plus
    ``_acker_ids``. ``fn`` must be deterministic per input row (the same
    children, in the same order), so that a re-run derives the same edge ids.
    ``addresses=None`` runs the same function without tracking. Create one
    ArrowBolt per pipeline step: its uid salts the step's ids. While a task
    runs, its trees' timeouts are extended (``leases``, ``message_timeout``,
    ``lease_cap``: see :class:`~acker_spark.steps.step.TrackedStep`). ``commit_every``:
    ``"batch"`` (default) sends each input batch's acks and fails once its
    output has been handed on, ``"task"`` once the whole partition is done.
    ``on_error``: when ``fn`` raises for a batch, ``"isolate"`` (default) calls
    it again on pieces of the batch until each row that raises is alone, and
    fails just those rows with the exception as their reason (``Type: message
    (at file:line in function)``: the dead letter's cause), keeping what ``fn``
    did for every other row; once rows raised, later batches run in slices sized
    to the failure rate, so a few raising rows cost about themselves
    (:mod:`acker_spark.steps.isolation`). An exception that is not a poison type (``ValueError``,
    ``KeyError``, ``TypeError``, decode errors: :data:`~acker_spark.job_errors.POISON_ERRORS`)
    raised by the first eight rows alone with none succeeding fails the task
    instead (a failing service, not a bad record: Spark retries the task).
    ``"raise"`` always fails the task, as Spark does.
    ``time_limit`` (seconds, None: none): each call of ``fn`` may run that
    long; past it a timer raises :class:`~acker_spark.steps.time_limit.RecordTimeLimit`
    (a ``TimeoutError``) inside the call, which the isolation treats as any
    exception, so a record slower than ``time_limit`` on its own is failed
    alone with cause ``RecordTimeLimit: ...`` and replayed per the policy
    (a timeout, not poison). The limit is per call, so set it above what a
    whole Arrow batch normally takes (``spark.sql.execution.arrow.maxRecordsPerBatch``
    rows); needs ``on_error="isolate"`` (see :mod:`acker_spark.steps.time_limit`).
    """

    def __init__(
        self,
        fn: ArrowFunction,
        addresses: Sequence[str] | None,
        *,
        schema: Any,
        name: str | None = None,
        uid: int | None = None,
        security: ChannelSecurity | None = None,
        pandas: bool = False,
        client_options: dict[str, Any] | None = None,
        leases: bool = True,
        message_timeout: float | None = None,
        lease_cap: float | None = None,
        commit_every: str = "batch",
        on_error: str = "isolate",
        time_limit: float | None = None,
    ) -> None:
        if on_error not in ("isolate", "raise"):
            raise ValueError(f'on_error must be "isolate" or "raise", got {on_error!r}')
        self.on_error = on_error
        check_seconds("time_limit", time_limit)
        self.time_limit = time_limit
        if commit_every not in ("batch", "task"):
            raise ValueError(f'commit_every must be "batch" or "task", got {commit_every!r}')
        self.commit_every = commit_every
        super().__init__(
            name or getattr(fn, "__name__", None) or type(fn).__name__,
            addresses,
            uid=uid,
            security=security,
            client_options=client_options,
            leases=leases,
            message_timeout=message_timeout,
            lease_cap=lease_cap,
        )
        self.fn = fn
        self._schema_spec = schema
        self._schema: Any = None
        self.pandas = pandas
        self._arrow_schema: pa.Schema | None = None

    @property
    def schema(self) -> Any:
        """The result's StructType: the output columns plus ``_acker_ids`` (a DDL string is parsed on first use)."""
        if self._schema is None:
            # Parsing DDL needs a live session, which an ArrowBolt made before it may not have.
            self._schema = tracked_schema(self._schema_spec)
        return self._schema

    @property
    def output_schema(self) -> pa.Schema | None:
        """The Arrow schema ``emit`` casts to (the user columns, without ``_acker_ids``); None for a sink."""
        if self._arrow_schema is None and len(self.schema.fields) > 1:
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            self._arrow_schema = to_arrow_schema(StructType(self.schema.fields[:-1]), timezone="UTC")
        return self._arrow_schema

    def apply_df(self, df: Any) -> Any:
        """``df.mapInArrow`` over this bolt: the emitted rows as a DataFrame of ``schema`` plus ``_acker_ids``.

        ``df`` must carry ``_acker_ids`` (binary, or ``array<binary>`` after a
        ``groupBy`` with ``F.collect_list("_acker_ids")``). Run an action on the
        result (``.count()`` for a sink) to make it do its work.
        """
        require_tracking_column(df.columns)
        sc = spark_context_of(df.sparkSession)
        if sc is not None:
            self.track_commits(sc)
        self.output_schema  # noqa: B018 - resolved on the driver, shipped with the bolt
        bolt = self

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            context = TaskContext.get()
            if context is None:
                raise RuntimeError(f"bolt {bolt.name!r} called outside a Spark task: use run_batches(index, batches)")
            return bolt.run_batches(context.partitionId(), batches, context.taskAttemptId())

        return map_in_arrow(df, run, self.schema)  # one Python pass with the step before, where it can

    def run_batches(
        self, partition: int, batches: Iterable[pa.RecordBatch], task_attempt: int = 0
    ) -> Iterator[pa.RecordBatch]:
        """Run the function over one partition's batches, then commit its held acks and fails (task's dedup key)."""
        client = self.client() if self.tracking else None
        collector = ArrowCollector(self.uid if self.tracking else None, self.output_schema, client)
        checkpoint = task_checkpoint() if self.tracking else None
        keeper = self.start_leases(client, (partition, task_attempt), checkpoint) if client is not None else None
        causes = CauseWriter(checkpoint, f"{self.uid:016x}-p{partition}-t{task_attempt}") if checkpoint else None
        stop = StopCheck(checkpoint)  # the pipeline stopped the round (failure budget): end before the next batch
        try:
            try:
                for batch in batches:
                    stop()
                    yield from self._process(batch, collector, keeper)
                    if self.tracking and self.commit_every == "batch":
                        # Its output was taken downstream: the batch's work is done.
                        if causes is not None:
                            causes.write(collector.fail_reasons)  # on disk before the fails they explain
                        self._commit(collector, partition, batch_key=collector.content_key(self.uid))
            except BaseException:
                # Includes GeneratorExit (the consumer stopped early): the work is not
                # done, so nothing may reach a ledger; Spark's retry redoes it all.
                collector.discard()
                raise
            if self.tracking and self.commit_every == "task":
                if causes is not None:
                    causes.write(collector.fail_reasons)
                self._commit(collector, partition)
        finally:
            if causes is not None:
                causes.close()
            # After the commit: until its acks are sent, the task's trees cannot complete.
            if keeper is not None:
                keeper.stop()

    def _process(
        self, batch: pa.RecordBatch, collector: ArrowCollector, keeper: LeaseKeeper | None = None
    ) -> list[pa.RecordBatch]:
        names = batch.schema.names
        if TRACKING_COLUMN not in names:
            raise ValueError(f"bolt {self.name!r}: the input batch has no {TRACKING_COLUMN!r} column ({names})")
        index = names.index(TRACKING_COLUMN)
        if self.tracking:
            parents = decode_ids(batch.column(index))
            if keeper is not None:
                keeper.hold_column(parents.roots)
        else:
            parents = PairColumn(np.zeros(batch.num_rows + 1, dtype=np.int64), *_no_pairs())
        user = batch.remove_column(index)
        if self.on_error == "raise" or user.num_rows == 0:
            return self._run_rows(user, parents, collector, 0, user.num_rows, isolating=False)
        return run_isolated(
            user.num_rows,
            lambda start, stop: self._run_rows(user, parents, collector, start, stop),
            lambda row, err: self._fail_alone(parents, collector, row, err),
            failure_rate(self.uid),
            self.name,
        )

    def _run_rows(
        self,
        user: pa.RecordBatch,
        parents: PairColumn,
        collector: ArrowCollector,
        start: int,
        stop: int,
        isolating: bool = True,
    ) -> list[pa.RecordBatch]:
        """``fn`` over rows ``[start, stop)`` of ``user``: what it emitted, or its exception with its work rolled back."""
        whole = start == 0 and stop == user.num_rows
        mark = collector._mark()
        collector._start_batch(parents if whole else parents.take(np.arange(start, stop)))
        rows = user if whole else user.slice(start, stop - start)
        try:
            with call_time_limit(self.time_limit, f"bolt {self.name!r}"):
                result = self.fn(rows.to_pandas() if self.pandas else rows, collector)
        except Exception:
            collector._roll_back(mark)
            raise
        if result is not None:
            mistake = TypeError(
                f"bolt {self.name!r}: the function returned {type(result).__name__}; it must emit with"
                f" collector.emit(batch, anchors) and return None"
            )
            raise NotIsolated(mistake) if isolating else mistake
        return collector._finish_batch()

    def _fail_alone(
        self, parents: PairColumn, collector: ArrowCollector, row: int, err: Exception
    ) -> list[pa.RecordBatch]:
        """Row ``row`` raised on its own: fail it with the exception as its reason (its record is poison or unlucky)."""
        collector._start_batch(parents.take(np.arange(row, row + 1)))
        collector.fail(0, reason=str(job_error(err)))
        return collector._finish_batch()

    def __repr__(self) -> str:
        return f"ArrowBolt({self.name!r}, uid={self.uid:#x}, tracking={self.tracking}, pandas={self.pandas})"


def _no_pairs() -> tuple[np.ndarray, np.ndarray]:
    empty = np.zeros(0, dtype=np.uint64)
    return empty, empty
