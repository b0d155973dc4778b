"""The trees a Spark task's source reader started, as its bolts find them: so they can lease them before they get them.

Under :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline` the
reader (``SourceReader``) and the job's first bolts run in the same Spark
task, one ``mapInArrow`` after the other. The reader starts each record's tree
as it reads it and runs ahead of the bolt: Arrow batches the bolt has not
received yet sit in the pipes between them. A bolt's leases covered only the
batches it had received, so when one record hung in the bolt, the trees of the
rows read behind it timed out and were delivered twice (issue 28). The reader
logs every root it starts to its task attempt's emission file *before* it
sends their inits, under a name made of the partition and the task attempt id,
which the bolt's task shares: :class:`ReaderTrees` reads the new roots of that
file, and the bolt's lease keeper holds them too, until its task ends.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .arrow_files import read_complete_batches

__all__ = ["EMISSIONS_DIR", "ReaderTrees", "emission_file_name"]

log = logging.getLogger(__name__)

EMISSIONS_DIR = "emissions"
"""The checkpoint's folder of emission files, one sub-folder per round."""


def emission_file_name(partition: int, task_attempt: int) -> str:
    """The emission file of one task attempt, inside its round's folder (the reader writes it, bolts read it)."""
    return f"p{partition:05d}-t{task_attempt}.arrow"


class ReaderTrees:
    """The roots the reader of task attempt ``task_attempt`` (partition ``partition``) has started, read incrementally.

    Task attempt ids are unique within a Spark application, so the file is
    found by its name in whichever round folder holds it (the newest first).
    A task whose reader is not in the same stage (a shuffle in between) has no
    such file: :meth:`new_roots` then finds nothing, and nothing changes.
    """

    def __init__(self, checkpoint: str | Path, partition: int, task_attempt: int) -> None:
        self.folder = Path(checkpoint) / EMISSIONS_DIR
        self.name = emission_file_name(partition, task_attempt)
        self._path: Path | None = None
        self._seen = 0  # whole batches already handed out

    def new_roots(self) -> np.ndarray:
        """The roots the reader logged since the last call (uint64; empty if none, or no such file)."""
        if self._path is None:
            self._path = self._find()
            if self._path is None:
                return np.zeros(0, dtype=np.uint64)
        batches = read_complete_batches(self._path)
        fresh = batches[self._seen :]
        self._seen = len(batches)
        if not fresh:
            return np.zeros(0, dtype=np.uint64)
        return np.concatenate([b.column(0).to_numpy() for b in fresh]).astype(np.uint64, copy=False)

    def _find(self) -> Path | None:
        if not self.folder.is_dir():
            return None
        for round_dir in sorted(self.folder.iterdir(), reverse=True):
            path = round_dir / self.name
            if path.is_file():
                return path
        return None
