"""The native decoder and validator agree with the .proto and with the Python validator."""

from __future__ import annotations

import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import MAX_SPOUT_NAME_BYTES
from hypothesis import given, settings
from hypothesis import strategies as st

from acker_service import _native
from acker_service.batch import Batch, BatchError, undecodable, validate_batch

# One value per field type of ApplyRequest, so every field of the descriptor gets content.
SAMPLES = {
    "kinds": [1, 2, 3, 4, 9],
    "root_ids": [1, 2**64 - 1, 0x9E3779B97F4A7C15],
    "values": [0, 2**63, 5],
    "dedup_keys": [7, 0],
    "spouts": ["spout-a", "ünïcode", "x" * 300],
    "spout_index": [0, 2, 2**32 - 1],
}


# Fields the native core skips on purpose: read in Python only (layout_epoch: during a two-replica move).
PYTHON_ONLY = {"layout_epoch": 2**40 + 3}


def test_every_proto_field_decodes_to_the_same_values():
    """Each ApplyRequest field, encoded by the generated Python code, decodes natively to the same list."""
    names = [f.name for f in acker_pb2.ApplyRequest.DESCRIPTOR.fields]
    assert sorted(names) == sorted([*SAMPLES, *PYTHON_ONLY]), (
        "ApplyRequest changed: update the native wire structs and SAMPLES"
    )
    data = acker_pb2.ApplyRequest(**SAMPLES, **PYTHON_ONLY).SerializeToString()
    assert _native.decode_apply_request_fields(data) == SAMPLES, "a Python-only field disturbs the native decoding"


@pytest.mark.parametrize("name", list(SAMPLES))
def test_each_field_alone_lands_in_its_own_field(name):
    """A message with only one field set decodes with that field filled and every other one empty."""
    decoded = _native.decode_apply_request_fields(acker_pb2.ApplyRequest(**{name: SAMPLES[name]}).SerializeToString())
    assert {k: v for k, v in decoded.items() if v} == {name: SAMPLES[name]}


def test_unpacked_encoding_is_accepted():
    """Repeated scalars may arrive unpacked (one tag per value): proto3 decoders must accept both."""
    # Field 2 (root_ids) as two unpacked fixed64 values: tag (2 << 3) | 1 = 0x11.
    data = b"\x11" + (5).to_bytes(8, "little") + b"\x11" + (6).to_bytes(8, "little")
    assert _native.decode_apply_request_fields(data)["root_ids"] == [5, 6]


def _python_refusal(data: bytes, **limits) -> tuple[str, str] | None:
    try:
        request = acker_pb2.ApplyRequest.FromString(data)
    except Exception as exc:  # what ReferenceLedger.apply does with bytes that do not decode
        err: BatchError = undecodable(exc)
        return type(err).__name__, "undecodable"
    batch = Batch.of(
        request.kinds, request.root_ids, request.values, request.dedup_keys, request.spouts, request.spout_index
    )
    try:
        validate_batch(batch, **limits)
    except BatchError as exc:
        return type(exc).__name__, str(exc)
    return None


def _native_refusal(data: bytes, **limits) -> tuple[str, str] | None:
    try:
        _native.validate_request(
            data, limits["shard_index"], limits["shard_count"], limits["max_batch"], limits.get("replicas", 1)
        )
    except BatchError as exc:
        message = "undecodable" if "not a valid acker_service.v1.ApplyRequest" in str(exc) else str(exc)
        return type(exc).__name__, message
    return None


spout_names = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=8),
    st.just(""),
    st.just("s" * (MAX_SPOUT_NAME_BYTES + 1)),
    st.just("it's"),
)


@st.composite
def requests(draw) -> bytes:
    """Mostly-valid ApplyRequests with one or two things possibly wrong, or corrupted bytes."""
    n = draw(st.integers(0, 6))
    kinds = draw(st.lists(st.sampled_from([1, 1, 2, 2, 3, 4, 0, 5, -1]), min_size=n, max_size=n))
    roots = draw(st.lists(st.sampled_from([1, 2, 3, 7, 2**64 - 1, 0]), min_size=n, max_size=n))
    values = [draw(st.sampled_from([0, 0, 1, 99])) for _ in range(n)]
    ragged = draw(st.sampled_from([None, "root_ids", "values", "dedup_keys", "spout_index"]))
    spouts = draw(st.lists(spout_names, max_size=3))
    request = acker_pb2.ApplyRequest(kinds=kinds, root_ids=roots, values=values, spouts=spouts)
    if draw(st.booleans()):
        request.dedup_keys.extend([draw(st.integers(0, 3)) for _ in range(n)])
    if len(spouts) > 1 or draw(st.booleans()):
        request.spout_index.extend([draw(st.integers(0, 4)) for _ in range(n)])
    if ragged:
        getattr(request, ragged).append(1)
    data = request.SerializeToString()
    if data and draw(st.integers(0, 9)) == 0:  # sometimes corrupt the bytes
        cut = draw(st.integers(0, len(data) - 1))
        data = data[:cut] + bytes([draw(st.integers(0, 255))]) + data[cut + 1 :]
    return data


@settings(max_examples=200, deadline=None)
@given(
    data=requests(),
    shard_count=st.sampled_from([1, 1, 2, 3]),
    shard=st.integers(0, 2),
    max_batch=st.sampled_from([3, 1000]),
    replicas=st.sampled_from([1, 2]),
)
def test_native_validator_refuses_like_python(data, shard_count, shard, max_batch, replicas):
    """Same verdict, same exception class (status code) and same message as batch.validate_batch."""
    limits = {
        "shard_index": shard % shard_count,
        "shard_count": shard_count,
        "max_batch": max_batch,
        "replicas": min(replicas, shard_count),
    }
    assert _native_refusal(data, **limits) == _python_refusal(data, **limits)
