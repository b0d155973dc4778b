"""HandoffRequest bytes straight from numpy columns and back, for the entries a layout change moves.

A cut hands hundreds of thousands of entries to their new owners while the
acker goes on serving Apply on the same event loop; filling the generated
message from Python ints (and reading it back into lists) cost about 2 µs an
entry, writing and reading the packed fields with numpy a few nanoseconds.
The bytes are what protobuf's own ``SerializeToString`` gives for the same
message (a test checks it), and :func:`decode_handoff` reads any valid
encoding, packed or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .packed import _LE_U64, _VARINT, _field, _fixed64, _repeated_varint, _scan, _varint, varints

__all__ = ["HandoffColumns", "encode_handoff", "decode_handoff"]

# Field numbers of HandoffRequest (v1/acker.proto).
_EPOCH, _ROOTS, _VALUES, _SPOUTS, _SPOUT_INDEX, _AGES = 1, 2, 3, 4, 5, 6
_GENERATIONS, _FAILED, _RESETS, _KEY_COUNTS, _KEYS, _CHUNK_KEY, _SOURCE, _CHUNKS = 7, 8, 9, 10, 11, 12, 13, 14
_MANIFEST = 15
_FIXED64_WIRE, _LENGTH_DELIMITED_WIRE = 1, 2


class HandoffColumns(NamedTuple):
    """A HandoffRequest as columns (the meaning of each: acker_service/handoff.py)."""

    epoch: int
    roots: np.ndarray  # uint64
    values: np.ndarray  # uint64
    spouts: list[str]
    spout_index: np.ndarray  # int64, -1: no init yet
    ages_us: np.ndarray  # uint64
    generations: np.ndarray  # uint64
    failed: np.ndarray  # bool
    resets: np.ndarray  # uint64
    key_counts: np.ndarray  # uint64
    keys: np.ndarray  # uint64
    chunk_key: int
    source: int
    chunks: int
    manifest: np.ndarray  # uint64; empty: not carried


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def _unzigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.uint64)
    return (v >> np.uint64(1)).astype(np.int64) ^ -(v & np.uint64(1)).astype(np.int64)


def _scalar(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value) if value else b""


def encode_handoff(
    epoch: int,
    roots: np.ndarray,
    values: np.ndarray,
    spouts: Sequence[str],
    spout_index: np.ndarray,
    ages_us: np.ndarray,
    generations: np.ndarray,
    failed: np.ndarray,
    resets: np.ndarray,
    key_counts: np.ndarray,
    keys: np.ndarray,
    chunk_key: int = 0,
    source: int = 0,
    chunks: int = 0,
    manifest: np.ndarray | None = None,
) -> bytes:
    """The serialized ``HandoffRequest`` of these columns (not validated here: the receiver checks them)."""
    parts = [_scalar(_EPOCH, epoch), _field(_ROOTS, _fixed64(roots)), _field(_VALUES, _fixed64(values))]
    for name in spouts:
        data = name.encode("utf-8")
        parts.append(_varint(_SPOUTS << 3 | _LENGTH_DELIMITED_WIRE) + _varint(len(data)) + data)
    parts += [
        _field(_SPOUT_INDEX, varints(_zigzag(spout_index))),
        _field(_AGES, varints(ages_us)),
        _field(_GENERATIONS, varints(generations)),
        _field(_FAILED, varints(np.asarray(failed, np.uint64))),
        _field(_RESETS, varints(resets)),
        _field(_KEY_COUNTS, varints(key_counts)),
        _field(_KEYS, _fixed64(keys)),
    ]
    if chunk_key:
        parts.append(_varint(_CHUNK_KEY << 3 | _FIXED64_WIRE) + int(chunk_key).to_bytes(8, "little"))
    parts += [_scalar(_SOURCE, int(_zigzag(np.array([source]))[0])), _scalar(_CHUNKS, chunks)]
    parts.append(_field(_MANIFEST, _fixed64(manifest)))
    return b"".join(parts)


def decode_handoff(data: bytes) -> HandoffColumns:
    """Parse ``HandoffRequest`` bytes into columns (ValueError for bytes that are not one); unknown fields skipped."""
    epoch = chunk_key = source = chunks = 0
    spouts: list[str] = []
    fixed: dict[int, list[np.ndarray]] = {_ROOTS: [], _VALUES: [], _KEYS: [], _MANIFEST: []}
    varint_columns: dict[int, list[np.ndarray]] = {
        n: [] for n in (_SPOUT_INDEX, _AGES, _GENERATIONS, _FAILED, _RESETS, _KEY_COUNTS)
    }
    for number, wire, value in _scan(data):
        if _repeated_varint(varint_columns, number, wire, value):
            continue
        if isinstance(value, int):
            if number == _EPOCH:
                epoch = value
            elif number == _SOURCE:
                source = int(_unzigzag(np.array([value], np.uint64))[0])
            elif number == _CHUNKS:
                chunks = value
        elif number == _CHUNK_KEY and wire == _FIXED64_WIRE:
            chunk_key = int.from_bytes(value, "little")
        elif number in fixed and wire in (_FIXED64_WIRE, _LENGTH_DELIMITED_WIRE):
            if len(value) % 8:
                raise ValueError("packed fixed64 field of a length not a multiple of 8")
            fixed[number].append(np.frombuffer(value, _LE_U64).astype(np.uint64))
        elif number == _SPOUTS and wire == _LENGTH_DELIMITED_WIRE:
            spouts.append(bytes(value).decode("utf-8"))

    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    v = {n: joined(p) for n, p in varint_columns.items()}
    return HandoffColumns(
        epoch,
        joined(fixed[_ROOTS]),
        joined(fixed[_VALUES]),
        spouts,
        _unzigzag(v[_SPOUT_INDEX]),
        v[_AGES],
        v[_GENERATIONS],
        v[_FAILED] != 0,
        v[_RESETS],
        v[_KEY_COUNTS],
        joined(fixed[_KEYS]),
        chunk_key,
        source,
        chunks,
        joined(fixed[_MANIFEST]),
    )
