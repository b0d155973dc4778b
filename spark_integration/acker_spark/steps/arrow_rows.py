"""The row-function :class:`~acker_spark.steps.executor.Bolt` over a DataFrame, on ``mapInArrow``.

``Bolt.apply_df(df, schema)`` lands here: each partition's Arrow batches are
decoded to TrackedTuples (values as Spark ``Row`` objects, ids from the
``_acker_ids`` buffers), run through the bolt's own ``run_partition`` (held
acks, deterministic ids, the task's dedup key) and the emitted tuples encoded
back to Arrow batches. No ``df.rdd``, so it works on Spark Connect too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import pyarrow as pa
from acker_client import TrackedTuple

from ..session import spark_context_of
from .frames import TRACKING_COLUMN, _RowCodec, decode_ids, encode_ids, pairs_of, tracked_schema

__all__ = ["map_rows"]

_CHUNK = 4096
"""Emitted tuples per output batch."""


def map_rows(bolt: Any, df: Any, schema: Any) -> Any:
    """Run ``bolt`` (a row-function :class:`~acker_spark.steps.executor.Bolt`) over ``df`` with ``mapInArrow``.

    Returns the emitted tuples as a DataFrame. (``bolt`` is not annotated as a
    Bolt: the executor module imports this one, and no import cycle is allowed.)
    """
    from pyspark.sql.types import StructType

    out_schema = tracked_schema(schema)
    codec = _RowCodec(df.columns, out_schema.names[:-1])  # checks the tracking column
    in_values = StructType([f for f in df.schema.fields if f.name != TRACKING_COLUMN])
    out_values = StructType(out_schema.fields[:-1])
    sc = spark_context_of(df.sparkSession)
    if sc is not None:
        bolt.track_commits(sc)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Bolt.__call__: the partition index from TaskContext, held acks, the task's dedup key.
        tuples = bolt(_decode(batches, in_values))
        try:
            while chunk := list(islice(tuples, _CHUNK)):
                yield _encode(chunk, codec, out_values)
        finally:
            # Closing the bolt's generator early (the consumer stopped) discards its held acks.
            tuples.close()

    return df.mapInArrow(run, out_schema)


def _decode(batches: Iterable[pa.RecordBatch], values: Any) -> Iterator[TrackedTuple]:
    """Each input row as a TrackedTuple whose value is a Row of the user columns."""
    from pyspark.sql import Row
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    for batch in batches:
        index = batch.schema.get_field_index(TRACKING_COLUMN)
        ids = decode_ids(batch.column(index)).message_ids()
        if values.fields:
            rows = ArrowTableToRowsConversion.convert(pa.Table.from_batches([batch.remove_column(index)]), values)
        else:
            rows = [Row() for _ in ids]
        for row, message_id in zip(rows, ids):
            yield TrackedTuple(row, message_id)


def _encode(chunk: list[TrackedTuple], codec: _RowCodec, values: Any) -> pa.RecordBatch:
    """Emitted tuples as one output batch: their values' columns, then their packed MessageIds."""
    from pyspark.sql.conversion import LocalDataToArrowConversion

    ids = encode_ids(pairs_of(t.message_id for t in chunk))
    if not values.fields:
        return pa.RecordBatch.from_arrays([ids], names=[TRACKING_COLUMN])
    table = LocalDataToArrowConversion.convert([codec.columns(t.value) for t in chunk], values, False)
    columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    return pa.RecordBatch.from_arrays([*columns, ids], names=[*values.names, TRACKING_COLUMN])
