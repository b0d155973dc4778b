"""Fault injection for ``acker-bench --mode exactly-once``: which process to kill, and how far a run has got.

- :func:`reading_worker` finds a Spark Python worker running a task of the
  pipeline: the driver's JVM forks ``pyspark.daemon``, which forks the workers
  (one per Python step of a task, reused between tasks); the one whose reading
  step holds the task's emission file open is in a task.
- :class:`StagedProgress` counts the output rows the executors have staged
  (under a checkpoint's ``output/staged/`` or a Parquet destination's
  ``.acker-staging/``), from each segment's sidecar, read once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["StagedProgress", "busy_python_worker", "children", "cpu_ticks", "reading_worker"]


def children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (a scan of ``/proc``)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def cpu_ticks(pid: int) -> int | None:
    """User plus system CPU ticks of ``pid`` so far, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def python_workers(driver_pid: int) -> list[int]:
    """The Spark Python workers of a local driver: children of the ``pyspark.daemon`` its JVM started."""
    workers: list[int] = []
    for jvm in children(driver_pid):
        if "java" not in _cmdline(jvm):
            continue
        for daemon in children(jvm):
            if "pyspark.daemon" in _cmdline(daemon):
                workers.extend(children(daemon))
    return workers


def reading_worker(driver_pid: int) -> int | None:
    """A Python worker of the driver that is reading records in a task, or None.

    The pipeline's reading step holds its task's emission file
    (``<checkpoint>/emissions/r<round>/...``) open while it reads: a worker
    with such a file open is in a task. (CPU time is no sign: an idle worker's
    acker client keeps its own threads busy.)
    """
    for pid in python_workers(driver_pid):
        try:
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # it ended, or a descriptor closed while we looked
            continue
        if any("/emissions/r" in target for target in targets):
            return pid
    return None


def busy_python_worker(driver_pid: int, sample: float = 0.2) -> int | None:
    """A Python worker of the driver that used CPU during the last ``sample`` seconds (in a task), or None."""
    workers = python_workers(driver_pid)
    before = {pid: cpu_ticks(pid) for pid in workers}
    time.sleep(sample)
    moved = []
    for pid, ticks in before.items():
        now = cpu_ticks(pid)
        if ticks is not None and now is not None and now > ticks:
            moved.append((now - ticks, pid))
    return max(moved)[1] if moved else None


class StagedProgress:
    """Output rows staged so far (every attempt's copy counts: it is work done), from the staging sidecars.

    ``checkpoints``' ``output/staged`` folders hold what non-Parquet destinations
    stage; ``destinations`` (Parquet output folders) hold the rest, in their hidden
    ``.acker-staging`` folders. A segment counts once its sidecar exists (written
    after its files, before its acks).
    """

    def __init__(self, checkpoints: Iterable[str | Path], destinations: Iterable[str | Path] = ()) -> None:
        self.folders = [Path(c) / "output" / "staged" for c in checkpoints]
        self.folders += [Path(d) / ".acker-staging" for d in destinations]
        self._rows: dict[Path, int] = {}

    def rows(self) -> int:
        """Staged rows now; each sidecar is read once (it is immutable once it has its name)."""
        import numpy as np

        for folder in self.folders:
            for path in _sidecars(folder):
                if path not in self._rows:
                    try:
                        with np.load(path) as sidecar:
                            self._rows[path] = int(sidecar["file_rows"].sum())
                    except (OSError, ValueError, KeyError):  # removed or being replaced
                        continue
        return sum(self._rows.values())


def _sidecars(folder: Path) -> list[Path]:
    """The sidecars under ``folder`` now; none if it goes away meanwhile (a commit moving or dropping staged files:
    walking a folder being removed raises ``FileNotFoundError`` mid-walk)."""
    try:
        return list(folder.rglob("_s*.npz")) if folder.is_dir() else []
    except FileNotFoundError:
        return []
