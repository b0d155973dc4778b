"""The numpy codecs of OutcomeBatch and of the ApplyRequest header: exactly what protobuf writes and reads."""

from __future__ import annotations

import numpy as np
import pytest
from acker_protocol.packed import (
    decode_apply_header,
    decode_outcome_batch,
    decode_varints,
    encode_outcome_batch,
    varints,
)
from acker_protocol.v1 import acker_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
outcome_rows = st.lists(st.tuples(u64, st.sampled_from([0, 1, 2, 3, 4, 200]), u64), max_size=40)


def _message(incarnation, first, rows, dropped) -> acker_pb2.OutcomeBatch:
    return acker_pb2.OutcomeBatch(
        incarnation=incarnation,
        first_sequence=first,
        root_ids=[r[0] for r in rows],
        outcomes=[r[1] for r in rows],
        latency_micros=[r[2] for r in rows],
        dropped=dropped,
    )


@settings(max_examples=200)
@given(u64, u64, outcome_rows, u64)
def test_encoding_equals_protobufs_serialization(incarnation, first, rows, dropped):
    """Any columns encode to exactly SerializeToString's bytes (zero scalars and empty columns omitted)."""
    expected = _message(incarnation, first, rows, dropped).SerializeToString()
    got = encode_outcome_batch(
        incarnation,
        first,
        np.array([r[0] for r in rows], dtype=np.uint64),
        np.array([r[1] for r in rows], dtype=np.uint8),
        np.array([r[2] for r in rows], dtype=np.uint64),
        dropped,
    )
    assert got == expected


@settings(max_examples=200)
@given(u64, u64, outcome_rows, u64)
def test_decoding_gives_protobufs_values(incarnation, first, rows, dropped):
    """What protobuf writes decodes to the same scalars and columns."""
    message = _message(incarnation, first, rows, dropped)
    got = decode_outcome_batch(message.SerializeToString())
    assert (got.incarnation, got.first_sequence, got.dropped) == (incarnation, first, dropped)
    assert got.root_ids.tolist() == list(message.root_ids)
    assert got.outcomes.tolist() == list(message.outcomes)
    assert got.latency_micros.tolist() == list(message.latency_micros)


def test_unpacked_repeated_fields_and_unknown_fields_decode():
    """Repeated scalars sent one tag per value (legal proto3) and unknown fields are read as protobuf reads them."""
    data = (
        b"\x19" + (5).to_bytes(8, "little")  # root_ids, unpacked fixed64
        + b"\x19" + (6).to_bytes(8, "little")
        + b"\x20\x01\x20\x03"  # outcomes, unpacked varints
        + b"\x28\xac\x02\x28\x00"  # latency_micros, unpacked
        + b"\x98\x06\x07"  # field 99, varint: unknown
    )  # fmt: skip
    expected = acker_pb2.OutcomeBatch.FromString(data)
    got = decode_outcome_batch(data)
    assert got.root_ids.tolist() == list(expected.root_ids) == [5, 6]
    assert got.outcomes.tolist() == list(expected.outcomes) == [1, 3]
    assert got.latency_micros.tolist() == list(expected.latency_micros) == [300, 0]


@pytest.mark.parametrize(
    "data", [b"\x1a\x09" + b"\x00" * 9, b"\x1a\x10\x00", b"\x2a\x01\x80", b"\x10", b"\x09\x01\x02", b"\x0b"]
)
def test_malformed_bytes_raise_value_error(data):
    """Truncated fields, a ragged fixed64 array, a dangling varint or a group are refused with ValueError."""
    with pytest.raises(ValueError):
        decode_outcome_batch(data)


@given(st.lists(u64, max_size=60))
def test_varints_round_trip(values):
    """decode_varints inverts varints for every width."""
    assert decode_varints(varints(np.array(values, dtype=np.uint64))).tolist() == values


@settings(max_examples=1000)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.lists(st.sampled_from(list(b"\x09\x10\x19\x1a\x20\x22\x28\x2a\x30\x01\x02\x08\x80")), max_size=40).map(
            bytes
        ),
    )
)
def test_random_bytes_either_refused_or_read_as_protobuf_reads_them(data):
    """Garbage never crashes the decoder with anything but ValueError, and what it accepts agrees with protobuf."""
    try:
        got = decode_outcome_batch(data)
    except ValueError:
        return
    try:
        expected = acker_pb2.OutcomeBatch.FromString(data)
    except Exception:
        return  # protobuf is stricter here (e.g. wire types it checks per field); the stream is from our acker
    assert got.root_ids.tolist() == list(expected.root_ids)
    assert got.latency_micros.tolist() == list(expected.latency_micros)
    assert (got.incarnation, got.first_sequence, got.dropped) == (
        expected.incarnation,
        expected.first_sequence,
        expected.dropped,
    )


def _varint(value: int) -> bytes:
    return varints(np.array([value], dtype=np.uint64))


@settings(max_examples=200)
@given(
    st.lists(st.integers(0, (1 << 64) - 1), max_size=20),
    st.lists(st.text(max_size=8), max_size=3),
    st.lists(st.integers(0, (1 << 64) - 1), max_size=20),
    st.lists(u64, max_size=5),
    st.booleans(),
)
def test_apply_header_reads_what_protobuf_reads(kinds, spouts, index, roots, packed):
    """kinds, spouts and spout_index read as protobuf reads them (wide varints cut to 32 bits), ids skipped."""
    if packed:
        data = b"\x0a" + _varint(len(b"".join(map(_varint, kinds)))) + b"".join(map(_varint, kinds))
    else:
        data = b"".join(b"\x08" + _varint(k) for k in kinds)
    data += b"".join(b"\x11" + r.to_bytes(8, "little") for r in roots)
    data += b"".join(b"\x2a" + _varint(len(s.encode())) + s.encode() for s in spouts)
    data += b"".join(b"\x30" + _varint(i) for i in index)
    expected = acker_pb2.ApplyRequest.FromString(data)
    got = decode_apply_header(data)
    assert got.kinds.tolist() == list(expected.kinds)
    assert got.spouts == list(expected.spouts)
    assert got.spout_index.tolist() == list(expected.spout_index)
