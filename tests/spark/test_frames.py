"""The tracking column's codec (acker_spark.steps.frames): one byte format, per row and per column, agreeing byte for byte."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from acker_client import MessageId
from acker_spark.steps.frames import PAIR, decode_ids, encode_ids, pack_ids, pairs_of, unpack_ids
from hypothesis import given, settings
from hypothesis import strategies as st

ids64 = st.integers(min_value=1, max_value=2**64 - 1)
message_ids = st.dictionaries(ids64, ids64, max_size=4).map(MessageId)
# Any bytes a column could hold: whole pairs, any root (0 too), repeated roots, zero ids.
raw_values = st.lists(st.binary(min_size=16, max_size=16), max_size=5).map(b"".join)
# Bytes unpack_ids accepts: whole pairs with non-zero roots (a MessageId refuses root 0).
valid_values = st.lists(st.tuples(ids64, st.integers(0, 2**64 - 1)), max_size=5).map(
    lambda pairs: b"".join(struct.pack("<QQ", r, i) for r, i in pairs)
)


def test_pack_is_little_endian_uint64_pairs() -> None:
    """A MessageId packs as (root, id) little-endian uint64 pairs and unpacks to an equal one."""
    ids = MessageId({1: 2, (1 << 64) - 1: 3})
    packed = pack_ids(ids)
    assert packed == struct.pack("<4Q", 1, 2, (1 << 64) - 1, 3)
    assert PAIR.itemsize == 16 and np.frombuffer(packed, PAIR).tolist() == [(1, 2), ((1 << 64) - 1, 3)]
    assert unpack_ids(packed) == ids
    assert pack_ids(MessageId.EMPTY) == b"" and unpack_ids(b"") == MessageId.EMPTY
    assert unpack_ids(None) == MessageId.EMPTY


def test_collected_ids_merge_by_xor_per_root() -> None:
    """A list of packed ids (collect_list after a groupBy) is one MessageId: ids XORed per root."""
    merged = unpack_ids([pack_ids(MessageId({5: 0b1100, 6: 1})), bytearray(pack_ids(MessageId({5: 0b1010})))])
    assert merged == MessageId({5: 0b0110, 6: 1})
    assert unpack_ids([]) == MessageId.EMPTY


def test_truncated_ids_are_refused() -> None:
    """A value that is not whole 16-byte pairs is refused with a message naming the column, per row and per column."""
    with pytest.raises(ValueError, match="_acker_ids value of 15 bytes"):
        unpack_ids(b"\0" * 15)
    with pytest.raises(ValueError, match="_acker_ids value of 17 bytes"):
        unpack_ids([pack_ids(MessageId.single(1, 2)), b"\1" * 17])
    with pytest.raises(ValueError, match="16-byte"):
        decode_ids(pa.array([b"\x01" * 17], pa.binary()))
    with pytest.raises(TypeError, match="collect_list"):
        decode_ids(pa.array([1, 2]))


# No deadline: timing on a shared 2-core machine says nothing about correctness.
@settings(deadline=None)
@given(st.lists(message_ids, max_size=20))
def test_encode_ids_matches_pack_ids(values: list[MessageId]) -> None:
    """MessageId -> bytes: encode_ids builds, from numpy buffers, exactly the bytes pack_ids gives per row."""
    assert encode_ids(pairs_of(values)).to_pylist() == [pack_ids(v) for v in values]


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), raw_values), max_size=20), st.integers(0, 3))
def test_any_column_round_trips_byte_for_byte(values: list[bytes | None], cut: int) -> None:
    """bytes -> pairs -> bytes: decode_ids then encode_ids gives back every value's bytes (null: empty)."""
    column = pa.array(values, pa.binary()).slice(min(cut, len(values)))
    expected = [v or b"" for v in values[min(cut, len(values)) :]]
    assert encode_ids(decode_ids(column)).to_pylist() == expected
    assert encode_ids(decode_ids(pa.array(values, pa.large_binary()))).to_pylist() == [v or b"" for v in values]


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), valid_values), max_size=20))
def test_bytes_decode_per_column_as_per_row(values: list[bytes | None]) -> None:
    """bytes -> MessageId: decode_ids of a column gives what unpack_ids gives per value; packing gives the bytes back."""
    decoded = decode_ids(pa.array(values, pa.binary())).message_ids()
    assert decoded == [unpack_ids(v) for v in values]
    # Without repeated roots (which a MessageId folds, keeping the last) the bytes come back unchanged.
    distinct = [
        v for v in values if v is not None and len({v[i : i + 8] for i in range(0, len(v), 16)}) == len(v) // 16
    ]
    assert [pack_ids(unpack_ids(v)) for v in distinct] == distinct
    assert encode_ids(pairs_of(unpack_ids(v) for v in distinct)).to_pylist() == distinct


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), message_ids), max_size=20), st.integers(0, 3))
def test_binary_column_decodes_like_unpack_ids(values: list[MessageId | None], cut: int) -> None:
    """decode_ids of a (sliced, null-holding) binary column gives what unpack_ids gives per value."""
    packed = [None if v is None else pack_ids(v) for v in values]
    column = pa.array(packed, pa.binary()).slice(min(cut, len(packed)))
    expected = [unpack_ids(p) for p in packed[min(cut, len(packed)) :]]
    assert decode_ids(column).message_ids() == expected
    assert decode_ids(pa.array(packed, pa.large_binary())).message_ids() == [unpack_ids(p) for p in packed]


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(message_ids, max_size=4)), max_size=12))
def test_collected_lists_merge_like_unpack_ids(groups: list[list[MessageId] | None]) -> None:
    """An array<binary> row's pairs are XOR-merged per root, as unpack_ids merges a list of packed ids."""
    packed = [None if g is None else [pack_ids(m) for m in g] for g in groups]
    decoded = decode_ids(pa.array(packed, pa.list_(pa.binary())))
    for got, group in zip(decoded.row_dicts(), packed):
        merged: dict[int, int] = {}
        for p in group or []:
            for root, ident in unpack_ids(p).items():
                merged[root] = merged.get(root, 0) ^ ident
        assert got == merged
        assert dict(unpack_ids(group).items()) == merged


def test_import_acker_spark_needs_no_pyarrow() -> None:
    """The per-row codec works without pyarrow loaded (RDD bolts use only it)."""
    code = (
        "import sys; from acker_client import MessageId; from acker_spark import pack_ids, unpack_ids;"
        "m = MessageId({3: 4}); assert unpack_ids(pack_ids(m)) == m; print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
