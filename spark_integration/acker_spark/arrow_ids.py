"""The tracking column in Arrow form: ``_acker_ids`` decoded to numpy pair arrays and built back, column-wise.

``_acker_ids`` holds each row's MessageId as little-endian uint64 ``(root, id)``
pairs (see :mod:`acker_spark.frames`). Here a whole Arrow column becomes a
:class:`PairColumn`: every row's pairs laid end to end in two uint64 arrays,
with row ``i`` owning ``starts[i]:starts[i + 1]``. Decoding reads the Arrow
offsets and data buffers with numpy (no Python object per row), and accepts the
aggregated form ``array<binary>`` (``F.collect_list("_acker_ids")``): such a
row stands for every row it collected, so its pairs are XOR-merged per root,
which is what acking each collected row would send.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from acker_client import MessageId
from acker_client.columns import pair_digest

from .frames import TRACKING_COLUMN

__all__ = ["PairColumn", "child_pairs", "decode_ids", "encode_ids", "from_bytes", "pairs_of"]

_PAIR_BYTES = 16
_LE_U64 = np.dtype("<u8")


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
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        lengths, roots, ids = _binary_pairs(column)
        return PairColumn(_starts(lengths // _PAIR_BYTES), roots, ids)
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
    bad = np.flatnonzero(lengths % _PAIR_BYTES)
    if len(bad):
        raise ValueError(
            f"{TRACKING_COLUMN} value of {lengths[bad[0]]} bytes (row {bad[0]}) is not a list of 16-byte"
            f" (root, id) pairs: was the column modified or built by hand?"
        )
    first, last = int(offsets[0]), int(offsets[-1])
    if last == first:
        empty = np.zeros(0, dtype=np.uint64)
        return lengths, empty, empty
    raw = np.frombuffer(data_buffer, dtype=np.uint8, count=last - first, offset=first)
    # A copy: the slice may start at any byte, and uint64 arithmetic wants aligned, native-order words.
    words = raw.view(_LE_U64).astype(np.uint64).reshape(-1, 2)
    return lengths, np.ascontiguousarray(words[:, 0]), np.ascontiguousarray(words[:, 1])


def _decode_lists(lists: pa.Array) -> PairColumn:
    """``array<binary>`` rows: every collected value's pairs, XOR-merged per (row, root)."""
    rows = len(lists)
    per_row = pc.fill_null(lists.value_lengths(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths, roots, ids = _binary_pairs(lists.flatten())  # flatten() honours slicing and null lists
    value_rows = np.repeat(np.arange(rows, dtype=np.int64), per_row)
    pair_rows = np.repeat(value_rows, lengths // _PAIR_BYTES)
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


def encode_ids(pairs: PairColumn) -> pa.Array:
    """A ``binary`` ``_acker_ids`` column for ``pairs``, built from numpy buffers (16 bytes per pair)."""
    byte_offsets = pairs.starts * _PAIR_BYTES
    if byte_offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(
            f"a batch of {pairs.rows} rows carries {byte_offsets[-1]} bytes of ids, more than a binary column"
            f" holds: lower spark.sql.execution.arrow.maxRecordsPerBatch"
        )
    words = np.empty((len(pairs.roots), 2), dtype=_LE_U64)
    words[:, 0] = pairs.roots
    words[:, 1] = pairs.ids
    return pa.Array.from_buffers(
        pa.binary(),
        pairs.rows,
        [None, pa.py_buffer(byte_offsets.astype(np.int32)), pa.py_buffer(words.tobytes())],
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


def from_bytes(values: Sequence[bytes | None]) -> PairColumn:
    """Decode Python ``bytes`` values (tests; Spark hands the bolts Arrow columns)."""
    return decode_ids(pa.array(values, pa.binary()))
