"""A batch run's exactly-once output, as its driver drives it: stage each round's output, commit what ACKED.

:class:`RunOutput` is what a driver with ``output=`` calls: :meth:`RunOutput.stage`
runs the stager over the job's output DataFrame (the executors stage, then
ack, each batch: one pass with the last bolt); :meth:`RunOutput.commit_acked`
commits the staged rows of the deliveries that ACKED since the last commit
(:class:`~acker_spark.output.commits.OutputCommits` keeps its durable log);
:meth:`RunOutput.resume` finishes a commit a killed driver left half-done
before any new one. A commit's Spark jobs fail like any other: a decided
commit is finished again from its log instead of failing the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..job_errors import job_error
from ..replay_policy import ReplayPolicy
from ..steps.fusion import map_in_arrow
from .commits import OutputCommits
from .destinations import Output
from .stager import OutputStager, stager_schema

__all__ = ["RunOutput"]

log = logging.getLogger(__name__)

_NONE = np.zeros(0, dtype=np.uint64)

AckedSince = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, bool]]
"""The driver's book: the ACKED deliveries not in the sorted roots given, as ``(roots, rounds, whole)``."""


class _Run(Protocol):
    """The run whose output this is (a checkpoint's manifest)."""

    @property
    def name(self) -> str:
        """The run's spout name (the commits' files are named after it)."""
        ...

    @property
    def salt(self) -> int:
        """The run's id salt (the stagers derive the rows' roots with it)."""
        ...


class _Options(Protocol):
    """What the output reads of the driver's options."""

    @property
    def output(self) -> Output | None:
        """Where the output goes."""
        ...

    @property
    def policy(self) -> ReplayPolicy:
        """``max_attempts``: how many times in all a failed commit step is tried."""
        ...

    @property
    def security(self) -> Any:
        """The executors' channel security."""
        ...

    @property
    def client_options(self) -> dict[str, Any]:
        """The executors' client options."""
        ...


class RunOutput:
    """The output of a run (its ``manifest``: spout name and salt) staged under ``checkpoint``, as ``options`` say.

    ``options`` are the pipeline's (``output``, ``policy.max_attempts``: how
    many times in all a failed commit step is tried, ``security`` and
    ``client_options`` with ``addresses`` for the stagers' clients).
    """

    def __init__(self, checkpoint: Path, manifest: _Run, options: _Options, addresses: Any) -> None:
        assert options.output is not None, "a run with an output"
        self.commits = OutputCommits(checkpoint, manifest.name, options.output)
        self.salt = manifest.salt
        self.max_attempts = options.policy.max_attempts
        self.clients = (addresses, options.security, options.client_options)
        self.committed = _NONE  # roots whose output a commit took (sorted)

    def stage(self, result: Any, round_no: int) -> int:
        """Stage the job's output DataFrame ``result`` of round ``round_no``; how many rows the executors staged."""
        stager = OutputStager(self.commits.area, round_no, self.salt, *self.clients)
        counts = map_in_arrow(result, stager, stager_schema()).collect()  # one pass with the last bolt
        return sum(row[0] for row in counts)

    def resume(self, spark: Any) -> int:
        """Finish a commit a killed driver left half-done (the same rows), before any new one; the rows it wrote."""
        commits = self.commits
        rows = self._retrying(lambda: commits.finish(spark), spark)
        self.committed = commits.taken()
        return rows

    def commit_acked(self, spark: Any, acked_since: AckedSince) -> int | None:
        """Commit the output of every ACKED delivery no commit took yet; the rows written (None: nothing to commit)."""
        roots, rounds, whole = acked_since(self.committed)
        if not len(roots):
            return None
        commits = self.commits
        rows = self._retrying(lambda: commits.commit(spark, roots, rounds, whole=whole), spark)
        # The book's entries are sorted by root: so are ``roots``, and the first commit's set needs no sort.
        self.committed = np.union1d(self.committed, roots) if len(self.committed) else roots.copy()
        return rows

    def drop_staged(self) -> None:
        """Every ACKED delivery's rows are committed: the rest of the staged rows is never needed."""
        self.commits.drop_staged()

    def _retrying(self, step: Callable[[], int], spark: Any) -> int:
        """Run a commit step; if it fails once decided, finish the commit again from its log (up to ``max_attempts``).

        A commit's Spark jobs fail like any other (an executor lost, a Python
        worker killed: with no task retries, as on ``local[n]``, the job
        fails at once). Finishing a decided commit again writes the same rows
        (the destination's staging is replaced), so a transient failure costs
        a retry instead of the run. A failure before the commit was decided
        (``mode="error"`` refusing the destination) leaves nothing to finish
        and is raised as it is.
        """
        try:
            return step()
        except Exception as first:  # noqa: BLE001 - any failure of the write is retried the same way
            error: Exception = first
        for attempt in range(2, self.max_attempts + 1):
            if not self.commits.unfinished():
                break
            log.warning("output commit failed (%s); finishing it again, attempt %d", job_error(error), attempt)
            try:
                return self.commits.finish(spark)
            except Exception as again:  # noqa: BLE001 - as above
                error = again
        raise error
