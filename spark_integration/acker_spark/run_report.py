"""What a run reports: its counters (:class:`RunStats`) and the errors that end it, for every driver of the package.

The batch driver :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline`
and the stream fill the same :class:`RunStats` and raise the same errors, so a
caller handles a run the same way whichever ran it. ``SourceStats`` is the
name the batch driver's stats had before: it stays as an alias of :class:`RunStats`.

Everything that ends a run derives from :class:`RunError`, as everything the
client raises derives from ``acker_client.AckerError``: ``except RunError`` handles
a stopped run, a mistaken job, a source without stable identities or a dead
shard alike, with the run's stats. Each error also keeps the built-in base it
had (``TypeError`` for a mistaken job, ``ValueError`` for a bad source,
``RuntimeError``, ``AckerError``), so handlers written for those still match.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from acker_client import AckerError

if TYPE_CHECKING:
    from .job_errors import JobError
    from .steps.step import CommitErrors

__all__ = [
    "AcksUndelivered",
    "DownShard",
    "RecordsFailed",
    "RunError",
    "RunStats",
    "RunStopped",
    "ShardDown",
    "SourceStats",
]


@dataclass
class RunStats:
    """What a run did. Per-record counts: emitted, acked, dead_lettered; per-delivery: the rest.

    The drivers compute the counts from their checkpoint, so a resumed run
    counts the whole run.
    """

    emitted: int = 0  # distinct records read or taken from the source
    acked: int = 0
    failed: int = 0  # deliveries that ended FAILED (a bolt failed a tuple)
    timed_out: int = 0  # ... TIMED_OUT (the acker's timeout)
    lost: int = 0  # ... LOST (the spout's backstop: the outcome never came, or a driver died with it in flight)
    replayed: int = 0  # deliveries after the first
    dead_lettered: int = 0
    attempts: int = 0  # all deliveries: emitted + replayed
    pending: int = 0  # trees in flight now
    awaiting_replay: int = 0  # failed records waiting for their backoff
    jobs: int = 0  # Spark jobs this driver ran (one per round over the source)
    job_errors: int = 0  # jobs that raised (their unfinished trees were failed and replayed)
    # ... ACKS_UNDELIVERED: timed out or lost because a bolt's acks for it never reached its acker
    acks_undelivered: int = 0
    # Task commits whose acks could not be delivered, by bolt name (executors that cannot reach the ackers).
    commit_errors: dict[str, int] = field(default_factory=dict)
    resumed: bool = False  # this driver continued a checkpoint
    copied: int = 0  # records of an in-memory source this driver copied into the checkpoint
    output_rows: int = 0  # rows this driver committed to the output
    staged_rows: int = 0  # output rows this driver's jobs staged (every delivery's, copies included)
    output_commits: int = 0  # commits this driver made

    @property
    def rounds(self) -> int:
        """The source pipeline's name for :attr:`jobs` (one Spark job per round over the source)."""
        return self.jobs

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (commit errors summed over bolts), for JSON and tables."""
        data = asdict(self)
        data["commit_errors"] = sum(self.commit_errors.values())
        return data


SourceStats = RunStats
"""The source pipeline's stats: the one :class:`RunStats` (the name stays for the public API)."""


class RunError(Exception):
    """The root of every error that ends a pipeline's run; ``stats`` is the run's :class:`RunStats` then.

    ``stats`` is None only for an error raised outside a run (a pipeline's
    ``run`` fills it in on the way out: :func:`fills_run_stats`).
    """

    stats: RunStats | None = None


_Method = TypeVar("_Method", bound=Callable[..., Any])


def fills_run_stats(method: _Method) -> _Method:
    """Decorate a driver's ``run``: a :class:`RunError` leaving it carries the driver's ``stats``."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except RunError as error:
            if error.stats is None:
                error.stats = self.stats
            raise

    return run  # type: ignore[return-value]


class AcksUndelivered(RunError, AckerError):
    """Records failed because executors could not deliver their acks (raised by a pipeline's ``run``).

    ``stats`` is the finished run's :class:`RunStats`; ``errors`` what each
    bolt reported (:class:`~acker_spark.steps.step.CommitErrors`). The records are
    in the dead-letter store with reason ``ACKS_UNDELIVERED``.
    """

    def __init__(self, stats: RunStats, errors: dict[str, CommitErrors]) -> None:
        self.stats, self.errors = stats, errors
        super().__init__(_undelivered_message(stats, errors))


def _undelivered_message(stats: RunStats, errors: dict[str, CommitErrors]) -> str:
    causes = sorted({cause for report in errors.values() for cause in report.causes})
    bolts = ", ".join(f"{name} ({n} task commits dropped)" for name, n in sorted(stats.commit_errors.items()))
    return (
        f"{stats.acks_undelivered} deliveries failed because executors could not deliver their acks "
        f"(bolts: {bolts or 'unknown'}); could not reach: {'; '.join(causes) or 'unknown'}. "
        "Check the addresses given to each Bolt (executors must reach them; the driver's client did)."
    )


class RecordsFailed(RunError, AckerError):
    """Records were dead-lettered because a job raised, or the run stopped on a misconfiguration (from ``run``).

    ``stats`` is the finished run's :class:`RunStats`; ``causes`` the
    distinct causes (exception type, message, place), the first ones first;
    ``stopped`` the configuration error that stopped the run (no record was
    replayed after it and the source was not read further), or None.
    """

    def __init__(self, stats: RunStats, causes: list[str], stopped: JobError | None) -> None:
        self.stats, self.causes, self.stopped = stats, causes, stopped
        shown = "; ".join(causes[:_CAUSES_SHOWN]) + (
            f"; and {len(causes) - _CAUSES_SHOWN} more" if len(causes) > _CAUSES_SHOWN else ""
        )
        if stopped is not None:
            head = (
                f"the run stopped at a job that failed on a misconfiguration: {stopped}; "
                f"{stats.dead_lettered} records dead-lettered, the rest of the source not read"
            )
        else:
            head = f"{stats.dead_lettered} records dead-lettered, because a job raised: {shown}"
        super().__init__(head + " (see the dead-letter table's cause column)")


_CAUSES_SHOWN = 3


class RunStopped(RunError, RuntimeError):
    """The run stopped on failed Spark jobs a replay cannot cure (raised by ``SourcePipeline.run``).

    ``cause`` is the last job's error (e.g. ``ClusterMisconfigured``: bolts given
    the ackers in the wrong order), ``stats`` the run's :class:`RunStats`.
    The checkpoint keeps the run's progress: run again with it once fixed.
    """

    def __init__(self, message: str, cause: JobError | None, stats: RunStats) -> None:
        super().__init__(message)
        self.cause, self.stats = cause, stats


@dataclass(frozen=True)
class DownShard:
    """One unreachable shard: its index, address, when it was first seen down (clock time) and the last cause."""

    shard: int
    address: str
    since: float
    cause: str


class ShardDown(RunError, AckerError):
    """An acker shard stayed unreachable longer than the pipeline's bound (raised by ``run``).

    ``shard`` is the :class:`DownShard`; ``stats`` the
    run's :class:`RunStats` when it stopped.
    """

    def __init__(self, shard: DownShard, seconds: float, stats: RunStats) -> None:
        self.shard, self.stats = shard, stats
        super().__init__(
            f"acker shard {shard.shard} at {shard.address} has been unreachable for {seconds:.0f} s: {shard.cause}. "
            "Its trees cannot complete: restart it (acker-cluster restarts a dead shard by default) "
            "or fix the address list, then run again"
        )
