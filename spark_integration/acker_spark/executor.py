"""Executor side: run bolt logic over RDD (or DataFrame) partitions with held, deduplicated, retry-safe acks.

A :class:`Bolt` is created once on the driver and passed to ``rdd.mapPartitions``.
In each task it gives the user's function a collector whose acks and fails are
held; only when the partition is exhausted (the attempt's work is done) are they
sent, folded per root and tagged with a dedup key that every attempt of the same
task shares. A failing attempt sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

from acker_client import BoltCollector, ClusterClient, MessageId, ShardUnavailable, TrackedTuple, new_id
from acker_client.shared import close_shared_clients, shared_client
from acker_protocol.credentials import ChannelSecurity

from .ids import DeterministicEdgeIds, dedup_key

__all__ = ["Bolt", "BoltFunction", "UntrackedCollector", "client_for", "close_clients"]

log = logging.getLogger(__name__)

BoltFunction = Callable[[Iterator[TrackedTuple], Any], Iterable[TrackedTuple]]
"""``fn(tuples, collector) -> tuples emitted`` (usually a generator yielding ``collector.emit(...)``)."""


def client_for(addresses: Sequence[str], security: ChannelSecurity | None = None) -> ClusterClient:
    """This process's client for the cluster at ``addresses`` (the client library's per-process cache)."""
    # verify=False: the driver's spout already checked the shard layout, and an
    # executor must not fail its task because one acker is restarting right now.
    return shared_client(addresses, verify=False, security=security)


def close_clients() -> None:
    """Close the clients this process shares (tests, and drivers that ran bolts locally)."""
    close_shared_clients()


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
    comparisons). Create one Bolt per pipeline step: its uid salts the ids, so
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
    ) -> None:
        self.fn = fn
        self.addresses = tuple(addresses) if addresses is not None else None
        self.security = security  # TLS files and token: paths that must exist on the executors too
        self.name = name or getattr(fn, "__name__", "bolt")
        # Drawn once, on the driver: every task attempt of this step sees the same uid.
        self.uid = uid if uid is not None else new_id()
        self.commits: Any = None  # Spark accumulators, set by apply(); None when run outside Spark
        self.commit_errors: Any = None

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
            client_for(self.addresses, self.security), edge_ids=DeterministicEdgeIds(self.uid), hold=True
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
            # shard; the trees whose acks were dropped end as lost or timed out at
            # the spout and are replayed there.
            # INFO, not WARNING: an acker outage drops many commits at once, each is
            # counted in commit_errors, and the driver sees every affected record fail.
            log.info(
                "bolt %s partition %d: acks dropped, left to the spout's backstop: %s",
                self.name,
                partition,
                err,
            )
            if self.commit_errors is not None:
                self.commit_errors.add(1)
            return
        if self.commits is not None:
            self.commits.add(1)

    def __repr__(self) -> str:
        return f"Bolt({self.name!r}, uid={self.uid:#x}, tracking={self.tracking})"
