"""Executor side of the ``acker_spout`` stream: partitions name source coordinates, ``read`` reads and starts trees.

A micro-batch's partitions carry no record. A :class:`ChunkPartition` names a
byte range of one file of the source directory; a :class:`ReplayPartition`
names the byte offsets of lines of one file to read again, with their attempt
numbers. :func:`read_partition` runs in the executor task (Spark calls the
stream reader's ``read`` there): it reads the lines, gives each its identity
(file number in the stream's file registry, byte offset of the line), and
starts their trees as the source pipeline's reader does
(:func:`~acker_spark.tracking.tree_start.start_trees`: roots derived from (run salt,
identity, attempt), logged to the task attempt's emission log in the
checkpoint, then initialised column-wise). A retried task re-sends the same set-once
inits. Lines belong to the range their first byte falls in, so a file cut at
any byte is read exactly once, whatever the cut.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from acker_client.columns import U64
from pyspark.sql.datasource import InputPartition

from ..tracking.emission_log import EmissionWriter, read_filter
from ..tracking.identity import UnstableIdentity
from ..tracking.init_sender import InitSender
from ..tracking.tree_start import start_trees

__all__ = [
    "ARROW_SCHEMA",
    "FILE_SHIFT",
    "ChunkPartition",
    "ReplayPartition",
    "RoundContext",
    "SourceFile",
    "make_idents",
    "read_lines",
    "read_lines_at",
    "read_partition",
    "split_idents",
]

FILE_SHIFT = 40
"""An identity is ``file number << 40 | byte offset``: files up to 1 TiB, 16 million files per stream."""
_OFFSET_MASK = np.uint64((1 << FILE_SHIFT) - 1)
MAX_FILES = 1 << (64 - FILE_SHIFT)

ARROW_SCHEMA = pa.schema(
    [("key", pa.string()), ("value", pa.string()), ("attempt", pa.int32()), ("_acker_ids", pa.binary())]
)
"""The rows ``read`` yields: the stream's schema ``key, value, attempt, _acker_ids`` in Arrow form."""

_BATCH_ROWS = 10_000  # rows per Arrow batch: each batch is logged, then its inits are sent


@dataclass(frozen=True)
class SourceFile:
    """One file admitted to the stream: its number, path relative to the directory, and what it was when admitted."""

    index: int
    name: str
    size: int
    mtime_ns: int

    def as_json(self) -> list[Any]:
        """A JSON-able form, for the file registry."""
        return [self.name, self.size, self.mtime_ns]


@dataclass(frozen=True)
class RoundContext:
    """What every partition of one micro-batch needs to start trees (picklable, no client in it)."""

    directory: str
    checkpoint: str
    salt: int
    spout: str
    round_no: int
    addresses: tuple[str, ...]
    security: Any = None
    client_options: dict[str, Any] = field(default_factory=dict)


class ChunkPartition(InputPartition):
    """Read the lines of ``file`` whose first byte is in ``[start, end)``, as first deliveries.

    ``skip`` names a filter file of identities not to read again (a batch that
    Spark runs again after a query restart: the records it had started are
    settled or replayed through their outcomes).
    """

    def __init__(
        self, index: int, context: RoundContext, file: SourceFile, start: int, end: int, skip: str | None
    ) -> None:
        super().__init__((file.name, start, end))
        self.index, self.context, self.file = index, context, file
        self.start, self.end, self.skip = start, end, skip


class ReplayPartition(InputPartition):
    """Read again the lines of ``file`` at byte ``offsets``, each as delivery ``attempts[i]``."""

    def __init__(
        self, index: int, context: RoundContext, file: SourceFile, offsets: np.ndarray, attempts: np.ndarray
    ) -> None:
        super().__init__((file.name, len(offsets)))
        self.index, self.context, self.file = index, context, file
        self.offsets, self.attempts = offsets, attempts


def make_idents(file_index: int, offsets: np.ndarray) -> np.ndarray:
    """The identities of lines at byte ``offsets`` of file ``file_index``."""
    if file_index >= MAX_FILES:
        raise ValueError(f"a stream reads at most {MAX_FILES} files; start a new checkpoint")
    return (np.uint64(file_index) << np.uint64(FILE_SHIFT)) | np.asarray(offsets, dtype=U64)


def split_idents(idents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(file numbers, byte offsets)`` of identities."""
    idents = np.asarray(idents, dtype=U64)
    return (idents >> np.uint64(FILE_SHIFT)).astype(np.int64), (idents & _OFFSET_MASK).astype(np.int64)


def check_unchanged(path: Path, file: SourceFile) -> None:
    """Refuse a file whose size or modification time differ from when it was admitted (offsets would lie)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise UnstableIdentity(
            f"{path} was admitted to the stream but is gone: its records cannot be read (again). Restore it, or"
            " start the query with a new checkpoint."
        ) from None
    if (stat.st_size, stat.st_mtime_ns) != (file.size, file.mtime_ns):
        raise UnstableIdentity(
            f"{path} changed after it was admitted to the stream (size {file.size} -> {stat.st_size}): records are"
            " identified by their byte offsets, which would point at other data. Put files in place complete"
            " (write elsewhere, then rename) and never change them."
        )


def _lines(data: bytes, base: int, path: Path) -> tuple[np.ndarray, pa.Array]:
    """The non-blank lines of ``data`` (read from byte ``base``): their byte offsets and text, column-wise."""
    if not data:
        return np.zeros(0, dtype=np.int64), pa.array([], pa.string())
    buf = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([0], np.flatnonzero(buf == 10) + 1))
    if starts[-1] == len(data):
        starts = starts[:-1]  # the data ends with a newline: no line after it
    offsets = np.append(starts, len(data)).astype(np.int64)
    raw = pa.Array.from_buffers(pa.large_string(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        raw.validate(full=True)
    except pa.ArrowInvalid as err:
        raise ValueError(f"{path} is not UTF-8 text near byte {base}: {err}") from None
    text = pc.utf8_rtrim(raw, characters="\r\n")
    keep = pc.not_equal(pc.utf8_trim_whitespace(text), "").to_numpy(zero_copy_only=False)
    return (starts + base)[keep], text.filter(pa.array(keep)).cast(pa.string())


def read_lines(path: Path, start: int, end: int) -> tuple[np.ndarray, pa.Array]:
    """The non-blank lines whose first byte is in ``[start, end)``: byte offsets and text."""
    with open(path, "rb") as f:
        pos = 0
        if start > 0:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())  # the line under way at start belongs to the range before
        if pos >= end:
            return _lines(b"", pos, path)
        f.seek(pos)
        data = f.read(end - pos)
        if data and not data.endswith(b"\n"):
            data += f.readline()  # the last line starts in range: read it to its end
    return _lines(data, pos, path)


def read_lines_at(path: Path, offsets: np.ndarray) -> list[str]:
    """The lines starting at byte ``offsets`` (replays and dead letters: a few records, read one by one)."""
    out = []
    with open(path, "rb") as f:
        for offset in offsets.tolist():
            f.seek(offset)
            out.append(f.readline().decode("utf-8").rstrip("\r\n"))
    return out


def read_partition(partition: ChunkPartition | ReplayPartition) -> Iterator[pa.RecordBatch]:
    """Read a partition's records, log and init their trees, yield them as the stream's rows (in an executor)."""
    ctx, file = partition.context, partition.file
    path = Path(ctx.directory) / file.name
    check_unchanged(path, file)
    if isinstance(partition, ChunkPartition):
        offsets, values = read_lines(path, partition.start, partition.end)
        attempts = np.ones(len(offsets), dtype=np.uint16)
        idents = make_idents(file.index, offsets)
        if partition.skip is not None and len(idents):
            keep, _ = read_filter(partition.skip).apply(idents)
            offsets, values, attempts, idents = (
                offsets[keep],
                values.filter(pa.array(keep)),
                attempts[keep],
                idents[keep],
            )
    else:
        offsets, attempts = partition.offsets, partition.attempts.astype(np.uint16)
        values = pa.array(read_lines_at(path, offsets), pa.string())
        idents = make_idents(file.index, offsets)
    if not len(idents):
        return
    from pyspark import TaskContext

    from ..steps.step import client_for

    task = TaskContext.get()
    writer = EmissionWriter(ctx.checkpoint, ctx.round_no, partition.index, task.taskAttemptId() if task else 0)
    # Inits go out on a thread of the task while it reads on; the emission log is still written first.
    inits = InitSender(client_for(ctx.addresses, ctx.security, **ctx.client_options))
    keys = pc.binary_join_element_wise(pa.scalar(file.name + "@"), pc.cast(pa.array(offsets), pa.string()), "").cast(
        pa.string()
    )
    try:
        for lo in range(0, len(idents), _BATCH_ROWS):
            hi = min(lo + _BATCH_ROWS, len(idents))
            trees = start_trees(ctx.salt, idents[lo:hi], attempts[lo:hi], log=writer, client=inits, spout=ctx.spout)
            yield pa.RecordBatch.from_arrays(
                [keys[lo:hi], values[lo:hi], pa.array(attempts[lo:hi].astype(np.int32)), trees.ids],
                schema=ARROW_SCHEMA,
            )
        inits.flush()  # the task ends once every init was applied; a shard that cannot be reached fails it
    finally:
        inits.close()  # after a flush a no-op; else the task is failing: drop what is left
        writer.close()
