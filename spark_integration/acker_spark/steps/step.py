"""What every tracked pipeline step shares: identity, the executors' client, the held commit and its reports.

:class:`~acker_spark.steps.executor.Bolt` (row functions) and
:class:`~acker_spark.steps.arrow_bolt.ArrowBolt` (Arrow batches) differ in how a task
processes its partition; they commit and report the same way. A task's held
acks and fails are committed once its partition is done, tagged with the
task's dedup key. A commit that cannot reach a shard is not raised (Spark would
only retry against the same dead shard): it is logged as a warning and counted
in Spark accumulators that the driver reads after each job
(:func:`commit_errors`, :meth:`TrackedStep.commit_report`), so the pipeline can
report ``ACKS_UNDELIVERED`` instead of a plain timeout.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from acker_client import AckerError, ClusterClient, ShardUnavailable, new_id
from acker_client.shared import close_shared_clients, shared_client
from acker_protocol.credentials import ChannelSecurity
from acker_protocol.wire import owners_without_replica

from .ids import dedup_key
from .layout import check_layout
from .leases import LEASE_FRACTION, LeaseKeeper, check_seconds, cluster_timeouts

__all__ = ["CommitErrors", "TrackedStep", "client_for", "close_clients", "commit_errors", "tracked_bolts"]

log = logging.getLogger("acker_spark.executor")  # the name operators already filter on


def client_for(addresses: Sequence[str], security: ChannelSecurity | None = None, **options: Any) -> ClusterClient:
    """This process's client for the cluster at ``addresses`` (the client library's per-process cache).

    ``options`` are further :class:`~acker_client.ClusterClient` arguments (e.g. ``wait_for_shard``).
    """
    # verify=False: an executor must not fail its task because one acker is
    # restarting right now; TrackedStep.client checks the layout of the shards it reaches.
    return shared_client(addresses, verify=False, security=security, **options)


def close_clients() -> None:
    """Close the clients this process shares (tests, and drivers that ran bolts locally)."""
    close_shared_clients()


# How long a commit waits for a shard that refused at the task's start to answer again: more than
# the channels' longest reconnect backoff (1 s), so a shard back from a blip is found back.
_REPROBE_WAIT = 1.5
# A commit asks again only once the refusal it knows is this old: a shard that refused a moment ago
# (a dead acker, met by a short task) is withheld at once, so the other shards' acks, sent by the
# same commit, are not held up by the wait; a longer task (one that started during a cut) asks again.
_REPROBE_AFTER = 1.0
# Causes kept per bolt: enough to name every dead shard, bounded however many tasks fail.
_MAX_CAUSES = 16
# collector.fail(t, reason) reasons reported per task: bounded, so a task failing every
# record does not ship them all to the driver (the others' dead letters have no cause).
_MAX_REASONS_PER_TASK = 1_000


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
_tracked: weakref.WeakSet[TrackedStep] = weakref.WeakSet()


def tracked_bolts() -> list[TrackedStep]:
    """Driver side: the steps (Bolts and ArrowBolts) applied (with commit accumulators) in this process and still referenced."""
    return list(_tracked)


def commit_errors() -> dict[str, CommitErrors]:
    """Driver side: the commit errors of every bolt applied in this process, by bolt name (bolts with errors only).

    Call it after a job's action returned, e.g. in a ``foreachBatch`` function,
    to see whether executors could deliver their acks.
    """
    return CommitBaseline().since()  # no baseline taken: everything since the bolts were created


class CommitBaseline:
    """Driver side: the bolts' commit reports when a run started, so that the run reads only its own share.

    A bolt's accumulators count from its creation, and a bolt may have run
    before (another pipeline, an earlier run): :meth:`since` subtracts what
    each bolt had reported at :meth:`start`.
    """

    def __init__(self) -> None:
        self._before: weakref.WeakKeyDictionary[TrackedStep, CommitErrors] = weakref.WeakKeyDictionary()

    def start(self) -> None:
        """Take every tracked bolt's report now as the baseline."""
        self._before.update((bolt, bolt.commit_report()) for bolt in tracked_bolts())

    def since(self) -> dict[str, CommitErrors]:
        """The commit errors reported since :meth:`start`, by bolt name (bolts with new errors only)."""
        fresh: dict[str, CommitErrors] = {}
        for bolt in tracked_bolts():
            report, before = bolt.commit_report(), self._before.get(bolt)
            if before is not None:
                report = CommitErrors(
                    report.bolt, report.errors - before.errors, report.roots - before.roots, report.causes
                )
            if report.errors > 0:
                fresh[report.bolt] = merge_errors(fresh.get(report.bolt), report)
        return fresh


def merge_errors(a: CommitErrors | None, b: CommitErrors) -> CommitErrors:
    """Two reports of one bolt name as one."""
    if a is None:
        return b
    return CommitErrors(b.bolt, a.errors + b.errors, a.roots | b.roots, tuple(sorted({*a.causes, *b.causes})))


class TrackedStep:
    """A pipeline step's identity and commit: its acker addresses, uid, executor client options and accumulators.

    ``addresses=None`` runs the step without tracking. ``uid`` salts the step's
    edge ids and dedup keys (drawn once, on the driver, so every task attempt
    sees the same); ``client_options`` are further ClusterClient arguments for
    the executors' client (e.g. ``wait_for_shard``).

    Leases (:mod:`acker_spark.steps.leases`): while a task works, the trees it holds
    get ``reset_timeout`` every third of ``message_timeout`` (None: the
    ackers' own, asked once per executor process with Describe), for at most
    ``lease_cap`` seconds per tree (None: the ackers' ``--max-tree-lifetime``
    when they report one, else no cap); ``leases=False`` turns this off.
    """

    def __init__(
        self,
        name: str,
        addresses: Sequence[str] | None,
        *,
        uid: int | None = None,
        security: ChannelSecurity | None = None,
        client_options: dict[str, Any] | None = None,
        leases: bool = True,
        message_timeout: float | None = None,
        lease_cap: float | None = None,
    ) -> None:
        check_seconds("message_timeout", message_timeout)
        check_seconds("lease_cap", lease_cap)
        self.leases = leases
        self.message_timeout = message_timeout
        self.lease_cap = lease_cap
        self.name = name
        self.addresses = tuple(addresses) if addresses is not None else None
        self.security = security  # TLS files and token: paths that must exist on the executors too
        # A worker process shares one client per address list: the first step to use it sets these.
        self.client_options = dict(client_options or {})
        self.uid = uid if uid is not None else new_id()
        self.commits: Any = None  # Spark accumulators, set on first use; None outside classic Spark
        self.commit_errors: Any = None
        self.undelivered: Any = None  # roots whose acks were dropped (a set accumulator)
        self.commit_causes: Any = None  # one line per unreachable shard (a set accumulator)
        self._refused: dict[int, Any] = {}  # this task's shards that refused connections at its start
        self._refused_at = 0.0  # when they were last asked (time.monotonic)
        self.fail_reasons: Any = None  # (root, reason) given to collector.fail (a set accumulator)

    @property
    def tracking(self) -> bool:
        """True when acks and fails go to an acker cluster."""
        return self.addresses is not None

    def client(self) -> ClusterClient:
        """This executor process's client for the step's ackers."""
        assert self.addresses is not None, "an untracked step has no client"
        client = client_for(self.addresses, self.security, **self.client_options)
        # As the driver's client does (once per process and address list); the shards that
        # refuse connections now are withheld at this task's commit (see _commit).
        self._refused = check_layout(client, self.name)
        self._refused_at = time.monotonic()
        return client

    def start_leases(
        self, client: ClusterClient, task: tuple[int, int] | None = None, checkpoint: str | None = None
    ) -> LeaseKeeper | None:
        """Executor side: a started keeper renewing the task's held trees, or None (leases off, timeout unknown).

        With ``task`` (partition, task attempt id) and the pipeline's
        ``checkpoint``, the keeper also holds the trees the task's source
        reader started ahead of this step (:class:`~acker_spark.task_roots.ReaderTrees`).
        """
        if not self.leases:
            return None
        learned = cluster_timeouts(client) if self.message_timeout is None or self.lease_cap is None else None
        timeout = self.message_timeout or (learned.message_timeout if learned else None)
        if timeout is None:  # no acker answered (logged there): the task runs without leases
            return None
        # No cap of our own: the ackers' --max-tree-lifetime (renewing past it would be refused anyway).
        cap = self.lease_cap if self.lease_cap is not None else (learned.max_tree_lifetime if learned else None)
        keeper = LeaseKeeper(client.reset_timeout_columns, timeout * LEASE_FRACTION, cap=cap)
        if task is not None and checkpoint is not None:
            # Imported here: it reads Arrow files, and an RDD bolt's executors need not have pyarrow.
            from ..task_roots import ReaderTrees

            keeper.add_source(ReaderTrees(checkpoint, *task).new_roots)
        return keeper.start()

    def track_commits(self, sc: Any) -> None:
        """Create the commit and commit-error accumulators on first use (driver side)."""
        if self.commits is None:
            self.commits = sc.accumulator(0)
            self.commit_errors = sc.accumulator(0)
            self.undelivered = sc.accumulator(frozenset(), _SetUnion())
            self.commit_causes = sc.accumulator(frozenset(), _SetUnion())
            self.fail_reasons = sc.accumulator(frozenset(), _SetUnion())
            _tracked.add(self)

    def commit_report(self) -> CommitErrors:
        """Driver side: this bolt's task commits dropped so far, their trees and causes (read after an action)."""
        if self.commit_errors is None:
            return CommitErrors(self.name, 0, frozenset(), ())
        causes = tuple(sorted(self.commit_causes.value))[:_MAX_CAUSES]
        return CommitErrors(self.name, self.commit_errors.value, frozenset(self.undelivered.value), causes)

    def _report_undelivered(self, partition: int, roots: Any, causes: set[str]) -> None:
        """Log and count (accumulators, read by the driver) a task's trees whose acks did not reach their shard."""
        roots = frozenset(roots)
        log.warning(
            "bolt %s partition %d: could not deliver the task's acks to %s; its %d trees will fail as %s",
            self.name,
            partition,
            "; ".join(sorted(causes)),
            len(roots),
            "ACKS_UNDELIVERED",
        )
        if self.commit_errors is not None:
            self.commit_errors.add(1)
            self.undelivered.add(roots)
            self.commit_causes.add(frozenset(causes))

    def reasons(self) -> dict[int, str]:
        """Driver side: the reasons committed tasks gave ``collector.fail(t, reason)``, by root (read after an action)."""
        if self.fail_reasons is None:
            return {}
        return dict(self.fail_reasons.value)

    def _still_refused(self, refused: dict[int, Any]) -> dict[int, Any]:
        """Of the shards that refused connections at the task's start, those that still do (asked again now).

        A shard cut off for a moment when the task started (a network blip, an
        acker restarting) takes the task's operations again once it answers:
        withholding them for the rest of the task would drop acks a live acker
        could take, and replay their records.
        """
        if not refused or self.addresses is None:
            return refused
        client = client_for(self.addresses, self.security, **self.client_options)
        still: dict[int, Any] = {}
        for shard in refused:
            try:
                # Waiting a little: a channel back from a blip may still sit out its reconnect backoff.
                client.describe(shard, wait=_REPROBE_WAIT)
            except ShardUnavailable as err:
                # As at the task's start: only a refused connection counts (a slow answer may take the commit).
                # The wait ran out (DEADLINE_EXCEEDED): a probe that does not wait tells which it is.
                now = [_probed(client, f) for f in err.failures]
                now = [f for f in now if f.code is grpc.StatusCode.UNAVAILABLE]
                if now:
                    still[shard] = now[0]
            except AckerError:
                continue
        return still

    def _commit(self, collector: Any, partition: int, batch_key: int | None = None) -> None:
        """Send the collector's held acks and fails with the task's dedup key (or ``batch_key``, one batch's)."""
        if self._refused and time.monotonic() - self._refused_at >= _REPROBE_AFTER:
            self._refused = self._still_refused(self._refused)
            self._refused_at = time.monotonic()
        refused = self._refused
        withheld: tuple[int, ...] = ()
        if refused and self.addresses is not None:
            # Shards that refused connections at this task's start: the others' acks go out
            # now instead of after wait_for_shard, so downstream work (and their trees) is not held up.
            # With replicas 2 only trees whose both replicas refused are withheld.
            count = len(self.addresses)
            replicas = client_for(self.addresses, self.security, **self.client_options).replicas
            withheld = collector.withhold(owners_without_replica(set(refused), count, replicas), count)
        try:
            collector.commit(batch_key if batch_key is not None else dedup_key(self.uid, partition))
        except ShardUnavailable as err:
            # Failing the task would only make Spark retry against the same dead
            # shard; the trees whose acks were dropped are reported to the driver
            # (accumulators), which names the cause when they time out and fails
            # the run. A warning: an executor that cannot reach its ackers must be
            # visible in its log, not only as timeouts on the driver.
            client = client_for(self.addresses or (), self.security, **self.client_options)
            causes = {_cause(_probed(client, f)) for f in err.failures} | {_cause(f) for f in refused.values()}
            self._report_undelivered(partition, (*withheld, *collector.undelivered), causes)
            return
        if withheld:
            self._report_undelivered(partition, withheld, {_cause(f) for f in refused.values()})
        if self.commits is not None:
            self.commits.add(1)
            reasons = getattr(collector, "fail_reasons", None)
            if reasons:
                self.fail_reasons.add(frozenset(itertools.islice(reasons.items(), _MAX_REASONS_PER_TASK)))
                reasons.clear()  # reported: a per-batch commit does not send them again


def _probed(client: Any, failure: Any) -> Any:
    """``failure``, or for a deadline (the batch waited for a connection) what a Describe probe says happened.

    A batch waits for its shard's connection until its deadline, so a refused
    connection reads DEADLINE_EXCEEDED; a probe that does not wait reports the
    connection's own error (e.g. UNAVAILABLE: ... Connection refused).
    """
    if failure.code is not grpc.StatusCode.DEADLINE_EXCEEDED or not hasattr(client, "describe"):
        return failure
    try:
        client.describe(failure.shard)
    except ShardUnavailable as err:
        return err.failures[0] if err.failures else failure
    except AckerError:
        return failure
    return failure


def _cause(failure: Any) -> str:
    """One line naming an unreachable shard: its index, address and status (no counts, so tasks' lines merge)."""
    code = failure.code.name if failure.code is not None else "ERROR"
    return f"shard {failure.shard} at {failure.address}: {code}: {failure.detail}"
