"""The way back from a stream's ``foreachBatch`` function to its planner: the acks the executors could not deliver.

The ``acker_spout`` stream's planner runs in a process Spark starts for it,
not in the user's driver, where the bolts' task commits report the trees
whose acks an executor dropped. :func:`record_commit_errors`, called in the
``foreachBatch`` function after its actions, journals those roots in the
stream's checkpoint (``undelivered/``, see :mod:`acker_spark.tracking.checkpoint`);
the planner reads them there before it settles the next outcomes, so those
trees' timeouts end as ``ACKS_UNDELIVERED`` (in the dead letters too)
instead of ``TIMED_OUT``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["record_commit_errors"]


def record_commit_errors(checkpoint: str | Path) -> dict[str, int]:
    """Driver side, in a ``foreachBatch`` function after its actions: journal the bolts' dropped acks.

    ``checkpoint`` is the stream's ``checkpoint`` option. Returns the task
    commits whose acks could not be delivered, per bolt name (since the bolts
    were created), so the function can raise or warn.
    """
    from ..steps.step import commit_errors
    from ..tracking.checkpoint import Checkpoint  # pyarrow: imported when called, not with acker_spark

    reports = commit_errors()
    roots = frozenset().union(*(r.roots for r in reports.values())) if reports else frozenset()
    if roots:
        Checkpoint(checkpoint).add_undelivered(np.fromiter(roots, dtype=np.uint64, count=len(roots)))
    return {name: report.errors for name, report in reports.items()}
