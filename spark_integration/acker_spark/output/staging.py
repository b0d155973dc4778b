"""The staging area: where a round's tasks write output rows, and what each segment of files holds.

A stager task writes its rows in *segments*: files rolled together every
``segment_rows`` rows (or bytes), closed, pushed to disk (``fsync``), then
described by a sidecar, and only then acked. Layout, under the area's root::

    r<round>/p<partition>-t<task attempt>/<partition dirs>/s<seq>-f<file>.parquet
    r<round>/p<partition>-t<task attempt>/_s<seq>.npz     the segment's sidecar
    r<round>/p<partition>-t<task attempt>/_done            the task's iterator ended

A segment counts only once its sidecar exists (data files first, sidecar
last: a segment without one was cut by a kill and its rows were never acked).
The sidecar says, for each file of the segment, which trees its rows belong to
(each row's roots, run-length coded: a record's rows are adjacent) and, per
Arrow batch, the batch's ack dedup key and how many of its rows went to each
file. The commit (:mod:`acker_spark.output.publish`) needs nothing else to
decide what to publish: it never reads a row to decide.

Two kinds of area:

- *direct* (``FileOutput`` in Parquet): the root is a hidden folder of the
  destination, ``<dest>/.acker-staging/<run>/``, on the destination's
  filesystem; files hold the user's columns only, laid out under Hive-style
  partition folders (``day=2024-01-01/``) as Spark's writer would. A commit
  publishes such a file by renaming it.
- *rows* (any other destination): the root is ``<checkpoint>/output/staged``;
  files hold the user's columns plus ``_acker_ids``, and the commit reads them
  with Spark and writes the rows with the destination's own writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..executor_read.memory_source import fsync_path

__all__ = [
    "DIRECT_DIR",
    "STAGED_DIR",
    "Segment",
    "StagingArea",
    "TaskFolder",
    "fsync_path",
    "partition_dir",
    "read_segments",
    "run_lengths",
    "expand_runs",
]

STAGED_DIR = "output/staged"
"""Where, under the checkpoint, rows-kind staging lives (one folder per round)."""

DIRECT_DIR = ".acker-staging"
"""The hidden folder of a destination that holds direct staging (``<dest>/.acker-staging/<run>/``)."""

DONE = "_done"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark's name for a null (or empty string) partition value
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(1, 32)}


@dataclass(frozen=True)
class StagingArea:
    """Where one run's tasks stage output: ``root`` (per round below it), and whether its files are published as they are."""

    root: str
    direct: bool
    partition_by: tuple[str, ...] = ()
    compression: str = "snappy"

    def round_dir(self, round_no: int) -> Path:
        """The folder of round ``round_no``'s task folders."""
        return Path(self.root) / f"r{round_no:05d}"

    def rounds(self) -> list[int]:
        """The rounds that have a folder in the area."""
        root = Path(self.root)
        return sorted(int(p.name[1:]) for p in root.glob("r*") if p.is_dir()) if root.is_dir() else []


def partition_dir(names: tuple[str, ...], values: tuple[Any, ...]) -> str:
    """The Hive-style folder of one partition value, as Spark's writer names it (``a=1/b=x%2Fy``)."""
    parts = []
    for name, value in zip(names, values):
        if value is None or value == "":
            text = NULL_PARTITION
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in str(value))
        parts.append(f"{name}={text}")
    return "/".join(parts)


def run_lengths(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as runs: each run's value and length."""
    if not len(values):
        return values[:0], np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate(([0], change))
    return values[starts], np.diff(np.append(starts, len(values)))


def expand_runs(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The inverse of :func:`run_lengths`."""
    return np.repeat(values, lengths)


@dataclass(frozen=True)
class Segment:
    """One segment's sidecar, read: its files and, in file order, its rows' roots (run-length coded); its batches' keys.

    The roots stay coded as the sidecar holds them: a commit decides on runs
    of rows (a record's rows sit together), so its cost follows the trees a
    segment holds, not its rows. ``row_counts``/``pair_roots`` expand them for
    the callers that need one entry per row.
    """

    task: TaskFolder
    seq: int
    files: list[str]  # relative to the task folder
    file_rows: np.ndarray  # int64 per file
    count_values: np.ndarray  # pairs per row, run-length coded over every file's rows in file order
    count_lengths: np.ndarray
    root_values: np.ndarray  # uint64, every row's roots in row order, run-length coded
    root_lengths: np.ndarray
    batch_keys: np.ndarray  # uint64 per batch
    batch_file_rows: np.ndarray  # int64 [batch, file, rows] triplets, in write order

    @property
    def row_counts(self) -> np.ndarray:
        """Pairs per row, every file's rows in file order."""
        return expand_runs(self.count_values, self.count_lengths)

    @property
    def pair_roots(self) -> np.ndarray:
        """Every row's roots in row order (uint64)."""
        return expand_runs(self.root_values, self.root_lengths)

    @property
    def one_root_per_row(self) -> bool:
        """True if every row belongs to exactly one tree: the root runs are then runs of rows."""
        return bool(len(self.count_values) == 0 or (self.count_values == 1).all())

    def path(self, index: int) -> Path:
        """The data file ``index`` of the segment."""
        return self.task.path / self.files[index]


@dataclass(frozen=True)
class TaskFolder:
    """One task attempt's folder in a round: ``p<partition>-t<attempt>``."""

    path: Path
    partition: int
    attempt: int

    @property
    def complete(self) -> bool:
        """True if the task's iterator ended (every row it got is in its segments)."""
        return (self.path / DONE).exists()


def task_folders(round_dir: Path) -> list[TaskFolder]:
    """The task attempt folders of a round."""
    out = []
    for path in sorted(round_dir.glob("p*-t*")) if round_dir.is_dir() else []:
        partition, attempt = path.name[1:].split("-t", 1)
        out.append(TaskFolder(path, int(partition), int(attempt)))
    return out


def read_segments(task: TaskFolder) -> list[Segment]:
    """The complete segments (with a sidecar) of a task attempt, in order."""
    out = []
    for side in sorted(task.path.glob("_s*.npz")):
        with np.load(side) as data:
            out.append(
                Segment(
                    task,
                    int(side.stem[2:]),
                    [str(f) for f in data["files"]],
                    data["file_rows"],
                    data["count_values"],
                    data["count_lengths"],
                    data["root_values"],
                    data["root_lengths"],
                    data["batch_keys"],
                    data["batch_file_rows"],
                )
            )
    return out
