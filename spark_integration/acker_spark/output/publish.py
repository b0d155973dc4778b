"""A commit of directly staged files: decided from the sidecars, published by rename, rewritten only where needed.

For each (round, task partition) the commit takes one complete task attempt's
segments (the lowest attempt id whose iterator ended: its files hold every row
the partition produced); a partition with no complete attempt (its job
failed) takes the segments of every attempt, each Arrow batch once (by its ack
dedup key: an attempt that staged the very same batch again holds the same
rows). Then, per file, from the sidecar alone, deciding on runs of rows (a
record's rows sit together, so a segment's cost is its trees', not its rows'):

- every row taken by this commit (each of its roots taken by this commit or
  an earlier one, one of them by this one): the file is *moved* into the
  commit's staging folder (a rename: no row read or written);
- some rows taken: the file is *rewritten* there with those rows only (the
  rows of a failed, timed-out, superseded or speculative delivery, or a
  second copy of a batch, are left out);
- none: the file is left where it is (a later commit, or nothing, takes it).

A commit of several rounds takes each root's rows from one of them: a root is
staged in two rounds when a task of a failed round outlived its job (Spark
kills a cancelled task's Python worker only after a while) and logged records
after the driver had read the round's emission log, so the next first read
read them again as the same deliveries (the same roots) and staged them too.
The round kept for a root is the first where every task attempt holding its
rows ended (a copy cut by a kill may hold part of them), else the first that
holds it; a row of several trees goes with the smallest of its roots this
commit takes.

Re-running :func:`stage_commit` after a crash does the same again: a moved
file is no longer at its source (its target is), a rewrite is written again
to the same name. The destination then publishes the commit's staging folder
(:func:`~acker_spark.output.folder_publish.publish_in_place`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from acker_client.columns import distinct, member_of

from .staging import Segment, StagingArea, TaskFolder, expand_runs, fsync_path, read_segments, run_lengths, task_folders

__all__ = ["KeptRuns", "PublishPlan", "kept_runs", "plan_commit", "stage_commit", "taken_rows"]

log = logging.getLogger(__name__)

_NONE = np.zeros(0, dtype=np.uint64)

READS: list[Callable[[Path], None]] = []
"""Hooks called with each staged file a commit reads back (tests count them; a rename reads none)."""


@dataclass(frozen=True)
class FileAction:
    """What a commit does with one staged file: move it, or write ``keep``'s rows of it, to ``target``."""

    source: Path
    target: str  # relative to the commit's staging folder
    keep: np.ndarray | None  # None: every row (a move)
    rows: int


@dataclass(frozen=True)
class PublishPlan:
    """A commit's file actions and its row count."""

    actions: list[FileAction]

    @property
    def rows(self) -> int:
        """Rows the commit publishes."""
        return sum(a.rows for a in self.actions)

    @property
    def moved(self) -> int:
        """Files published as they were staged."""
        return sum(1 for a in self.actions if a.keep is None)

    @property
    def rewritten(self) -> int:
        """Files written again without some of their rows."""
        return sum(1 for a in self.actions if a.keep is not None)


def taken_rows(
    counts: np.ndarray, roots: np.ndarray, new: np.ndarray, taken: np.ndarray, owned: np.ndarray | None = None
) -> np.ndarray:
    """Per row: taken by this commit (every root in ``taken``, at least one in ``new``; both sorted).

    ``owned`` (sorted, part of ``new``): the roots whose rows this segment's round gives; a row is then taken
    only if the smallest of its roots in ``new`` is one of them (another round gives the others).
    """
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    in_new = member_of(roots, new)
    in_taken = member_of(roots, taken)
    any_new = np.bincount(rows, weights=in_new, minlength=len(counts)) > 0
    all_taken = np.bincount(rows, weights=in_taken, minlength=len(counts)) == counts
    keep = any_new & all_taken & (counts > 0)
    if owned is not None:
        smallest = np.full(len(counts), np.iinfo(np.uint64).max, dtype=np.uint64)
        np.minimum.at(smallest, rows[in_new], roots[in_new].astype(np.uint64))
        keep &= member_of(smallest, owned)
    return keep


@dataclass(frozen=True)
class KeptRuns:
    """Which of a segment's rows (in file order) a commit takes, as runs: each run's length and its verdict."""

    lengths: np.ndarray  # int64, none zero
    keep: np.ndarray  # bool per run

    @classmethod
    def from_rows(cls, keep: np.ndarray) -> KeptRuns:
        """The runs of a per-row verdict."""
        values, lengths = run_lengths(keep.astype(bool))
        return cls(lengths.astype(np.int64), values)

    @classmethod
    def every_row(cls, rows: int) -> KeptRuns:
        """All ``rows`` rows taken: one run."""
        if not rows:
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
        return cls(np.array([rows], dtype=np.int64), np.array([True]))

    def rows(self) -> np.ndarray:
        """The verdict per row."""
        return expand_runs(self.keep, self.lengths)

    def kept_per_file(self, file_rows: np.ndarray) -> np.ndarray:
        """How many rows of each file (``file_rows``: each file's rows, in order) are taken."""
        if not len(self.lengths):
            return np.zeros(len(file_rows), dtype=np.int64)
        ends = np.cumsum(self.lengths)
        kept_before = np.concatenate(([0], np.cumsum(self.lengths * self.keep)))  # kept rows in the runs before j
        bounds = np.concatenate(([0], np.cumsum(file_rows)))
        run = np.minimum(np.searchsorted(ends, bounds, side="left"), len(ends) - 1)  # the run holding row bound-1
        starts = ends[run] - self.lengths[run]
        kept_upto = kept_before[run] + np.clip(bounds - starts, 0, None) * self.keep[run]
        return np.diff(kept_upto)


def kept_runs(segment: Segment, new: np.ndarray, taken: np.ndarray) -> KeptRuns:
    """The rows of ``segment`` a commit of roots ``new`` takes (``taken``: every root taken up to and with it).

    Where every row belongs to one tree (the usual case), a row is taken when
    its root is in ``new`` (which ``taken`` contains), and the sidecar's root
    runs are already runs of rows: one lookup per run. Rows anchored to
    several trees are decided row by row.
    """
    if segment.one_root_per_row:
        return KeptRuns(segment.root_lengths.astype(np.int64), member_of(segment.root_values, new))
    return KeptRuns.from_rows(taken_rows(segment.row_counts, segment.pair_roots, new, taken))


def _kept_in_round(segment: Segment, new: np.ndarray, taken: np.ndarray, owned: np.ndarray | None) -> KeptRuns:
    """:func:`kept_runs`, leaving out the rows whose copy another round of the commit gives (``owned``: see
    :func:`taken_rows`; None: this round gives every root)."""
    if owned is None:
        return kept_runs(segment, new, taken)
    if segment.one_root_per_row:
        return KeptRuns(segment.root_lengths.astype(np.int64), member_of(segment.root_values, owned))
    return KeptRuns.from_rows(taken_rows(segment.row_counts, segment.pair_roots, new, taken, owned))


def _owning_rounds(staged: list[tuple[int, Segment, bool]], new: np.ndarray) -> dict[int, np.ndarray]:
    """Per round, the roots of ``new`` whose rows the commit takes from it (sorted): each root from one round.

    ``staged``: ``(round, segment, its partition has a complete attempt)``. A root's round is the first whose
    every segment holding it is of a complete partition, else the first that holds it.
    """
    roots_parts, rounds_parts, complete_parts = [], [], []
    for round_no, segment, whole in staged:
        present = distinct(segment.root_values.astype(np.uint64))
        present = present[member_of(present, new)]
        roots_parts.append(present)
        rounds_parts.append(np.full(len(present), round_no, dtype=np.int64))
        complete_parts.append(np.full(len(present), whole, dtype=bool))
    if not roots_parts:
        return {}
    roots = np.concatenate(roots_parts)
    rounds = np.concatenate(rounds_parts)
    complete = np.concatenate(complete_parts)
    # One entry per (root, round): complete if every segment of that round holding the root is.
    order = np.lexsort((rounds, roots))
    roots, rounds, complete = roots[order], rounds[order], complete[order]
    start = np.flatnonzero(np.concatenate(([True], (roots[1:] != roots[:-1]) | (rounds[1:] != rounds[:-1]))))
    roots, rounds = roots[start], rounds[start]
    complete = np.minimum.reduceat(complete.astype(np.int8), start).astype(bool)
    # Per root, the first complete round, else the first round.
    order = np.lexsort((rounds, ~complete, roots))
    roots, rounds = roots[order], rounds[order]
    first = np.concatenate(([True], roots[1:] != roots[:-1]))
    roots, rounds = roots[first], rounds[first]
    return {int(r): roots[rounds == r] for r in distinct(rounds).tolist()}


def plan_commit(
    area: StagingArea, rounds: tuple[int, ...], new: np.ndarray | None, taken: np.ndarray | None
) -> PublishPlan:
    """The file actions of a commit of roots ``new`` (``taken``: every root taken up to and with it).

    ``new`` and ``taken`` None: the commit takes every delivery its one round
    started (a whole commit), so every row of the attempts chosen is taken
    with no lookup of its tree (ten million lookups at ten million records).
    """
    if new is None and len(set(rounds)) > 1:
        raise ValueError("a commit of several rounds needs its roots: a root staged in two is taken from one")
    staged: list[tuple[int, Segment, bool]] = []  # (round, segment, its partition has a complete attempt)
    for round_no in rounds:
        by_partition: dict[int, list[TaskFolder]] = {}
        for task in task_folders(area.round_dir(round_no)):
            by_partition.setdefault(task.partition, []).append(task)
        for _, tasks in sorted(by_partition.items()):
            complete = [t for t in tasks if t.complete]
            chosen = [min(complete, key=lambda t: t.attempt)] if complete else sorted(tasks, key=lambda t: t.attempt)
            for task in chosen:
                staged.extend((round_no, segment, bool(complete)) for segment in read_segments(task))
    # Sidecars only: a root staged in two rounds is taken from one (see the module's docstring).
    owners = _owning_rounds(staged, new) if new is not None and len(set(rounds)) > 1 else None
    actions: list[FileAction] = []
    seen: set[int] = set()
    partition: tuple[int, int] | None = None
    for round_no, segment, has_complete in staged:
        if (round_no, segment.task.partition) != partition:
            partition, seen = (round_no, segment.task.partition), set()
        owned = None if owners is None else owners.get(round_no, _NONE)
        if new is None or taken is None:
            kept = KeptRuns.every_row(int(segment.file_rows.sum()))
        else:
            kept = _kept_in_round(segment, new, taken, owned)
        if not has_complete:
            kept = KeptRuns.from_rows(kept.rows() & _first_copies(segment, seen))
        seen.update(segment.batch_keys.tolist())
        actions.extend(_file_actions(round_no, segment, kept))
    return PublishPlan(actions)


def stage_commit(plan: PublishPlan, staging: Path) -> None:
    """Carry out a plan into a commit's staging folder (again after a crash: what is done stays done)."""
    for action in plan.actions:
        target = staging / action.target
        if action.keep is None:
            if not action.source.exists():
                if target.exists():
                    continue  # moved by the try a crash cut short
                raise FileNotFoundError(f"staged output file {action.source} is missing: the staging area was changed")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(action.source, target)
            continue
        for hook in READS:
            hook(action.source)
        table = pq.read_table(action.source)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        metadata = pq.read_metadata(action.source)
        compression = metadata.row_group(0).column(0).compression.lower() if metadata.num_row_groups else "snappy"
        pq.write_table(table.filter(pa.array(action.keep)), tmp, compression=compression)
        fsync_path(tmp)
        os.replace(tmp, target)


def _first_copies(segment: Segment, seen: set[int]) -> np.ndarray:
    """Per row of the segment (file order): False if its batch's key was staged before (another attempt's copy)."""
    keep_by_file = [np.ones(int(n), dtype=bool) for n in segment.file_rows]
    filled = [0] * len(keep_by_file)
    keys = segment.batch_keys
    for batch, file, rows in segment.batch_file_rows.tolist():
        start = filled[file]
        if int(keys[batch]) in seen:
            keep_by_file[file][start : start + rows] = False
        filled[file] = start + rows
    return np.concatenate(keep_by_file) if keep_by_file else np.zeros(0, dtype=bool)


def _file_actions(round_no: int, segment: Segment, kept: KeptRuns) -> list[FileAction]:
    out = []
    start = 0
    task = segment.task
    per_row: np.ndarray | None = None  # expanded only if a file is taken in part
    for index, (rows, count) in enumerate(
        zip(segment.file_rows.tolist(), kept.kept_per_file(segment.file_rows).tolist())
    ):
        first, start = start, start + rows
        if not count:
            continue
        keep = None
        if count != rows:
            per_row = kept.rows() if per_row is None else per_row
            keep = per_row[first:start]
        relative = Path(segment.files[index])
        name = f"part-r{round_no:05d}-p{task.partition:05d}-t{task.attempt}-{relative.name}"
        target = str(relative.parent / name) if str(relative.parent) != "." else name
        out.append(FileAction(segment.path(index), target, keep, count))
    return out
