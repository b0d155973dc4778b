"""Why records failed: the reasons bolts give ``collector.fail``, written by the executors into the checkpoint.

A pipeline that reads on the executors sets the Spark job property
:data:`CHECKPOINT_PROPERTY` to its checkpoint directory. A bolt whose task runs
under it appends the ``(root, reason)`` of every row it fails (a reason given to
``collector.fail``, or the exception of a record isolated because it raised) to
an Arrow IPC file of its own under ``causes/``, before the fails are sent. The
driver reads them whenever it needs a cause (a dead letter, the failure budget's
report), also for tasks Spark killed or a driver that was restarted: unlike
Spark accumulators, nothing is lost with a failed or cancelled task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .job_errors import error_type

__all__ = ["CHECKPOINT_PROPERTY", "CauseReader", "CauseWriter", "cause_kinds", "read_causes", "task_checkpoint"]

CHECKPOINT_PROPERTY = "acker.checkpoint"
"""The Spark job property naming the checkpoint directory a task writes causes into."""

CAUSES_DIR = "causes"
_SCHEMA = pa.schema([("root", pa.uint64()), ("cause", pa.string())])


def task_checkpoint() -> str | None:
    """The checkpoint directory of the pipeline running this Spark task, if the job set one."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - executors always have pyspark
        return None
    context = TaskContext.get()
    return context.getLocalProperty(CHECKPOINT_PROPERTY) if context is not None else None


class CauseWriter:
    """One task attempt's cause file, opened on the first reason (a task that fails nothing writes nothing)."""

    def __init__(self, checkpoint: str | Path, name: str) -> None:
        self.path = Path(checkpoint) / CAUSES_DIR / f"{name}.arrow"
        self._file: Any = None
        self._writer: Any = None

    def write(self, reasons: dict[int, str]) -> None:
        """Append ``root -> reason`` pairs and push them to disk before the fails they explain are sent."""
        if not reasons:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "wb")  # noqa: SIM115 - one file per task attempt, closed in close()
            self._writer = pa.ipc.new_stream(self._file, _SCHEMA)
        roots = np.fromiter(reasons.keys(), dtype=np.uint64, count=len(reasons))
        batch = pa.RecordBatch.from_arrays(
            [pa.array(roots, pa.uint64()), pa.array(list(reasons.values()))], schema=_SCHEMA
        )
        self._writer.write_batch(batch)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """End the stream."""
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = self._file = None


class CauseReader:
    """The causes of a checkpoint, read again only from the files that grew since the last :meth:`refresh`."""

    def __init__(self, checkpoint: str | Path) -> None:
        self.folder = Path(checkpoint) / CAUSES_DIR
        self.causes: dict[int, str] = {}
        self.fresh: dict[int, str] = {}  # the roots the last refresh added
        self._sizes: dict[Path, int] = {}

    def refresh(self) -> dict[int, str]:
        """Every ``root -> cause`` written so far (the first cause of a root wins); the new ones in ``fresh``."""
        from .arrow_files import read_complete_batches

        self.fresh = {}
        if not self.folder.is_dir():
            return self.causes
        for path in sorted(self.folder.glob("*.arrow")):
            size = path.stat().st_size
            if self._sizes.get(path) == size:
                continue
            self._sizes[path] = size
            for batch in read_complete_batches(path):
                for root, cause in zip(batch.column(0).to_numpy().tolist(), batch.column(1).to_pylist()):
                    if root not in self.causes:
                        self.causes[root] = self.fresh[root] = cause
        return self.causes


def read_causes(checkpoint: str | Path) -> dict[int, str]:
    """Every ``root -> cause`` the executors wrote (the first cause of a root wins); torn tails are skipped."""
    return CauseReader(checkpoint).refresh()


def cause_kinds(causes: dict[int, str], roots: np.ndarray) -> dict[str, int]:
    """How many of ``roots`` failed with each exception type (free-text reasons under their own text)."""
    counts: dict[str, int] = {}
    for root in roots.tolist():
        cause = causes.get(root)
        if cause is None:
            continue
        kind = error_type(cause) or cause
        counts[kind] = counts.get(kind, 0) + 1
    return counts
