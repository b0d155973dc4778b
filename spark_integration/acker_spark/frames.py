"""DataFrame support: tracking carried in a binary ``_acker_ids`` column, bolts run over DataFrame partitions.

A tracked DataFrame has its user columns plus ``_acker_ids``: the row's
MessageId packed as little-endian uint64 ``(root, id)`` pairs (16 bytes per
root; empty for an unanchored row). Bolts run over such a DataFrame on
``mapInArrow``: :class:`~acker_spark.arrow_bolt.ArrowBolt` column-wise (the
column decoded with numpy, :mod:`acker_spark.arrow_ids`), and
``Bolt.apply_df`` row by row (:mod:`acker_spark.arrow_rows`); neither needs
``df.rdd``, so both run on Spark Connect. After an aggregation,
``_acker_ids`` may be an ``array<binary>`` (``F.collect_list("_acker_ids")``):
the row then stands for all the rows it collected, and acking it acks them all.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from acker_client import MessageId, TrackedTuple

__all__ = [
    "TRACKING_COLUMN",
    "pack_ids",
    "unpack_ids",
    "tracked_schema",
    "require_tracking_column",
    "delivery_frame",
]

TRACKING_COLUMN = "_acker_ids"
"""The name of the column that carries a row's MessageId."""

_PAIR = struct.Struct("<QQ")


def pack_ids(message_id: MessageId) -> bytes:
    """``message_id`` as little-endian uint64 ``(root, id)`` pairs (``b""`` when unanchored)."""
    flat = [n for pair in message_id.items() for n in pair]
    return struct.pack(f"<{len(flat)}Q", *flat)


def unpack_ids(data: bytes | bytearray | Sequence[bytes | bytearray] | None) -> MessageId:
    """The MessageId packed in ``data``; a list of packed ids merges into one (XOR per root).

    Merging is what acking every collected row would send: acks are XORed and
    folded per root anyway, so a row that stands for many rows acks them all.
    """
    if data is None:
        return MessageId.EMPTY
    if isinstance(data, bytes | bytearray):
        return MessageId(_pairs(bytes(data)))
    merged: dict[int, int] = {}
    for packed in data:
        for root, ident in _pairs(bytes(packed)):
            merged[root] = merged.get(root, 0) ^ ident
    return MessageId(merged)


def _pairs(data: bytes) -> Iterator[tuple[int, int]]:
    if len(data) % _PAIR.size:
        raise ValueError(
            f"{TRACKING_COLUMN} value of {len(data)} bytes is not a list of 16-byte (root, id) pairs:"
            f" was the column modified or built by hand?"
        )
    return _PAIR.iter_unpack(data)


def tracked_schema(schema: Any) -> Any:
    """``schema`` (a StructType, a DDL string or None for no columns) plus the tracking column."""
    from pyspark.sql.types import BinaryType, DataType, StructField, StructType

    if schema is None:
        schema = StructType()
    elif isinstance(schema, str):
        schema = DataType.fromDDL(schema)
    if not isinstance(schema, StructType):
        raise TypeError(f"schema must be a StructType or a DDL string of columns, not {schema!r}")
    if TRACKING_COLUMN in schema.names:
        raise ValueError(f"the output schema must not declare {TRACKING_COLUMN!r}: the bolt adds it")
    return StructType([*schema.fields, StructField(TRACKING_COLUMN, BinaryType(), nullable=False)])


def require_tracking_column(columns: Sequence[str]) -> None:
    """Raise a ValueError a person can act on when a bolt's input DataFrame lacks ``_acker_ids``."""
    if TRACKING_COLUMN not in columns:
        raise ValueError(
            f"the DataFrame has no {TRACKING_COLUMN!r} column (columns: {list(columns)}):"
            f" use one from GuaranteedPipeline.run(..., as_dataframe=True) or a bolt's apply_df,"
            f" and keep the column through selects and joins"
        )


class _RowCodec:
    """Checks a row bolt's input columns and fits emitted values to the output columns (shipped to executors)."""

    def __init__(self, input_columns: Sequence[str], output_columns: Sequence[str]) -> None:
        require_tracking_column(input_columns)
        self.tracking_index = list(input_columns).index(TRACKING_COLUMN)
        self.value_columns = [c for c in input_columns if c != TRACKING_COLUMN]
        self.output_columns = list(output_columns)

    def columns(self, value: Any) -> tuple[Any, ...]:
        """An emitted value as the output schema's columns, in order (ValueError/TypeError if it does not fit)."""
        names = self.output_columns
        # A Row with names (it has __fields__) matches by name, like a dict, not by position.
        if isinstance(value, Mapping) or hasattr(value, "__fields__"):
            missing = [name for name in names if name not in value]
            if missing:
                raise ValueError(f"emitted {value!r} has no {missing} for the columns {names} of the schema")
            return tuple(value[name] for name in names)
        if isinstance(value, tuple | list):
            if len(value) != len(names):
                raise ValueError(
                    f"emitted {len(value)} values {value!r} for the {len(names)} columns {names} of the schema"
                )
            return tuple(value)
        if len(names) == 1:
            return (value,)
        raise TypeError(f"emit a tuple, Row or dict with the columns {names} (got {type(value).__name__} {value!r})")


def delivery_frame(spark: Any, batch: Sequence[TrackedTuple], partitions: int, value_type: Any = None) -> Any:
    """A DataFrame of spout tuples: ``key`` string, ``value`` (``value_type``, default string), ``attempt``, tracking.

    Works with a classic SparkSession and a Spark Connect one alike.
    """
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    schema = tracked_schema(
        StructType(
            [
                StructField("key", StringType(), nullable=False),
                StructField("value", value_type if value_type is not None else StringType()),
                StructField("attempt", IntegerType(), nullable=False),
            ]
        )
    )
    rows = [(t.value.key, t.value.value, t.value.attempt, pack_ids(t.message_id)) for t in batch]
    # A local relation (no RDD: Spark Connect has none), hash-partitioned by key: a
    # re-run partition must hold the same rows as the first run (dedup keys are per
    # partition), which hash partitioning guarantees and round robin would not.
    return spark.createDataFrame(rows, schema).repartition(max(1, min(partitions, len(rows))), "key")
