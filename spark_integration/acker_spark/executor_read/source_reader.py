"""Executor side of the source pipeline: the task that reads the records starts their trees, column-wise.

:class:`SourceReader` runs in ``mapInArrow`` directly over the user's reader
(``spark.read...``), so it runs in the same task that reads the file split.
Per Arrow batch it hashes each record's identity, keeps the rows the round
reads (all of them, or the replays with their attempt numbers), and starts
their trees (:func:`~acker_spark.tracking.tree_start.start_trees`: roots derived from
(run, identity, attempt), logged to the task attempt's emission file, then
initialised with ``init_columns``, sent by a thread of the task while it reads on,
:class:`~acker_spark.tracking.init_sender.InitSender`; the task ends only once
they are all applied). A re-run or speculative attempt derives the same roots and
re-sends the same set-once inits, which the ackers ignore for trees still
pending. The rows go on with ``_record_key`` (the identity as text),
``_attempt`` and ``_acker_ids``, ready for the job's bolts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..round_stop import StopCheck
from ..steps.frames import TRACKING_COLUMN
from ..tracking.emission_log import EmissionWriter, read_filter
from ..tracking.identity import (
    BLOCK_COLUMN,
    PATH_COLUMN,
    ROW_COLUMN,
    IdentitySpec,
    hash_file_rows,
    hash_key_column,
    hash_strings,
)
from ..tracking.init_sender import InitSender
from ..tracking.tree_start import start_trees
from .record_keys import KeyWriter

__all__ = ["ATTEMPT_COLUMN", "IDENT_COLUMN", "KEY_COLUMN", "SourceReader", "reader_schema"]

KEY_COLUMN = "_record_key"
"""The record's identity as text (the key, or ``path#row`` / ``path@block#index``): name it in sinks and dead letters."""
ATTEMPT_COLUMN = "_attempt"
"""Which delivery of the record this row is (1 for the first read)."""

_HIDDEN = (PATH_COLUMN, BLOCK_COLUMN, ROW_COLUMN)


IDENT_COLUMN = "_ident"
"""Peek rounds only (dead letters): the identity hash, as a signed long, in place of ``_acker_ids``."""


def reader_schema(source_schema: Any, *, peek: bool = False) -> Any:
    """The reader's output schema: the source's columns, then ``_record_key``, ``_attempt``, ``_acker_ids``."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

    fields = [f for f in source_schema.fields if f.name not in _HIDDEN]
    return StructType(
        [
            *fields,
            StructField(KEY_COLUMN, StringType(), False),
            StructField(ATTEMPT_COLUMN, IntegerType(), False),
            StructField(IDENT_COLUMN, LongType(), False) if peek else StructField(TRACKING_COLUMN, BinaryType(), False),
        ]
    )


READ_SLICE = 2_000
"""Rows logged, started and yielded at a time: the run's progress counts a task's reads in steps of this many rows,
not of a whole Arrow batch (10,000 by default); the next step's batches are re-formed by Spark whatever it is."""


def _slices(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Each batch in consecutive slices of at most ``rows`` rows, in order (zero-copy)."""
    for batch in batches:
        if batch.num_rows <= rows:
            yield batch
            continue
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


@dataclass
class _LineState:
    """Where the previous batch of a task ended: its last (file, block) group and the next index in it."""

    path: int = -1
    block: int = -1
    next_index: int = 0


@dataclass
class SourceReader:
    """The picklable ``mapInArrow`` function of one round (``peek=True``: read only, start no trees)."""

    spec: IdentitySpec
    salt: int
    spout: str
    checkpoint: str
    round_no: int
    filter_path: str
    addresses: Sequence[str] | None
    security: Any = None
    client_options: dict[str, Any] = field(default_factory=dict)
    peek: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Run over one task's batches (Spark calls it with the partition's Arrow batches)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt_id = (context.partitionId(), context.taskAttemptId()) if context else (0, 0)
        return self.run(batches, partition, attempt_id)

    def run(self, batches: Iterator[pa.RecordBatch], partition: int, task_attempt: int) -> Iterator[pa.RecordBatch]:
        """Read, filter, log and init each batch, then yield it with the tracking columns; flush the inits at the end."""
        rows = read_filter(self.filter_path)
        tracking = self.addresses is not None and not self.peek
        inits = None
        if tracking:
            from ..steps.step import client_for

            assert self.addresses is not None
            # Inits go out on a thread of the task while it reads on; the log is still written first.
            inits = InitSender(client_for(self.addresses, self.security, **self.client_options))
        writer = EmissionWriter(self.checkpoint, self.round_no, partition, task_attempt) if not self.peek else None
        # Each tree's record as text, for operators (acker-ctl top --checkpoint): a root names no record.
        key_writer = KeyWriter(writer.path) if writer is not None else None
        state = _LineState()
        stop = StopCheck(self.checkpoint if not self.peek else None)  # the driver stopped the round: read no more
        try:
            for batch in _slices(batches, READ_SLICE):
                stop()
                idents, positions = self._idents(batch, state)
                keep, attempts = rows.apply(idents)
                if not keep.any():
                    continue
                if not keep.all():
                    batch, idents = batch.filter(pa.array(keep)), idents[keep]
                    positions = positions[keep] if positions is not None else None
                keys = self._keys(batch, positions)
                if self.peek:  # read only: the identity hash names the record, no tree is started
                    yield self._output(batch, keys, attempts, IDENT_COLUMN, pa.array(idents.view(np.int64)))
                    continue
                trees = start_trees(self.salt, idents, attempts, log=writer, client=inits, spout=self.spout)
                if key_writer is not None:
                    key_writer.write(trees.roots, keys)
                yield self._output(batch, keys, attempts, TRACKING_COLUMN, trees.ids)
            if inits is not None:
                # The task ends only once every init was applied; one that could not be
                # delivered fails the task, and Spark retries it.
                inits.flush()
        finally:
            if inits is not None:
                inits.close()  # after a flush a no-op; else the task is failing: drop what is left
            if writer is not None:
                writer.close()
            if key_writer is not None:
                key_writer.close()

    def _idents(self, batch: pa.RecordBatch, state: _LineState) -> tuple[np.ndarray, np.ndarray | None]:
        """Each row's identity hash, and for line-based files its index within its split (else None)."""
        kind = self.spec.kind
        if kind == "key":
            assert self.spec.column is not None
            return hash_key_column(batch.column(self.spec.column), self.spec.column), None
        paths = batch.column(PATH_COLUMN)
        if kind == "file_row":
            return hash_file_rows(paths, batch.column(ROW_COLUMN).to_numpy(zero_copy_only=False)), None
        blocks = batch.column(BLOCK_COLUMN).to_numpy(zero_copy_only=False).astype(np.int64)
        positions = _line_positions(hash_strings(paths), blocks, state)
        return hash_file_rows(paths, positions, blocks), positions

    def _output(
        self, batch: pa.RecordBatch, keys: pa.Array, attempts: np.ndarray, last: str, column: pa.Array
    ) -> pa.RecordBatch:
        """The batch's columns (less the hidden ones), then ``_record_key``, ``_attempt`` and ``last``."""
        names = [n for n in batch.schema.names if n not in _HIDDEN]
        columns = [batch.column(n) for n in names]
        columns += [keys, pa.array(attempts.astype(np.int32)), column]
        return pa.RecordBatch.from_arrays(columns, names=[*names, KEY_COLUMN, ATTEMPT_COLUMN, last])

    def _keys(self, batch: pa.RecordBatch, positions: np.ndarray | None) -> pa.Array:
        """The identity as text, for sinks and dead letters."""
        kind = self.spec.kind
        if kind == "key":
            assert self.spec.column is not None
            return pc.cast(batch.column(self.spec.column), pa.string())
        path = batch.column(PATH_COLUMN)
        if kind == "file_row":
            return pc.binary_join_element_wise(path, pc.cast(batch.column(ROW_COLUMN), pa.string()), "#")
        assert positions is not None
        block = pc.cast(batch.column(BLOCK_COLUMN), pa.string())
        return pc.binary_join_element_wise(
            pc.binary_join_element_wise(path, block, "@"), pc.cast(pa.array(positions), pa.string()), "#"
        )


def _line_positions(paths: np.ndarray, blocks: np.ndarray, state: _LineState) -> np.ndarray:
    """Each row's index within its (file, split) group; a group may continue from the task's previous batch."""
    rows = len(paths)
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    paths = paths.view(np.int64)
    new = np.ones(rows, dtype=bool)
    new[1:] = (paths[1:] != paths[:-1]) | (blocks[1:] != blocks[:-1])
    continues = paths[0] == state.path and blocks[0] == state.block
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, rows))
    positions = np.arange(rows, dtype=np.int64) - np.repeat(starts, lengths)
    if continues:
        positions[: lengths[0]] += state.next_index
    state.path, state.block, state.next_index = int(paths[-1]), int(blocks[-1]), int(positions[-1]) + 1
    return positions
