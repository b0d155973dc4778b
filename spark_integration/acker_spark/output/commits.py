"""Driver side of exactly-once output: which staged rows a commit takes, and its durable log.

A commit takes the trees that ACKED since the previous commit (``new``: their
roots, one delivery per record, since a record has at most one ACKED
delivery) and hands the destination the staged rows of those trees, each row
once, without ``_acker_ids``. Rows of a failed, timed-out, superseded or
speculative delivery are never taken: their roots are not ACKED, or (a
speculative or re-run task's copy of an ACKED delivery's row) they are the
same row, kept once.

A row anchored to several records (after an aggregation) is taken by the
commit in which the last of its trees has ACKED: when every root it carries
has been taken by this commit or an earlier one, and one of them by this one.

The log, under ``<checkpoint>/output/commits/``, makes a commit survive a
driver killed at any moment::

    c<n>.npz    the commit's roots (written first: the commit is then decided)
    c<n>.json   its state: "decided" -> "written" (the destination staged it) -> "done"

A restarted driver finishes the last commit from its state, with the same
roots and so the same rows (:meth:`OutputCommits.finish`), before it decides
a new one: a decided commit is written again (the destination's staging is
replaced), a written one is published (what is left of it), a done one is not
touched. Trees taken by a done commit are never taken again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from acker_client.columns import distinct, member_of

from ..steps.frames import TRACKING_COLUMN, decode_ids
from .destinations import FileOutput, Output
from .folder_publish import staging_folder
from .publish import plan_commit, stage_commit
from .staging import DIRECT_DIR, STAGED_DIR, StagingArea, read_segments, task_folders

__all__ = ["COMMITS_DIR", "CommitFilter", "OutputCommits", "ROW_COLUMN", "finish_checkpoint", "staged_files"]

log = logging.getLogger(__name__)

COMMITS_DIR = "output/commits"
DESTINATION = "destination.json"
"""The commit log's record of a ``FileOutput`` (and run) it publishes to: enough to finish a commit from a shell."""
ROW_COLUMN = "_acker_row"
"""A staged row's digest while a commit selects rows: equal for copies of one row, dropped before the write."""

_EMPTY = np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True)
class CommitRecord:
    """One commit's entry in the log."""

    number: int
    state: str  # decided, written, done
    rounds: tuple[int, ...]  # the rounds whose staged folders hold its rows
    first: bool  # the run's first commit (an overwrite clears the destination once, before it)
    key: int | None = None  # the caller's key for it (a streaming query's batch id)
    whole: bool = False  # it takes every delivery its rounds started: their staged rows need no selection
    rows: int = 0  # rows it committed (known once written: a commit finished by a later driver counts them too)


class OutputCommits:
    """The commit log of one pipeline run's output and the steps that make a commit (driver side)."""

    def __init__(self, checkpoint: str | Path, run: str, output: Output) -> None:
        self.checkpoint = Path(checkpoint)
        self.folder = self.checkpoint / COMMITS_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.output = output
        self.area = staging_area(output, self.checkpoint, run)
        self.rows_committed = 0
        if isinstance(output, FileOutput):  # what a tool needs to finish a commit without the job
            _write_json(self.folder / DESTINATION, {"run": run, "file_output": _file_output_json(output)})

    # -- the log --------------------------------------------------------------------------

    def records(self) -> list[CommitRecord]:
        """Every commit of the log, in order."""
        out = []
        for path in sorted(self.folder.glob("c*.json")):
            data = json.loads(path.read_text())
            out.append(
                CommitRecord(
                    data["number"],
                    data["state"],
                    tuple(data["rounds"]),
                    data["first"],
                    data.get("key"),
                    bool(data.get("whole", False)),
                    int(data.get("rows", 0)),
                )
            )
        return out

    def unfinished(self) -> bool:
        """True if the log's last commit was decided but is not done (:meth:`finish` completes it)."""
        records = self.records()
        return bool(records) and records[-1].state != "done"

    def taken(self) -> np.ndarray:
        """The roots every commit of the log took (sorted): decided ones included, they will be finished."""
        parts = [np.load(path)["roots"] for path in sorted(self.folder.glob("c*.npz"))]
        return distinct(np.concatenate(parts)) if parts else _EMPTY

    def _save(self, record: CommitRecord) -> None:
        path = self.folder / f"c{record.number:05d}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        data = {
            "number": record.number,
            "state": record.state,
            "rounds": list(record.rounds),
            "first": record.first,
            "key": record.key,
            "whole": record.whole,
            "rows": record.rows,
        }
        with open(tmp, "w") as out:
            json.dump(data, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def drop_staged(self) -> None:
        """Delete the staged rows (at the end of a run: what no commit took belongs to failed deliveries)."""
        shutil.rmtree(self.checkpoint / STAGED_DIR, ignore_errors=True)
        if self.area.direct:
            shutil.rmtree(self.area.root, ignore_errors=True)

    # -- committing -----------------------------------------------------------------------

    def has_key(self, key: int) -> bool:
        """True if a commit of the log was made with ``key``."""
        return any(record.key == key for record in self.records())

    def commit(
        self, spark: Any, roots: np.ndarray, rounds: np.ndarray, key: int | None = None, *, whole: bool = False
    ) -> int:
        """Decide, write and publish a commit of the trees ``roots`` (ACKED, not taken before), started in ``rounds``.

        ``rounds`` name the staged folders that hold their rows; ``key`` is kept
        with the commit (:meth:`has_key`). ``whole``: ``roots`` are every
        delivery those rounds started, so every row staged there is taken (no
        row of another delivery is in those folders). Returns how many rows it committed.
        """
        records = self.records()
        if records and records[-1].state != "done":
            raise RuntimeError("the previous commit is unfinished: call finish() first")
        if not len(roots):
            return 0
        number = records[-1].number + 1 if records else 0
        if number == 0:
            self.output.check_start(spark, self.run)
        npz = self.folder / f"c{number:05d}.npz"
        tmp = self.folder / f".c{number:05d}.tmp.npz"
        np.savez(tmp, roots=np.sort(roots.astype(np.uint64)))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, npz)
        record = CommitRecord(
            number, "decided", tuple(sorted(int(r) for r in np.unique(rounds))), number == 0, key, whole
        )
        self._save(record)
        return self._finish(spark, record)

    def finish(self, spark: Any) -> int:
        """Finish the log's last commit if a driver died during it; return the rows it committed (0 if none)."""
        records = self.records()
        if not records or records[-1].state == "done":
            return 0
        record = records[-1]
        log.info("finishing output commit %d (%s) left %s by an earlier driver", record.number, self.run, record.state)
        return self._finish(spark, record)

    def _finish(self, spark: Any, record: CommitRecord) -> int:
        if record.state == "decided":
            rows = self._write(spark, record)
            record = replace(record, state="written", rows=rows)
            self._save(record)
        files = self.output.publish(spark, self.run, record.number, first=record.first)
        self._save(replace(record, state="done"))
        self.rows_committed += record.rows
        log.info(
            "output commit %d: %d rows to %s (%d files)", record.number, record.rows, self.output.describe(), len(files)
        )
        return record.rows

    def _write(self, spark: Any, record: CommitRecord) -> int:
        """Put the commit's rows into the destination's staging for it; how many rows that is."""
        if self.area.direct:
            assert isinstance(self.output, FileOutput), "direct staging is a FileOutput's"
            if record.whole and len(set(record.rounds)) == 1:
                plan = plan_commit(self.area, record.rounds, None, None)  # every row of the round: no lookup
            else:
                new, taken = self._roots(record.number)
                plan = plan_commit(self.area, record.rounds, new, taken)
            stage_commit(plan, staging_folder(Path(self.output.path), self.run, record.number))
            log.info(
                "output commit %d: %d files published as staged, %d rewritten without rows of other deliveries",
                record.number,
                plan.moved,
                plan.rewritten,
            )
            return plan.rows
        df = self.frame(spark, record)
        if df is None:  # no staged row: an empty commit (the trees' records produced no output)
            return 0
        # The destination writes and counts: no second pass over the rows just to count them.
        return int(self.output.write(spark, df, self.run, record.number))

    def _roots(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """``(commit number's roots, every root taken up to and with it)``, both sorted."""
        new = np.load(self.folder / f"c{number:05d}.npz")["roots"]
        parts = [np.load(self.folder / f"c{n:05d}.npz")["roots"] for n in range(number + 1)]
        return new, distinct(np.concatenate(parts))

    def finish_publish(self) -> int:
        """Finish a written commit without Spark (a FileOutput's moves and marker); the rows it committed.

        For tools that run without a Spark session (``acker-ctl output finish``): a
        commit still ``decided`` of a Parquet ``FileOutput`` is written too (its
        files are moved or rewritten by Python); other destinations need the pipeline.
        """
        records = self.records()
        if not records or records[-1].state == "done":
            return 0
        record = records[-1]
        if not isinstance(self.output, FileOutput) or (record.state == "decided" and not self.area.direct):
            raise RuntimeError(
                f"output commit {record.number} of {self.output.describe()} needs Spark to finish: run the pipeline"
                " again on this checkpoint"
            )
        if record.state == "decided":
            record = replace(record, state="written", rows=self._write(None, record))
            self._save(record)
        self.output.publish(None, self.run, record.number, first=record.first)
        self._save(replace(record, state="done"))
        return record.rows

    def frame(self, spark: Any, record: CommitRecord) -> Any:
        """The commit's rows as a DataFrame (user columns only, one copy of each row); None if nothing is staged."""
        files, copies = staged_files(self.area, record.rounds)
        if not files:
            return None
        staged = spark.read.parquet(*[str(f) for f in files])
        if record.whole and not copies:
            # Every row there belongs to a delivery this commit takes, once: Spark reads and writes them
            # as they are, with no Python step.
            return staged.drop(TRACKING_COLUMN)
        selector = CommitFilter(str(self.folder), record.number)
        schema = staged.drop(TRACKING_COLUMN).schema.add(ROW_COLUMN, "long", False)
        selected = staged.mapInArrow(selector, schema)
        if copies:
            # A re-run or speculative task staged its batches again: keep one copy of each row.
            selected = selected.dropDuplicates([ROW_COLUMN])
        return selected.drop(ROW_COLUMN)


def staged_files(area: StagingArea, rounds: tuple[int, ...]) -> tuple[list[Path], bool]:
    """The staged data files of ``rounds``, and whether some rows may be there twice (then the commit keeps one copy).

    Rows are there twice when a partition staged them in two task attempts
    (a re-run or speculative task) or when a root is staged in two of the
    rounds (a task of a failed round that outlived its job staged records the
    next first read read again, as the same deliveries).
    """
    files: list[Path] = []
    copies = False
    several = len(rounds) > 1
    in_rounds: list[np.ndarray] = []  # each round's roots (from the sidecars; needed only across rounds)
    for round_no in rounds:
        attempts: dict[int, int] = {}
        roots: list[np.ndarray] = []
        for task in task_folders(area.round_dir(round_no)):
            segments = read_segments(task)
            files.extend(s.path(i) for s in segments for i in range(len(s.files)))
            if several:
                roots.extend(s.root_values.astype(np.uint64) for s in segments)
            if segments:
                attempts[task.partition] = attempts.get(task.partition, 0) + 1
        copies = copies or any(n > 1 for n in attempts.values())
        if several:
            in_rounds.append(distinct(np.concatenate(roots)) if roots else _EMPTY)
    if not copies and several:
        every = np.concatenate(in_rounds)
        copies = len(distinct(every)) < len(every)
    return files, copies


def finish_checkpoint(checkpoint: str | Path) -> tuple[int, int | None]:
    """Finish the unfinished commit of a checkpoint's ``FileOutput`` without Spark: ``(rows, commit number)``.

    ``(0, None)`` when no commit is unfinished. Raises ``FileNotFoundError``
    for a checkpoint with no file output, ``RuntimeError`` for a commit that
    needs Spark (other destinations: run the pipeline again).
    """
    folder = Path(checkpoint) / COMMITS_DIR
    described = folder / DESTINATION
    if not described.exists():
        raise FileNotFoundError(f"{checkpoint} has no FileOutput commit log ({described} is missing)")
    data = json.loads(described.read_text())
    output = FileOutput(**data["file_output"])
    commits = OutputCommits(checkpoint, data["run"], output)
    records = commits.records()
    if not records or records[-1].state == "done":
        return 0, None
    return commits.finish_publish(), records[-1].number


def _file_output_json(output: FileOutput) -> dict[str, Any]:
    return {
        "path": output.path,
        "format": output.format,
        "partition_by": list(output.partition_by),
        "mode": output.mode,
        "options": dict(output.options),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def staging_area(output: Output, checkpoint: Path, run: str) -> StagingArea:
    """Where a run's tasks stage ``output``'s rows: beside a Parquet ``FileOutput``, else under the checkpoint."""
    if isinstance(output, FileOutput) and output.format == "parquet" and set(output.options) <= {"compression"}:
        return StagingArea(
            str(Path(output.path) / DIRECT_DIR / run),
            True,
            tuple(output.partition_by),
            output.options.get("compression", "snappy"),
        )
    return StagingArea(str(checkpoint / STAGED_DIR), False)


_selected: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}  # per executor process, one commit at a time


@dataclass
class CommitFilter:
    """The picklable ``mapInArrow`` function that keeps the staged rows a commit takes, with each row's digest."""

    folder: str
    number: int

    def roots(self) -> tuple[np.ndarray, np.ndarray]:
        """``(this commit's roots, every root taken up to and with this commit)``, both sorted; cached per process."""
        key = (self.folder, self.number)
        cached = _selected.get(key)
        if cached is None:
            folder = Path(self.folder)
            new = np.load(folder / f"c{self.number:05d}.npz")["roots"]
            parts = [np.load(folder / f"c{n:05d}.npz")["roots"] for n in range(self.number + 1)]
            cached = (new, distinct(np.concatenate(parts)))
            _selected.clear()
            _selected[key] = cached
        return cached

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Keep each batch's rows taken by this commit; replace ``_acker_ids`` by the row digest."""
        new, taken = self.roots()
        for batch in batches:
            pairs = decode_ids(batch.column(TRACKING_COLUMN))
            in_new = member_of(pairs.roots, new)
            in_taken = member_of(pairs.roots, taken)
            rows = pairs.pair_rows()
            counts = np.bincount(rows, minlength=pairs.rows)
            any_new = np.bincount(rows, weights=in_new, minlength=pairs.rows) > 0
            all_taken = np.bincount(rows, weights=in_taken, minlength=pairs.rows) == counts
            keep = any_new & all_taken & (counts > 0)
            if not keep.any():
                continue
            user = batch.drop_columns([TRACKING_COLUMN])
            digests = pairs.digests().view(np.int64)
            out = user.append_column(ROW_COLUMN, pa.array(digests))
            yield out.filter(pa.array(keep))
