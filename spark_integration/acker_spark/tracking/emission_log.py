"""The emission log: which roots the executors started, written by the tasks, read by the driver as numpy columns.

Every task attempt that reads records appends one Arrow IPC stream under the
checkpoint directory, ``emissions/r<round>/p<partition>-t<task attempt>.arrow``,
with a batch ``(root, ident, attempt)`` per Arrow batch it read, sorted by root
(so the driver merges sorted runs), flushed **before** the batch's inits are
sent: a tree the ackers know is always in the log. A retried or speculative
attempt writes its own file with the same roots (they are derived from the
identities). The driver reads a round's files after its job, tolerating the
truncated tail of an attempt that died mid-write.

The round's filter (which records a round reads) lives next to it,
``rounds/r<round>.npz``: ``all``, ``skip`` (identities already started: the
first read resumed after a crash) or ``select`` (the replays, each with its
attempt number).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..task_roots import EMISSIONS_DIR, emission_file_name
from .checkpoint import read_complete_batches

__all__ = [
    "EMISSION_SCHEMA",
    "Emissions",
    "EmissionWriter",
    "RoundFilter",
    "RoundRows",
    "read_round",
    "write_filter",
    "read_filter",
]

EMISSION_SCHEMA = pa.schema([("root", pa.uint64()), ("ident", pa.uint64()), ("attempt", pa.uint16())])


def round_dir(checkpoint: str | Path, round_no: int) -> Path:
    """The directory of round ``round_no``'s emission files."""
    return Path(checkpoint) / EMISSIONS_DIR / f"r{round_no:05d}"


class EmissionWriter:
    """One task attempt's emission file, opened on the first batch (a task that reads nothing writes nothing)."""

    def __init__(self, checkpoint: str | Path, round_no: int, partition: int, task_attempt: int) -> None:
        # The name bolts of the same task look for (acker_spark.task_roots): they lease these trees too.
        self.path = round_dir(checkpoint, round_no) / emission_file_name(partition, task_attempt)
        self._file: Any = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def write(self, roots: np.ndarray, idents: np.ndarray, attempts: np.ndarray) -> None:
        """Append one batch, sorted by root, and push it to the operating system (before its inits go out).

        Sorted here, on the executor, so that the driver merges sorted runs,
        cheaper than sorting random roots (docs/benchmarks.md).
        """
        order = np.argsort(roots)
        roots, idents, attempts = roots[order], idents[order], attempts[order]
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "wb")  # noqa: SIM115 - held open across batches, closed in close()
            self._writer = pa.ipc.new_stream(self._file, EMISSION_SCHEMA)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(roots, pa.uint64()), pa.array(idents, pa.uint64()), pa.array(attempts, pa.uint16())],
            schema=EMISSION_SCHEMA,
        )
        self._writer.write_batch(batch)
        assert self._file is not None
        self._file.flush()

    def close(self) -> None:
        """Finish the stream (an end-of-stream marker) and close the file."""
        if self._writer is not None:
            self._writer.close()
            assert self._file is not None
            self._file.close()
            self._writer = self._file = None


@dataclass(frozen=True)
class Emissions:
    """A round's started deliveries as parallel arrays sorted by root (one entry per root, repeats across attempts removed).

    ``duplicates`` counts roots that two different partitions started, or one
    attempt started twice: records sharing an identity.
    """

    roots: np.ndarray
    idents: np.ndarray
    attempts: np.ndarray
    duplicates: int


def read_round(checkpoint: str | Path, round_no: int) -> Emissions:
    """Every root started in round ``round_no`` so far, from all of its task attempts' files."""
    # Columns of every batch as zero-copy numpy views: one concatenation copies them, once.
    roots: list[np.ndarray] = []
    idents: list[np.ndarray] = []
    attempts: list[np.ndarray] = []
    partitions: list[int] = []  # each file's partition, in file order
    rows: list[int] = []  # each file's row count
    folder = round_dir(checkpoint, round_no)
    names = sorted(os.listdir(folder)) if folder.is_dir() else []
    for name in names:
        if not name.endswith(".arrow"):
            continue
        batches = [b for b in read_complete_batches(folder / name) if b.num_rows]
        if not batches:
            continue
        roots.extend(b.column(0).to_numpy() for b in batches)
        idents.extend(b.column(1).to_numpy() for b in batches)
        attempts.extend(b.column(2).to_numpy() for b in batches)
        partitions.append(int(name[1:6]))
        rows.append(sum(b.num_rows for b in batches))
    if not roots:
        empty = np.zeros(0, dtype=np.uint64)
        return Emissions(empty, empty, np.zeros(0, dtype=np.uint16), 0)
    all_roots = np.concatenate(roots)
    # Each batch was written sorted (EmissionWriter.write), so the stable sort merges runs: faster
    # than sorting random roots, and it keeps the files' partition order for a repeated root.
    order = np.argsort(all_roots, kind="stable")
    sorted_roots = all_roots[order]
    same = sorted_roots[1:] == sorted_roots[:-1]
    if not same.any():  # the usual round: every root once (no re-run, no shared identity)
        return Emissions(sorted_roots, np.concatenate(idents)[order], np.concatenate(attempts)[order], 0)
    part = np.repeat(np.asarray(partitions, dtype=np.int32), rows)[order]
    file = np.repeat(np.arange(len(rows), dtype=np.int32), rows)[order]
    # The same root twice in one file, or from two partitions, is two records with one identity;
    # from two attempts (files) of one partition it is a re-run: expected, kept once.
    duplicates = int((same & ((part[1:] != part[:-1]) | (file[1:] == file[:-1]))).sum())
    first = order[np.concatenate(([True], ~same))]
    return Emissions(all_roots[first], np.concatenate(idents)[first], np.concatenate(attempts)[first], duplicates)


class RoundRows:
    """Counts the rows a running round's tasks have logged so far (the progress view, on its own thread).

    Each file is read on from where the last count stopped (its last whole
    batch), so a count costs the batches written since, not the file: the
    files grow all through a job, and reading each whole at every look cost
    the driver seconds of CPU at ten million records. A retried task's file
    counts again (an estimate while the job runs; the book counts exactly
    after it).
    """

    def __init__(self, checkpoint: str | Path) -> None:
        self.checkpoint = checkpoint
        self._round = -1
        self._files: dict[str, tuple[int, int, int]] = {}  # name -> (size seen, offset read to, rows counted)

    def count(self, round_no: int) -> int:
        """Rows logged by round ``round_no``'s task attempts so far."""
        if round_no != self._round:
            self._round, self._files = round_no, {}
        folder = round_dir(self.checkpoint, round_no)
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".arrow")]
        except FileNotFoundError:
            return 0
        for name in names:
            try:
                size = os.stat(folder / name).st_size
            except FileNotFoundError:
                continue
            seen, offset, rows = self._files.get(name, (-1, 0, 0))
            if size == seen:
                continue
            if size < offset:  # not the file counted before: count it afresh
                offset, rows = 0, 0
            offset, more = count_batches_from(folder / name, offset)
            self._files[name] = (size, offset, rows + more)
        return sum(rows for _, _, rows in self._files.values())


def count_batches_from(path: Path, offset: int) -> tuple[int, int]:
    """``(offset after the last whole batch, rows in the whole batches)`` of an emission file read from ``offset``.

    ``offset`` is 0 or an offset this function returned for the same file: the
    start of a message. A torn last message (its writer is writing it, or died)
    is left for the next count.
    """
    rows = 0
    try:
        with pa.OSFile(str(path), "rb") as source:
            source.seek(offset)
            while True:
                message = pa.ipc.read_message(source)
                if message.type == "record batch":
                    rows += pa.ipc.read_record_batch(message, EMISSION_SCHEMA).num_rows
                offset = source.tell()
    except (pa.ArrowInvalid, OSError, EOFError):
        pass  # the end of the stream, or a message not whole yet
    return offset, rows


@dataclass(frozen=True)
class RoundFilter:
    """Which records a round reads: ``all``; ``skip`` the sorted ``idents``; or ``select`` them with ``attempts``."""

    mode: str
    idents: np.ndarray
    attempts: np.ndarray

    def apply(self, idents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(keep mask, attempt per kept row)`` for a batch's identity hashes."""
        if self.mode == "all":
            return np.ones(len(idents), dtype=bool), np.ones(len(idents), dtype=np.uint16)
        pos = np.searchsorted(self.idents, idents)
        pos[pos == len(self.idents)] = 0
        found = (self.idents[pos] == idents) if len(self.idents) else np.zeros(len(idents), dtype=bool)
        if self.mode == "skip":
            return ~found, np.ones(int((~found).sum()), dtype=np.uint16)
        return found, self.attempts[pos[found]]


def write_filter(checkpoint: str | Path, round_no: int, rows: RoundFilter) -> Path:
    """Store a round's filter (sorted by identity) atomically; executors read it by path."""
    order = np.argsort(rows.idents, kind="stable")
    path = Path(checkpoint) / "rounds" / f"r{round_no:05d}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, mode=np.array(rows.mode), idents=rows.idents[order], attempts=rows.attempts[order])
    os.replace(tmp, path)
    return path


_filters: dict[tuple[str, int, int], RoundFilter] = {}  # per executor process: one read per round, not per task


def read_filter(path: str) -> RoundFilter:
    """A round's filter (cached per process: every task of the round reads the same file).

    The cache key includes the file's size and modification time: a worker
    that outlives a driver (Spark Connect) must not reuse a filter rewritten
    under the same name.
    """
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size)
    cached = _filters.get(key)
    if cached is None:
        with np.load(path) as data:
            cached = RoundFilter(str(data["mode"]), data["idents"], data["attempts"])
        _filters.clear()  # an older round's filter is never read again
        _filters[key] = cached
    return cached
