"""The tracking column ``_acker_ids``: its one byte format, its codec (per column and per row), DataFrame helpers.

A tracked DataFrame has its user columns plus ``_acker_ids``: the row's
MessageId as little-endian uint64 ``(root, id)`` pairs, 16 bytes per root
(:data:`PAIR`; empty for an unanchored row). After an aggregation,
``_acker_ids`` may be an ``array<binary>`` (``F.collect_list("_acker_ids")``):
the row then stands for all the rows it collected, so its pairs are XOR-merged
per root, which is what acking each collected row would send.

This module is the only one that reads or writes those bytes. The codec works on
whole columns: :func:`decode_ids` turns an Arrow column into a
:class:`PairColumn` (every row's pairs laid end to end in two uint64 arrays, row
``i`` owning ``starts[i]:starts[i + 1]``) by reading the Arrow offsets and data
buffers with numpy, no Python object per row, and :func:`encode_ids` builds the
column back. The per-row functions (:func:`pack_ids`, :func:`unpack_ids`, for the
driver's spouts and for tests) go through the same :data:`PAIR` layout, checks
and merge. Bolts run over such a DataFrame on ``mapInArrow``:
:class:`~acker_spark.steps.arrow_bolt.ArrowBolt` column-wise, and ``Bolt.apply_df`` row
by row (:mod:`acker_spark.steps.arrow_rows`); neither needs ``df.rdd``, so both run on
Spark Connect. pyarrow is imported by the column functions only: ``import
acker_spark`` does not need it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from acker_client import MessageId, TrackedTuple
from acker_client.columns import pair_digest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "PAIR",
    "TRACKING_COLUMN",
    "PairColumn",
    "child_pairs",
    "decode_ids",
    "delivery_frame",
    "encode_ids",
    "pack_ids",
    "pairs_of",
    "require_tracking_column",
    "tracked_schema",
    "unpack_ids",
]

TRACKING_COLUMN = "_acker_ids"
"""The name of the column that carries a row's MessageId."""

PAIR = np.dtype([("root", "<u8"), ("id", "<u8")])
"""One ``(root, id)`` pair of ``_acker_ids`` as stored: two little-endian uint64, 16 bytes. The byte format."""


# -- the byte format: PAIR arrays <-> bytes ----------------------------------------------


def _check_lengths(lengths: np.ndarray) -> None:
    """ValueError naming the first value whose length is not a whole number of pairs."""
    bad = np.flatnonzero(lengths % PAIR.itemsize)
    if len(bad):
        raise ValueError(
            f"{TRACKING_COLUMN} value of {lengths[bad[0]]} bytes (row {bad[0]}) is not a list of 16-byte"
            f" (root, id) pairs: was the column modified or built by hand?"
        )


def _read_pairs(data: Any, first: int = 0, last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pairs stored in bytes ``first:last`` of ``data`` (a buffer), as native ``(roots, ids)`` uint64 arrays."""
    size = len(memoryview(data)) - first if last is None else last - first
    if size == 0:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty
    pairs = np.frombuffer(data, dtype=PAIR, count=size // PAIR.itemsize, offset=first)
    # Copies: the pairs may start at any byte, and uint64 arithmetic wants aligned, native-order words.
    return pairs["root"].astype(np.uint64), pairs["id"].astype(np.uint64)


def _pair_bytes(roots: np.ndarray, ids: np.ndarray) -> bytes:
    """``(roots[k], ids[k])`` laid out as PAIRs, end to end."""
    pairs = np.empty(len(roots), dtype=PAIR)
    pairs["root"] = roots
    pairs["id"] = ids
    return pairs.tobytes()


def _merge(rows: int, pair_rows: np.ndarray, roots: np.ndarray, ids: np.ndarray) -> PairColumn:
    """Pairs of ``rows`` rows (``pair_rows[k]`` the row of pair k), XOR-merged per (row, root), rows in order."""
    if not len(roots):
        return PairColumn(np.zeros(rows + 1, dtype=np.int64), roots, ids)
    order = np.lexsort((roots, pair_rows))
    pair_rows, roots, ids = pair_rows[order], roots[order], ids[order]
    first = np.ones(len(roots), dtype=bool)
    first[1:] = (pair_rows[1:] != pair_rows[:-1]) | (roots[1:] != roots[:-1])
    heads = np.flatnonzero(first)
    # A merged id may be 0 (a row collected twice): the pair is kept, the row still belongs to that tree.
    merged = np.bitwise_xor.reduceat(ids, heads)
    return PairColumn(_starts(np.bincount(pair_rows[heads], minlength=rows)), roots[heads], merged)


# -- one row -----------------------------------------------------------------------------


def pack_ids(message_id: MessageId) -> bytes:
    """``message_id`` as its ``_acker_ids`` value: PAIRs, ``(root, id)`` little-endian uint64 (``b""`` when unanchored)."""
    return np.fromiter(message_id.items(), PAIR, len(message_id)).tobytes()


def unpack_ids(data: bytes | bytearray | Sequence[bytes | bytearray] | None) -> MessageId:
    """The MessageId packed in ``data``; a list of packed ids merges into one (XOR per root).

    Merging is what acking every collected row would send: acks are XORed and
    folded per root anyway, so a row that stands for many rows acks them all.
    """
    if data is None:
        return MessageId.EMPTY
    if isinstance(data, bytes | bytearray):
        _check_lengths(np.array([len(data)]))
        roots, ids = _read_pairs(data)
        return MessageId(zip(roots.tolist(), ids.tolist()))
    values = [bytes(packed) for packed in data]
    lengths = np.array([len(v) for v in values], dtype=np.int64)
    _check_lengths(lengths)
    roots, ids = _read_pairs(b"".join(values))
    (merged,) = _merge(1, np.zeros(len(roots), dtype=np.int64), roots, ids).message_ids()
    return merged


# -- whole columns -----------------------------------------------------------------------


@dataclass(frozen=True)
class PairColumn:
    """Many rows' MessageIds as flat arrays: row ``i`` owns ``roots[s:e]``/``ids[s:e]``, ``s, e = starts[i:i+2]``."""

    starts: np.ndarray  # int64, one more than there are rows, starts[0] == 0
    roots: np.ndarray  # uint64, one per pair
    ids: np.ndarray  # uint64, one per pair

    @property
    def rows(self) -> int:
        """How many rows (MessageIds) the column holds."""
        return len(self.starts) - 1

    @property
    def counts(self) -> np.ndarray:
        """Pairs (roots) per row; 0 for an unanchored row."""
        return np.diff(self.starts)

    def pair_rows(self) -> np.ndarray:
        """The row of each pair."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), self.counts)

    def digests(self) -> np.ndarray:
        """Per row, an order-independent 64-bit digest of its pairs (the XOR of their mixes); 0 for no pairs."""
        out = np.zeros(self.rows, dtype=np.uint64)
        if len(self.roots):
            nonempty = self.counts > 0
            # Pairs of a row are contiguous and empty rows own none, so the starts of
            # the non-empty rows delimit exactly their groups.
            out[nonempty] = np.bitwise_xor.reduceat(pair_digest(self.roots, self.ids), self.starts[:-1][nonempty])
        return out

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pair indexes of ``rows`` (in that order, repeats allowed), and the new starts."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.counts[rows]
        starts = _starts(counts)
        # Each selected row's pairs: its first pair index plus 0, 1, ... count-1.
        within = np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], counts)
        return np.repeat(self.starts[rows], counts) + within, starts

    def take(self, rows: np.ndarray) -> PairColumn:
        """The MessageIds of ``rows``, as a column of its own."""
        index, starts = self.gather(rows)
        return PairColumn(starts, self.roots[index], self.ids[index])

    def row_dicts(self) -> list[dict[int, int]]:
        """Each row's pairs as a dict ``root -> id`` (per-row Python objects: tests and the row-function Bolt)."""
        roots, ids = self.roots.tolist(), self.ids.tolist()
        starts = self.starts.tolist()
        return [dict(zip(roots[s:e], ids[s:e])) for s, e in zip(starts, starts[1:])]

    def message_ids(self) -> list[MessageId]:
        """One MessageId per row (ValueError for a merged id of 0, which a MessageId cannot hold)."""
        return [MessageId(d) if d else MessageId.EMPTY for d in self.row_dicts()]


def _starts(counts: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def pairs_of(message_ids: Iterable[MessageId]) -> PairColumn:
    """A PairColumn of ``message_ids`` (tests, and the row-function Bolt's output)."""
    counts, roots, ids = [], [], []
    for message_id in message_ids:
        counts.append(len(message_id))
        for root, ident in message_id.items():
            roots.append(root)
            ids.append(ident)
    return PairColumn(
        _starts(np.asarray(counts, dtype=np.int64)),
        np.asarray(roots, dtype=np.uint64),
        np.asarray(ids, dtype=np.uint64),
    )


def decode_ids(column: pa.Array | pa.ChunkedArray) -> PairColumn:
    """The MessageIds of a ``_acker_ids`` column: ``binary``, or ``array<binary>`` after a ``collect_list``.

    A null counts as unanchored (no pairs). Raises ValueError for a value that
    is not a whole number of 16-byte pairs, and TypeError for any other type.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        lengths, roots, ids = _binary_pairs(column)
        return PairColumn(_starts(lengths // PAIR.itemsize), roots, ids)
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_binary(kind.value_type) or pa.types.is_large_binary(kind.value_type)
    ):
        return _decode_lists(column)
    raise TypeError(
        f"{TRACKING_COLUMN} must be binary (a row's packed ids) or array<binary> (collect_list of them),"
        f" not {kind}: keep the column as the bolt produced it, and aggregate it with F.collect_list"
    )


def _binary_pairs(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per value its byte length, and all values' pairs as (roots, ids), read from the Arrow buffers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if array.null_count:
        # A null slot may own bytes in the data buffer (Arrow allows it): make it empty.
        array = pc.fill_null(array, pa.scalar(b"", array.type))
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(
        offsets_buffer,
        dtype=offset_type,
        count=len(array) + 1,
        offset=array.offset * np.dtype(offset_type).itemsize,
    ).astype(np.int64)
    lengths = np.diff(offsets)
    _check_lengths(lengths)
    roots, ids = _read_pairs(data_buffer, int(offsets[0]), int(offsets[-1]))
    return lengths, roots, ids


def _decode_lists(lists: pa.Array) -> PairColumn:
    """``array<binary>`` rows: every collected value's pairs, XOR-merged per (row, root)."""
    import pyarrow.compute as pc

    rows = len(lists)
    per_row = pc.fill_null(lists.value_lengths(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths, roots, ids = _binary_pairs(lists.flatten())  # flatten() honours slicing and null lists
    value_rows = np.repeat(np.arange(rows, dtype=np.int64), per_row)
    return _merge(rows, np.repeat(value_rows, lengths // PAIR.itemsize), roots, ids)


def encode_ids(pairs: PairColumn) -> pa.Array:
    """A ``binary`` ``_acker_ids`` column for ``pairs``, built from numpy buffers (16 bytes per pair)."""
    import pyarrow as pa

    byte_offsets = pairs.starts * PAIR.itemsize
    if byte_offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(
            f"a batch of {pairs.rows} rows carries {byte_offsets[-1]} bytes of ids, more than a binary column"
            f" holds: lower spark.sql.execution.arrow.maxRecordsPerBatch"
        )
    return pa.Array.from_buffers(
        pa.binary(),
        pairs.rows,
        [None, pa.py_buffer(byte_offsets.astype(np.int32)), pa.py_buffer(_pair_bytes(pairs.roots, pairs.ids))],
    )


def child_pairs(parents: PairColumn, anchors: np.ndarray, edges: np.ndarray) -> PairColumn:
    """Children's MessageIds: child ``k`` gets every root of ``parents`` row ``anchors[k]`` with id ``edges[k]``.

    ``anchors[k] < 0`` (unanchored) gives an empty MessageId; so does a parent
    with no pairs (an untracked row adds no edge).
    """
    anchored = anchors >= 0
    counts = np.zeros(len(anchors), dtype=np.int64)
    counts[anchored] = parents.counts[anchors[anchored]]
    index, _ = parents.gather(anchors[anchored])
    return PairColumn(_starts(counts), parents.roots[index], np.repeat(edges[anchored], counts[anchored]))


# -- DataFrames --------------------------------------------------------------------------


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
            f" use the frame SourcePipeline.run hands the job or a bolt's apply_df returns,"
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
