"""Hypothesis strategies for malformed and adversarial acker requests, as raw bytes per method.

Each case is (category, method, payload). The payload goes through a generic
gRPC method handle with no serializer, so anything can be sent: random bytes,
mutations of valid messages, wire-level tricks (wrong wire types, deep groups,
bad UTF-8, bogus lengths) and well-formed messages with every field out of range.
"""

from __future__ import annotations

from typing import NamedTuple

from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import MAX_SPOUT_NAME_BYTES
from hypothesis import strategies as st

from acker_service.batch import Batch, BatchError, validate_batch

from .conftest import MAX_BATCH, MAX_MESSAGE_BYTES

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
KIND = st.integers(min_value=1, max_value=4)
BAD_KIND = st.one_of(st.integers(min_value=-(1 << 31), max_value=0), st.integers(min_value=5, max_value=(1 << 31) - 1))
GOOD_NAME = st.text(min_size=1, max_size=32).filter(lambda s: 0 < len(s.encode()) <= MAX_SPOUT_NAME_BYTES)
BAD_NAME = st.one_of(
    st.just(""),
    st.integers(min_value=MAX_SPOUT_NAME_BYTES + 1, max_value=65536).map(lambda n: "n" * n),
)


class Case(NamedTuple):
    """One request: its category (for the figures), the Acker method and the raw bytes."""

    category: str
    method: str
    payload: bytes


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire_type: int, body: bytes = b"") -> bytes:
    return _varint(number << 3 | wire_type) + body


@st.composite
def _valid_apply(draw, shard_count: int) -> acker_pb2.ApplyRequest:
    """A well-formed batch for shard 0 (the base that mutations and single faults start from)."""
    n = draw(st.integers(min_value=1, max_value=8))
    roots = [draw(st.integers(min_value=1, max_value=(1 << 40))) * shard_count for _ in range(n)]
    kinds = [draw(KIND) for _ in range(n)]
    values = [draw(U64) if k <= 2 else 0 for k in kinds]
    return acker_pb2.ApplyRequest(kinds=kinds, root_ids=roots, values=values, spouts=[draw(GOOD_NAME)])


@st.composite
def _one_fault(draw, shard_count: int) -> Case:
    """A valid batch with exactly one field out of range."""
    request = draw(_valid_apply(shard_count))
    n = len(request.kinds)
    i = draw(st.integers(min_value=0, max_value=n - 1))
    faults = ["bad_kind", "zero_root", "short_values", "dedup_length", "bad_spout", "spout_index", "value_on_fail"]
    faults += ["no_spout", "two_spouts_no_index"] + (["foreign_root"] if shard_count > 1 else [])
    fault = draw(st.sampled_from(faults))
    if fault == "bad_kind":
        request.kinds[i] = draw(BAD_KIND)
    elif fault == "zero_root":
        request.root_ids[i] = 0
    elif fault == "short_values":
        del request.values[i]
    elif fault == "dedup_length":
        request.dedup_keys.extend(draw(st.lists(U64, min_size=1, max_size=n + 3).filter(lambda k: len(k) != n)))
    elif fault == "bad_spout":
        request.spouts[0] = draw(BAD_NAME)
    elif fault == "spout_index":
        request.kinds[i] = 1
        request.spout_index.extend([0] * n)
        request.spout_index[i] = draw(st.integers(min_value=1, max_value=(1 << 32) - 1))
    elif fault == "value_on_fail":
        request.kinds[i] = draw(st.sampled_from([3, 4]))
        request.values[i] = draw(st.integers(min_value=1, max_value=(1 << 64) - 1))
    elif fault == "no_spout":
        request.kinds[i] = 1
        del request.spouts[:]
    elif fault == "two_spouts_no_index":
        request.spouts.append(draw(GOOD_NAME))
    else:
        request.root_ids[i] = request.root_ids[i] + draw(st.integers(min_value=1, max_value=shard_count - 1))
    return Case(f"apply.{fault}", "Apply", request.SerializeToString())


@st.composite
def _mutated(draw, shard_count: int) -> Case:
    """A valid Apply or Subscribe message with bytes flipped, inserted, deleted or cut off."""
    method = draw(st.sampled_from(["Apply", "Subscribe"]))
    if method == "Apply":
        data = bytearray(draw(_valid_apply(shard_count)).SerializeToString())
    else:
        data = bytearray(
            acker_pb2.SubscribeRequest(spout=draw(GOOD_NAME), after_sequence=draw(U64)).SerializeToString()
        )
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= draw(st.integers(min_value=1, max_value=255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[at]
        else:
            del data[at:]
    return Case(f"{method.lower()}.mutated", method, bytes(data))


@st.composite
def _wire_tricks(draw) -> Case:
    """Wrong wire types, bogus lengths, deep groups, bad UTF-8 in string fields."""
    method = draw(st.sampled_from(["Apply", "Subscribe", "Describe"]))
    trick = draw(st.sampled_from(["wire_type", "bogus_length", "deep_groups", "bad_utf8"]))
    if trick == "wire_type":
        number = draw(st.integers(min_value=1, max_value=6))
        wire_type = draw(st.sampled_from([0, 1, 2, 5]))
        payload = _field(number, wire_type, draw(st.binary(max_size=16)))
    elif trick == "bogus_length":
        payload = _field(draw(st.integers(min_value=1, max_value=6)), 2, _varint(draw(st.integers(17, 1 << 40))))
        payload += draw(st.binary(max_size=16))
    elif trick == "deep_groups":
        depth = draw(st.integers(min_value=50, max_value=2000))
        payload = _field(draw(st.integers(min_value=1, max_value=15)), 3) * depth
    else:
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
        text = draw(st.binary(max_size=8)) + bad + draw(st.binary(max_size=8))
        number = 5 if method == "Apply" else 1  # ApplyRequest.spouts, SubscribeRequest.spout
        payload = _field(number, 2, _varint(len(text)) + text)
    return Case(f"{method.lower()}.{trick}", method, payload)


@st.composite
def _oversize(draw) -> Case:
    """A message over the server's receive limit, or a batch over its operation limit."""
    if draw(st.booleans()):
        size = MAX_MESSAGE_BYTES + draw(st.integers(min_value=1, max_value=MAX_MESSAGE_BYTES))
        pattern = draw(st.binary(min_size=1, max_size=8))
        filler = (pattern * (size // len(pattern) + 1))[:size]
        return Case("apply.oversize_message", "Apply", _field(2, 2, _varint(size) + filler))
    n = MAX_BATCH + draw(st.integers(min_value=1, max_value=3 * MAX_BATCH))
    request = acker_pb2.ApplyRequest(kinds=[2] * n, root_ids=list(range(2, 2 * n + 2, 2)), values=[1] * n)
    return Case("apply.huge_batch", "Apply", request.SerializeToString())


@st.composite
def _subscribe(draw) -> Case:
    """Subscribe with a bad name, or any name with positions out of range."""
    if draw(st.booleans()):
        name, category = draw(BAD_NAME), "subscribe.bad_name"
    else:
        name, category = draw(GOOD_NAME), "subscribe.bad_position"
    request = acker_pb2.SubscribeRequest(spout=name, incarnation=draw(U64), after_sequence=draw(U64))
    return Case(category, "Subscribe", request.SerializeToString())


def fuzz_cases(shard_count: int) -> st.SearchStrategy[Case]:
    """Every category of bad request, for shard 0 of ``shard_count``."""
    # Inspect is read-only, so random bytes sent to it can never change the ledger the test compares.
    raw = st.tuples(st.sampled_from(["Apply", "Subscribe", "Describe", "Inspect"]), st.binary(max_size=256))
    return st.one_of(
        raw.map(lambda mp: Case(f"{mp[0].lower()}.random_bytes", mp[0], mp[1])),
        _mutated(shard_count),
        _one_fault(shard_count),
        _wire_tricks(),
        _oversize(),
        _subscribe(),
    )


def would_change_ledger(case: Case, shard_count: int) -> bool:
    """True if the payload is a valid, non-empty Apply for shard 0 (a mutation can produce one by chance)."""
    if case.method != "Apply" or len(case.payload) > MAX_MESSAGE_BYTES:
        return False
    try:
        request = acker_pb2.ApplyRequest.FromString(case.payload)
    except Exception:  # undecodable: certainly refused
        return False
    batch = Batch.of(
        request.kinds, request.root_ids, request.values, request.dedup_keys, request.spouts, request.spout_index
    )
    try:
        validate_batch(batch, shard_index=0, shard_count=shard_count, max_batch=MAX_BATCH)
    except BatchError:
        return False
    return len(batch) > 0
