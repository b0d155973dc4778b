"""ApplyRequest bytes straight from numpy columns: the columnar client's encoder.

An ``ApplyRequest`` is packed parallel arrays (see ``v1/acker.proto``), so its
wire form is, per field, a tag, a length and the array's bytes: ``fixed64``
fields are the little-endian uint64 buffer as it is, the ``OpKind`` and
``spout_index`` fields are varints. Encoding them from numpy costs a few
nanoseconds per operation; filling the generated message from Python ints
costs about 120 (measured with 8,192 operations). The output is byte for byte
what protobuf's own ``SerializeToString`` gives for the same message (a test
checks it), so the acker cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["encode_apply_request", "varints"]

# Field numbers of ApplyRequest (v1/acker.proto).
_KINDS, _ROOT_IDS, _VALUES, _DEDUP_KEYS, _SPOUTS, _SPOUT_INDEX = 1, 2, 3, 4, 5, 6
_LENGTH_DELIMITED = 2
_LE_U64 = np.dtype("<u8")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def varints(values: np.ndarray) -> bytes:
    """The protobuf varint encoding of non-negative integers, concatenated (vectorised).

    >>> varints(np.array([1, 300], dtype=np.uint64)).hex()
    '01ac02'
    """
    values = np.asarray(values, dtype=np.uint64)
    if values.size == 0:
        return b""
    if int(values.max()) < 0x80:
        # The common case (operation kinds, small spout tables): one byte each.
        return values.astype(np.uint8).tobytes()
    # A varint holds 7 bits a byte, low bits first, the high bit set on all but the last byte.
    width = np.ones(values.shape, dtype=np.int64)
    for bits in range(7, 64, 7):
        width += values >= np.uint64(1 << bits)
    total = int(width.sum())
    starts = np.concatenate(([0], np.cumsum(width)[:-1]))
    out = np.empty(total, dtype=np.uint8)
    for byte in range(int(width.max())):
        has = width > byte
        chunk = (values[has] >> np.uint64(7 * byte)) & np.uint64(0x7F)
        more = (width[has] > byte + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + byte] = (chunk | more).astype(np.uint8)
    return out.tobytes()


def _field(number: int, payload: bytes) -> bytes:
    if not payload:
        return b""  # proto3: an empty repeated field is not written at all
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _fixed64(values: np.ndarray | None) -> bytes:
    if values is None or len(values) == 0:
        return b""
    return np.ascontiguousarray(values, dtype=_LE_U64).tobytes()


def encode_apply_request(
    kinds: np.ndarray,
    root_ids: np.ndarray,
    values: np.ndarray,
    dedup_keys: np.ndarray | None = None,
    spouts: Sequence[str] = (),
    spout_index: np.ndarray | None = None,
) -> bytes:
    """The serialized ``ApplyRequest`` of these parallel columns (``dedup_keys`` and ``spout_index`` optional).

    Nothing is validated here: the caller (the client's buffer) built the
    columns from checked ids, and the acker validates every request anyway.
    """
    parts = [
        _field(_KINDS, varints(kinds)),
        _field(_ROOT_IDS, _fixed64(root_ids)),
        _field(_VALUES, _fixed64(values)),
        _field(_DEDUP_KEYS, _fixed64(dedup_keys)),
    ]
    for name in spouts:
        data = name.encode("utf-8")
        parts.append(_varint(_SPOUTS << 3 | _LENGTH_DELIMITED) + _varint(len(data)) + data)
    if spout_index is not None:
        parts.append(_field(_SPOUT_INDEX, varints(spout_index)))
    return b"".join(parts)
