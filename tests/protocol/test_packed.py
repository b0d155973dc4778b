"""The numpy ApplyRequest encoder: byte for byte what protobuf's own serializer writes."""

from __future__ import annotations

import numpy as np
from acker_protocol.packed import encode_apply_request, varints
from acker_protocol.v1 import acker_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


def _varint_reference(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@given(st.lists(u64, max_size=50))
def test_varints_match_the_protobuf_varint_rule(values):
    """Every width of varint (1 to 10 bytes) is encoded as protobuf encodes it."""
    assert varints(np.array(values, dtype=np.uint64)) == b"".join(_varint_reference(v) for v in values)


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 3, 4]), u64, u64, u64, st.integers(0, 300)), max_size=40),
    st.lists(st.text(min_size=1, max_size=12), max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_encoding_equals_protobufs_serialization(ops, spouts, with_keys, with_index):
    """Any columns encode to exactly SerializeToString's bytes, optional fields present or not."""
    kinds = np.array([o[0] for o in ops], dtype=np.uint8)
    roots = np.array([o[1] for o in ops], dtype=np.uint64)
    values = np.array([o[2] for o in ops], dtype=np.uint64)
    keys = np.array([o[3] for o in ops], dtype=np.uint64) if with_keys else None
    index = np.array([o[4] for o in ops], dtype=np.uint32) if with_index else None
    expected = acker_pb2.ApplyRequest(
        kinds=kinds.tolist(),
        root_ids=roots.tolist(),
        values=values.tolist(),
        dedup_keys=keys.tolist() if keys is not None else [],
        spouts=spouts,
        spout_index=index.tolist() if index is not None else [],
    ).SerializeToString()
    assert encode_apply_request(kinds, roots, values, keys, spouts, index) == expected


def test_big_endian_input_is_written_little_endian():
    """Columns of any byte order go on the wire as little-endian fixed64."""
    roots = np.array([1, 2**40 + 5], dtype=">u8")
    request = acker_pb2.ApplyRequest.FromString(encode_apply_request(np.array([2, 2], dtype=np.uint8), roots, roots))
    assert list(request.root_ids) == [1, 2**40 + 5]
