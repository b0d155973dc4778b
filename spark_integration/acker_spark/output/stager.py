"""Executor side of exactly-once output: each Arrow batch of the job's output is staged durably, then acked.

:class:`OutputStager` is the last step of a tracked job that hands its output
to the pipeline (``SourcePipeline(..., output=...)``). It runs with
``mapInArrow`` in the tasks that produce the output rows and, per Arrow batch:

1. checks that every row is anchored to at least one record (``_acker_ids``
   not empty: a row that belongs to no record cannot be committed with it);
2. writes the batch, user columns plus ``_acker_ids``, as one Parquet file
   under the checkpoint (``output/staged/r<round>/p<partition>-t<task
   attempt>-b<batch>.parquet``): written to a temporary name, pushed to disk
   (``fsync``), then renamed, so a file with its final name is complete;
3. acks the rows (a sink: each pair's id, XOR-folded per root) and flushes.

So a tree can only complete once every output row of it is on disk, and a
task killed half-way has staged and acked the batches before the kill: only
the rest is redone. The ack of a batch carries a dedup key derived from the
batch's pairs, so a re-run or speculative attempt that stages the very same
batch is ignored by the ackers; a re-run that cuts its batches differently
acks some rows twice, which cannot complete a tree falsely (the rows' own
edges reappear): those trees time out and are replayed. What the destination
receives is decided on the driver (:mod:`acker_spark.output.commits`): only
rows whose every tree ACKED, one copy of each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from acker_client.columns import fold_xor

from ..steps.arrow_collector import acks_key
from ..steps.frames import TRACKING_COLUMN, decode_ids

__all__ = ["STAGED_DIR", "OutputStager", "UnanchoredOutput", "staged_dir", "stager_schema"]

STAGED_DIR = "output/staged"
"""Where, under the checkpoint, the executors stage output rows (one folder per round)."""

_STAGER_SALT = 0x5D1F_0C7A_9E3B_4A21  # keeps the stager's keys apart from a bolt's with the same salt


class UnanchoredOutput(ValueError):
    """An output row carries no ``_acker_ids`` pair: it belongs to no record, so no record's ack can commit it."""


def staged_dir(checkpoint: str | Path, round_no: int) -> Path:
    """The folder of round ``round_no``'s staged output files."""
    return Path(checkpoint) / STAGED_DIR / f"r{round_no:05d}"


def stager_schema() -> Any:
    """The stager's result: one row per staged batch with its row count (the driver sums them)."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("staged_rows", LongType(), False)])


@dataclass
class OutputStager:
    """The picklable ``mapInArrow`` function that stages one round's output rows and acks them, batch by batch."""

    checkpoint: str
    round_no: int
    salt: int
    addresses: Sequence[str]
    security: Any = None
    client_options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run over one task's output batches (Spark calls it with the partition's Arrow batches)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt_id = (context.partitionId(), context.taskAttemptId()) if context else (0, 0)
        return self.run(batches, partition, attempt_id)

    def run(self, batches: Iterator[pa.RecordBatch], partition: int, task_attempt: int) -> Iterator[pa.RecordBatch]:
        """Stage, then ack, each non-empty batch; yield one count row per staged batch."""
        from ..steps.step import client_for

        client = client_for(self.addresses, self.security, **self.client_options)
        folder = staged_dir(self.checkpoint, self.round_no)
        for number, batch in enumerate(batches):
            if not batch.num_rows:
                continue
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
            write_durably(folder / f"p{partition:05d}-t{task_attempt}-b{number:06d}.parquet", batch)
            roots, values = fold_xor(pairs.roots, pairs.ids)  # a sink acks each pair's own edge
            client.ack_columns(roots, values, dedup_key=acks_key(self.salt ^ _STAGER_SALT, roots, values))
            client.flush()  # acked before the next batch is read: a kill redoes only what follows
            yield pa.RecordBatch.from_arrays([pa.array([batch.num_rows], pa.int64())], names=["staged_rows"])


def write_durably(path: Path, batch: pa.RecordBatch) -> None:
    """Write ``batch`` as a Parquet file at ``path``: a temporary name, fsync, then rename (complete or absent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        pq.write_table(pa.Table.from_batches([batch]), out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
