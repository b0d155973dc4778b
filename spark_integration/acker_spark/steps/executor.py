"""Executor side: run bolt logic over RDD (or DataFrame) partitions with held, deduplicated, retry-safe acks.

A :class:`Bolt` is created once on the driver and passed to ``rdd.mapPartitions``.
In each task it gives the user's function a collector whose acks and fails are
held; only when the partition is exhausted (the attempt's work is done) are they
sent, folded per root and tagged with a dedup key that every attempt of the same
task shares. A failing attempt sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

from acker_client import BoltCollector, MessageId, TrackedTuple
from acker_protocol.credentials import ChannelSecurity

from .ids import DeterministicEdgeIds
from .leases import LeaseKeeper
from .step import (  # re-exported: the executor module is where users and the pipeline look for them
    CommitErrors,
    TrackedStep,
    client_for,
    close_clients,
    commit_errors,
    merge_errors,
    tracked_bolts,
)

__all__ = [
    "Bolt",
    "BoltFunction",
    "CommitErrors",
    "UntrackedCollector",
    "client_for",
    "close_clients",
    "commit_errors",
    "merge_errors",
    "tracked_bolts",
]

BoltFunction = Callable[[Iterator[TrackedTuple], Any], Iterable[TrackedTuple]]
"""``fn(tuples, collector) -> tuples emitted`` (usually a generator yielding ``collector.emit(...)``)."""


class UntrackedCollector:
    """A collector with the BoltCollector API that tracks nothing (a pipeline run without the acker)."""

    def emit(self, value: Any, anchors: Sequence[TrackedTuple] = ()) -> TrackedTuple:
        """Wrap ``value`` with no tracking."""
        return TrackedTuple(value, MessageId.EMPTY)

    def ack(self, t: TrackedTuple) -> None:
        """Do nothing."""

    def fail(self, t: TrackedTuple, reason: str | None = None) -> None:
        """Do nothing."""

    def reset_timeout(self, t: TrackedTuple) -> None:
        """Do nothing."""


class Bolt(TrackedStep):
    """One processing step of a tracked pipeline: ``bolt.apply(rdd)`` or ``bolt.apply_df(df, schema)``.

    ``fn(tuples, collector)`` receives the partition's TrackedTuples and yields
    the tuples it emits (``collector.emit(value, anchors=[t])``); it acks or fails
    every input. It must be deterministic: the same outputs, in the same order,
    for the same input tuple, so that a re-run reproduces the same edge ids.

    ``addresses=None`` runs the same function without tracking (for overhead
    comparisons). ``client_options`` are further ClusterClient arguments for the
    executors' client (e.g. ``wait_for_shard``). A task whose acks cannot be
    delivered logs a warning and is reported to the driver through the
    ``commit_errors``, ``undelivered`` and ``commit_causes`` accumulators
    (:meth:`commit_report`); the pipeline turns that into ``ACKS_UNDELIVERED``. Create one Bolt per pipeline step: its uid salts the ids, so
    two steps sharing a Bolt would look like re-runs of each other. While a
    task runs, its trees' timeouts are extended (``leases``, ``message_timeout``,
    ``lease_cap``: see :class:`~acker_spark.steps.step.TrackedStep`).
    """

    def __init__(
        self,
        fn: BoltFunction,
        addresses: Sequence[str] | None,
        *,
        name: str | None = None,
        uid: int | None = None,
        security: ChannelSecurity | None = None,
        client_options: dict[str, Any] | None = None,
        leases: bool = True,
        message_timeout: float | None = None,
        lease_cap: float | None = None,
    ) -> None:
        super().__init__(
            name or str(getattr(fn, "__name__", "bolt")),
            addresses,
            uid=uid,
            security=security,
            client_options=client_options,
            leases=leases,
            message_timeout=message_timeout,
            lease_cap=lease_cap,
        )
        self.fn = fn

    def apply(self, rdd: Any) -> Any:
        """``rdd.mapPartitions(self)``, counting commits and commit errors in Spark accumulators."""
        self.track_commits(rdd.context)
        return rdd.mapPartitions(self)

    def apply_df(self, df: Any, schema: Any = None) -> Any:
        """Run over a tracked DataFrame (with an ``_acker_ids`` column); return what it emits as one.

        ``schema`` (a StructType or DDL string such as ``"word string, n int"``)
        describes the emitted values; the result has those columns plus
        ``_acker_ids``. ``None``: the bolt emits nothing (a sink). Input values
        are Rows without the tracking column. Runs on ``mapInArrow`` (classic
        Spark and Spark Connect; needs pyarrow), through this bolt's own
        ``run_partition``. For column-wise functions see :class:`acker_spark.ArrowBolt`.
        Run an action (such as ``.count()``) on the result to make it do its work.
        """
        from .arrow_rows import map_rows  # pyarrow only for DataFrames: the RDD path does without

        return map_rows(self, df, schema)

    def __call__(self, tuples: Iterator[TrackedTuple]) -> Generator[TrackedTuple, None, None]:
        """The mapPartitions function: the partition index comes from Spark's TaskContext."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise RuntimeError(f"bolt {self.name!r} called outside a Spark task: use run_partition(index, tuples)")
        return self.run_partition(context.partitionId(), tuples)

    def run_partition(self, partition: int, tuples: Iterable[TrackedTuple]) -> Generator[TrackedTuple, None, None]:
        """Run the function over one partition, then commit its held acks and fails (task's dedup key)."""
        if not self.tracking:
            yield from self.fn(iter(tuples), UntrackedCollector())
            return
        assert self.addresses is not None
        client = self.client()
        collector = BoltCollector(client, edge_ids=DeterministicEdgeIds(self.uid), hold=True)
        keeper = self.start_leases(client)
        checkpoint = _task_checkpoint()
        reasons = _ReasonsKept(collector) if checkpoint else None
        try:
            try:
                inputs = _holding(iter(tuples), keeper) if keeper else iter(tuples)
                yield from self.fn(inputs, reasons if reasons is not None else collector)
            except BaseException:
                # Includes GeneratorExit (the consumer stopped early): the work is not
                # done, so nothing may reach a ledger; Spark's retry redoes it all.
                collector.discard()
                raise
            if checkpoint and reasons is not None and reasons.by_root:
                # On disk before the fails they explain: the driver decides a failed record's fate by its cause.
                from ..causes import CauseWriter

                writer = CauseWriter(checkpoint, f"{self.uid:016x}-p{partition}-{_task_attempt()}")
                try:
                    writer.write(reasons.by_root)
                finally:
                    writer.close()
            self._commit(collector, partition)
        finally:
            # After the commit: until its acks are sent, the task's trees cannot complete.
            if keeper is not None:
                keeper.stop()

    def __repr__(self) -> str:
        return f"Bolt({self.name!r}, uid={self.uid:#x}, tracking={self.tracking})"


class _ReasonsKept:
    """The task's collector, keeping the reason of each ``fail(t, reason)`` by root for the checkpoint's causes."""

    def __init__(self, collector: BoltCollector) -> None:
        self.collector = collector
        self.by_root: dict[int, str] = {}
        # Bound once: emit and ack run per tuple and must not pay for a delegation.
        self.emit = collector.emit
        self.ack = collector.ack
        self.reset_timeout = collector.reset_timeout

    def fail(self, t: TrackedTuple, reason: str | None = None) -> None:
        """Fail ``t`` as the collector does, keeping ``reason`` for each of its trees."""
        self.collector.fail(t, reason)
        if reason:
            for root in t.message_id.roots:
                self.by_root[root] = reason  # the last reason given, as the collector keeps it

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collector, name)


def _task_checkpoint() -> str | None:
    """The checkpoint the running pipeline names for this task's causes (None outside one, or without pyarrow)."""
    try:
        from ..causes import task_checkpoint  # pyarrow: only where a pipeline that reads on executors runs
    except ImportError:
        return None
    return task_checkpoint()


def _task_attempt() -> int:
    """This Spark task attempt's id (unique in the application), naming its causes file."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.taskAttemptId() if context is not None else 0


def _holding(tuples: Iterator[TrackedTuple], keeper: LeaseKeeper) -> Iterator[TrackedTuple]:
    """``tuples``, each tuple's trees handed to the lease keeper as the function reads it."""
    hold = keeper.hold
    for t in tuples:
        if t._root:  # one tree, the commonest case: its root without making a MessageId
            hold(t._root)
        else:
            for root in t.message_id.roots:
                hold(root)
        yield t
