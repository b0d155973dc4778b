"""Executor side of exactly-once output: each task writes its output rows once, durably, then acks them.

:class:`OutputStager` is the last step of a tracked job that hands its output
to the pipeline (``SourcePipeline(..., output=...)``). It runs with
``mapInArrow`` in the tasks that produce the output rows and:

1. checks that every row is anchored to at least one record (``_acker_ids``
   not empty: a row that belongs to no record cannot be committed with it);
2. writes the rows into the round's staging area
   (:mod:`acker_spark.output.staging`): for a Parquet ``FileOutput``, the
   user's columns in the destination's layout (Hive partition folders), on the
   destination's filesystem, ready to be published by a rename; else the rows
   with ``_acker_ids`` under the checkpoint. Files are rolled together in
   *segments* of ``segment_rows`` rows (or ``segment_bytes`` of Arrow data):
   a segment's files are closed, pushed to disk (``fsync``, once per file)
   and described by a sidecar (each row's roots, each batch's ack key);
4. only then acks the segment's batches (a sink: each pair's id, XOR-folded
   per root, one ack call per Arrow batch) and flushes;
5. when the task's iterator ends, marks the task attempt complete.

So a tree can only complete once every output row of it is on disk, and a
task killed half-way has staged and acked the segments before the kill: only
the rest is redone. The ack of a batch carries a dedup key derived from the
batch's pairs, so a re-run or speculative attempt that stages the very same
batch is ignored by the ackers; a re-run that cuts its batches differently
acks some rows twice, which cannot complete a tree falsely (the rows' own
edges reappear): those trees time out and are replayed. What the destination
receives is decided on the driver (:mod:`acker_spark.output.commits`): only
rows whose every tree ACKED, one copy of each.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from acker_client.columns import fold_xor

from ..steps.arrow_collector import acks_key
from ..steps.frames import TRACKING_COLUMN, PairColumn, decode_ids
from .staging import DONE, STAGED_DIR, StagingArea, fsync_path, partition_dir, run_lengths

__all__ = ["STAGED_DIR", "OutputStager", "UnanchoredOutput", "staged_dir", "stager_schema"]

_STAGER_SALT = 0x5D1F_0C7A_9E3B_4A21  # keeps the stager's keys apart from a bolt's with the same salt
_BUFFER_ROWS = 131_072  # rows held per file before they go out as one Parquet row group


class UnanchoredOutput(ValueError):
    """An output row carries no ``_acker_ids`` pair: it belongs to no record, so no record's ack can commit it."""


def staged_dir(checkpoint: str | Path, round_no: int) -> Path:
    """The folder of round ``round_no``'s rows-kind staged output under the checkpoint."""
    return Path(checkpoint) / STAGED_DIR / f"r{round_no:05d}"


def stager_schema() -> Any:
    """The stager's result: one row per staged segment with its row count (the driver sums them)."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("staged_rows", LongType(), False)])


@dataclass
class OutputStager:
    """The picklable ``mapInArrow`` function that stages one round's output rows and acks them, segment by segment."""

    area: StagingArea
    round_no: int
    salt: int
    addresses: Sequence[str]
    security: Any = None
    client_options: dict[str, Any] = field(default_factory=dict)
    segment_rows: int = 2_000_000
    segment_bytes: int = 256 << 20

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run over one task's output batches (Spark calls it with the partition's Arrow batches)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt_id = (context.partitionId(), context.taskAttemptId()) if context else (0, 0)
        return self.run(batches, partition, attempt_id)

    def run(self, batches: Iterator[pa.RecordBatch], partition: int, task_attempt: int) -> Iterator[pa.RecordBatch]:
        """Stage each non-empty batch into the open segment; close, sync and ack a segment once it is full."""
        from ..steps.step import client_for

        client = client_for(self.addresses, self.security, **self.client_options)
        folder = self.area.round_dir(self.round_no) / f"p{partition:05d}-t{task_attempt}"
        segment: _SegmentWriter | None = None
        seq = 0
        for batch in batches:
            if not batch.num_rows:
                continue
            pairs = self._pairs(batch, partition)
            roots, values = fold_xor(pairs.roots, pairs.ids)  # a sink acks each pair's own edge
            key = acks_key(self.salt ^ _STAGER_SALT, roots, values)
            if segment is None:
                segment = _SegmentWriter(folder, seq, self.area)
            segment.add(batch, pairs, roots, values, key)
            if segment.rows >= self.segment_rows or segment.bytes >= self.segment_bytes:
                yield segment.close(client)
                segment, seq = None, seq + 1
        if segment is not None:
            yield segment.close(client)
        if seq or segment is not None:
            _write_marker(folder / DONE)  # every row this attempt got is in its segments

    def _pairs(self, batch: pa.RecordBatch, partition: int) -> PairColumn:
        if TRACKING_COLUMN not in batch.schema.names:
            raise ValueError(
                f"the job's output has no {TRACKING_COLUMN!r} column ({batch.schema.names}): return the "
                "DataFrame your last bolt produced (or a selection of it that keeps the column)"
            )
        pairs = decode_ids(batch.column(TRACKING_COLUMN))
        counts = pairs.counts
        if (counts == 0).any():
            row = int(np.flatnonzero(counts == 0)[0])
            raise UnanchoredOutput(
                f"output row {row} of partition {partition} is anchored to no record (empty {TRACKING_COLUMN}):"
                " exactly-once output commits each row with the record it derives from; emit it with an"
                " anchor (collector.emit(out, anchors=...))"
            )
        return pairs


class _SegmentWriter:
    """One open segment of a task: a Parquet writer per file (per partition value), the sidecar's figures, held acks."""

    def __init__(self, folder: Path, seq: int, area: StagingArea) -> None:
        self.folder, self.seq, self.area = folder, seq, area
        self.index: dict[str, int] = {}  # partition folder -> file number
        self.names: list[str] = []  # the files, relative to the task folder, in file order
        self.writers: list[pq.ParquetWriter | None] = []
        self.buffers: list[list[pa.RecordBatch]] = []
        self.buffered: list[int] = []
        self.file_rows: list[int] = []
        self.counts: list[list[np.ndarray]] = []  # per file: pairs per row, by batch
        self.roots: list[list[np.ndarray]] = []  # per file: the rows' roots, by batch
        self.triplets: list[tuple[int, int, int]] = []  # (batch, file, rows)
        self.keys: list[int] = []
        self.acks: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.rows = 0
        self.bytes = 0

    def add(self, batch: pa.RecordBatch, pairs: PairColumn, roots: np.ndarray, values: np.ndarray, key: int) -> None:
        """Stage one batch's rows (split by partition value for direct staging); hold its acks until the close."""
        number = len(self.keys)
        self.keys.append(key)
        self.acks.append((roots, values, key))
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        if not self.area.direct:
            self._put("", batch, pairs.counts, pairs.roots, number)
            return
        data = batch.drop_columns([TRACKING_COLUMN, *self.area.partition_by])
        if not self.area.partition_by:
            self._put("", data, pairs.counts, pairs.roots, number)
            return
        for sub, rows in _partitions(batch, self.area.partition_by):
            index, _ = pairs.gather(rows)
            self._put(sub, data.take(pa.array(rows)), pairs.counts[rows], pairs.roots[index], number)

    def _put(self, sub: str, data: pa.RecordBatch, counts: np.ndarray, roots: np.ndarray, batch: int) -> None:
        file = self.index.get(sub)
        if file is None:
            file = self._open(sub)
        self.buffers[file].append(data)
        self.buffered[file] += data.num_rows
        self.file_rows[file] += data.num_rows
        self.counts[file].append(counts)
        self.roots[file].append(roots)
        self.triplets.append((batch, file, data.num_rows))
        if self.buffered[file] >= _BUFFER_ROWS:
            self._drain(file)

    def _open(self, sub: str) -> int:
        file = len(self.names)
        name = f"s{self.seq:05d}-f{file:05d}.parquet"
        self.index[sub] = file
        self.names.append(f"{sub}/{name}" if sub else name)
        self.writers.append(None)
        self.buffers.append([])
        self.buffered.append(0)
        self.file_rows.append(0)
        self.counts.append([])
        self.roots.append([])
        return file

    def _drain(self, file: int) -> None:
        """Write the file's buffered rows as one row group."""
        buffered = self.buffers[file]
        if not buffered:
            return
        table = pa.Table.from_batches(buffered)
        writer = self.writers[file]
        if writer is None:
            path = self._tmp(file)
            path.parent.mkdir(parents=True, exist_ok=True)
            writer = pq.ParquetWriter(str(path), table.schema, compression=self.area.compression)
            self.writers[file] = writer
        writer.write_table(table)
        self.buffers[file], self.buffered[file] = [], 0

    def _tmp(self, file: int) -> Path:
        final = self.folder / self.names[file]
        return final.with_name(f".{final.name}.tmp")

    def close(self, client: Any) -> pa.RecordBatch:
        """Finish every file (fsync each), write the sidecar, then send the held acks; one count row."""
        for file, name in enumerate(self.names):
            self._drain(file)
            writer = self.writers[file]
            assert writer is not None, "a file is opened with rows"
            writer.close()
            tmp = self._tmp(file)
            fsync_path(tmp)
            os.replace(tmp, self.folder / name)
        counts = np.concatenate([c for per_file in self.counts for c in per_file]).astype(np.int32)
        roots = np.concatenate([r for per_file in self.roots for r in per_file]).astype(np.uint64)
        count_values, count_lengths = run_lengths(counts)
        root_values, root_lengths = run_lengths(roots)
        sidecar = {
            "files": np.array(self.names),
            "file_rows": np.array(self.file_rows, dtype=np.int64),
            "count_values": count_values,
            "count_lengths": count_lengths,
            "root_values": root_values,
            "root_lengths": root_lengths,
            "batch_keys": np.array(self.keys, dtype=np.uint64),
            "batch_file_rows": np.array(self.triplets, dtype=np.int64).reshape(-1, 3),
        }
        _write_npz(self.folder / f"_s{self.seq:05d}.npz", sidecar)
        for roots_, values, key in self.acks:
            client.ack_columns(roots_, values, dedup_key=key)
        client.flush()  # acked before the next segment is read: a kill redoes only what follows
        return pa.RecordBatch.from_arrays([pa.array([self.rows], pa.int64())], names=["staged_rows"])


def _partitions(batch: pa.RecordBatch, names: tuple[str, ...]) -> Iterator[tuple[str, np.ndarray]]:
    """The batch's rows grouped by partition value: each group's folder and row indexes (in batch order)."""
    codes = np.zeros(batch.num_rows, dtype=np.int64)
    for name in names:
        encoded = pc.dictionary_encode(batch.column(name))
        indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
        codes = codes * (len(encoded.dictionary) + 1) + indices
    order = np.argsort(codes, kind="stable")
    _, lengths = run_lengths(codes[order])
    start = 0
    for length in lengths.tolist():
        rows = order[start : start + length]
        first = int(rows[0])
        yield partition_dir(names, tuple(batch.column(name)[first].as_py() for name in names)), rows
        start += length


def _write_marker(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.flush()
        os.fsync(out.fileno())


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as an ``.npz`` at ``path``: a temporary name, fsync, then rename (complete or absent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(buffer.getvalue())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
