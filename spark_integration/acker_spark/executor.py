"""Executor side: run bolt logic over RDD (or DataFrame) partitions with held, deduplicated, retry-safe acks.

A :class:`Bolt` is created once on the driver and passed to ``rdd.mapPartitions``.
In each task it gives the user's function a collector whose acks and fails are
held; only when the partition is exhausted (the attempt's work is done) are they
sent, folded per root and tagged with a dedup key that every attempt of the same
task shares. A failing attempt sends nothing.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from acker_client import BoltCollector, ClusterClient, MessageId, ShardUnavailable, TrackedTuple, new_id
from acker_client.shared import close_shared_clients, shared_client
from acker_protocol.credentials import ChannelSecurity

from .ids import DeterministicEdgeIds, dedup_key

__all__ = [
    "Bolt",
    "BoltFunction",
    "CommitErrors",
    "UntrackedCollector",
    "client_for",
    "close_clients",
    "commit_errors",
]

log = logging.getLogger(__name__)

BoltFunction = Callable[[Iterator[TrackedTuple], Any], Iterable[TrackedTuple]]
"""``fn(tuples, collector) -> tuples emitted`` (usually a generator yielding ``collector.emit(...)``)."""


def client_for(addresses: Sequence[str], security: ChannelSecurity | None = None, **options: Any) -> ClusterClient:
    """This process's client for the cluster at ``addresses`` (the client library's per-process cache).

    ``options`` are further :class:`~acker_client.ClusterClient` arguments (e.g. ``wait_for_shard``).
    """
    # verify=False: the driver's spout already checked the shard layout, and an
    # executor must not fail its task because one acker is restarting right now.
    return shared_client(addresses, verify=False, security=security, **options)


def close_clients() -> None:
    """Close the clients this process shares (tests, and drivers that ran bolts locally)."""
    close_shared_clients()


# Causes kept per bolt: enough to name every dead shard, bounded however many tasks fail.
_MAX_CAUSES = 16


class _SetUnion:
    """A Spark AccumulatorParam: sets merged by union (roots and causes reported by tasks)."""

    def zero(self, value: frozenset[Any]) -> frozenset[Any]:
        """The empty set."""
        return frozenset()

    def addInPlace(self, a: frozenset[Any], b: frozenset[Any]) -> frozenset[Any]:  # noqa: N802 - Spark's name
        """The union of two partial results."""
        return a | b


@dataclass(frozen=True)
class CommitErrors:
    """What the executors of one bolt reported so far: task commits dropped, the trees and why.

    ``roots`` are the trees whose acks never reached their acker; ``causes``
    name the shards that could not be reached (one line each).
    """

    bolt: str
    errors: int
    roots: frozenset[int]
    causes: tuple[str, ...]


# Every Bolt whose accumulators were created in this (driver) process: the pipeline
# reads their reports after each job without the user handing it the bolts.
_tracked: weakref.WeakSet[Bolt] = weakref.WeakSet()


def tracked_bolts() -> list[Bolt]:
    """Driver side: the bolts applied (with commit accumulators) in this process and still referenced."""
    return list(_tracked)


def commit_errors() -> dict[str, CommitErrors]:
    """Driver side: the commit errors of every bolt applied in this process, by bolt name (bolts with errors only).

    Call it after a job's action returned, e.g. in a ``foreachBatch`` function,
    to see whether executors could deliver their acks.
    """
    report: dict[str, CommitErrors] = {}
    for bolt in tracked_bolts():
        mine = bolt.commit_report()
        if mine.errors:
            report[mine.bolt] = merge_errors(report.get(mine.bolt), mine)
    return report


def merge_errors(a: CommitErrors | None, b: CommitErrors) -> CommitErrors:
    """Two reports of one bolt name as one."""
    if a is None:
        return b
    return CommitErrors(b.bolt, a.errors + b.errors, a.roots | b.roots, tuple(sorted({*a.causes, *b.causes})))


class UntrackedCollector:
    """A collector with the BoltCollector API that tracks nothing (a pipeline run without the acker)."""

    def emit(self, value: Any, anchors: Sequence[TrackedTuple] = ()) -> TrackedTuple:
        """Wrap ``value`` with no tracking."""
        return TrackedTuple(value, MessageId.EMPTY)

    def ack(self, t: TrackedTuple) -> None:
        """Do nothing."""

    def fail(self, t: TrackedTuple) -> None:
        """Do nothing."""

    def reset_timeout(self, t: TrackedTuple) -> None:
        """Do nothing."""


class Bolt:
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
    two steps sharing a Bolt would look like re-runs of each other.
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
    ) -> None:
        self.fn = fn
        # Further ClusterClient arguments for the executors' client, e.g. {"wait_for_shard": 5.0}:
        # how long a task's commit waits for an unreachable acker before its acks are dropped.
        # A worker process shares one client per address list: the first bolt to use it sets them.
        self.client_options = dict(client_options or {})
        self.addresses = tuple(addresses) if addresses is not None else None
        self.security = security  # TLS files and token: paths that must exist on the executors too
        self.name: str = name or str(getattr(fn, "__name__", "bolt"))
        # Drawn once, on the driver: every task attempt of this step sees the same uid.
        self.uid = uid if uid is not None else new_id()
        self.commits: Any = None  # Spark accumulators, set by apply(); None when run outside Spark
        self.commit_errors: Any = None
        self.undelivered: Any = None  # roots whose acks were dropped (a set accumulator)
        self.commit_causes: Any = None  # one line per unreachable shard (a set accumulator)

    @property
    def tracking(self) -> bool:
        """True when acks and fails go to an acker cluster."""
        return self.addresses is not None

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

    def track_commits(self, sc: Any) -> None:
        """Create the commit and commit-error accumulators on first use (driver side)."""
        if self.commits is None:
            self.commits = sc.accumulator(0)
            self.commit_errors = sc.accumulator(0)
            self.undelivered = sc.accumulator(frozenset(), _SetUnion())
            self.commit_causes = sc.accumulator(frozenset(), _SetUnion())
            _tracked.add(self)

    def commit_report(self) -> CommitErrors:
        """Driver side: this bolt's task commits dropped so far, their trees and causes (read after an action)."""
        if self.commit_errors is None:
            return CommitErrors(self.name, 0, frozenset(), ())
        causes = tuple(sorted(self.commit_causes.value))[:_MAX_CAUSES]
        return CommitErrors(self.name, self.commit_errors.value, frozenset(self.undelivered.value), causes)

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
        collector = BoltCollector(
            client_for(self.addresses, self.security, **self.client_options),
            edge_ids=DeterministicEdgeIds(self.uid),
            hold=True,
        )
        try:
            yield from self.fn(iter(tuples), collector)
        except BaseException:
            # Includes GeneratorExit (the consumer stopped early): the work is not
            # done, so nothing may reach a ledger; Spark's retry redoes it all.
            collector.discard()
            raise
        self._commit(collector, partition)

    def _commit(self, collector: BoltCollector, partition: int) -> None:
        try:
            collector.commit(dedup_key(self.uid, partition))
        except ShardUnavailable as err:
            # Failing the task would only make Spark retry against the same dead
            # shard; the trees whose acks were dropped are reported to the driver
            # (accumulators), which names the cause when they time out and fails
            # the run. A warning: an executor that cannot reach its ackers must be
            # visible in its log, not only as timeouts on the driver.
            causes = frozenset(_cause(f) for f in err.failures)
            log.warning(
                "bolt %s partition %d: could not deliver the task's acks to %s; its %d trees will fail as %s",
                self.name,
                partition,
                "; ".join(sorted(causes)),
                len(collector.undelivered),
                "ACKS_UNDELIVERED",
            )
            if self.commit_errors is not None:
                self.commit_errors.add(1)
                self.undelivered.add(frozenset(collector.undelivered))
                self.commit_causes.add(causes)
            return
        if self.commits is not None:
            self.commits.add(1)

    def __repr__(self) -> str:
        return f"Bolt({self.name!r}, uid={self.uid:#x}, tracking={self.tracking})"


def _cause(failure: Any) -> str:
    """One line naming an unreachable shard: its index, address and status (no counts, so tasks' lines merge)."""
    code = failure.code.name if failure.code is not None else "ERROR"
    return f"shard {failure.shard} at {failure.address}: {code}: {failure.detail}"
