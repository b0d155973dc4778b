"""HandoffRequest bytes from numpy equal protobuf's own, and decode back to the same columns."""

from __future__ import annotations

import numpy as np
import pytest
from acker_protocol.packed_handoff import decode_handoff, encode_handoff
from acker_protocol.v1 import acker_pb2

ROWS = [
    # root, value, spout index, age µs, generation, failed, resets, keys
    (7, 5, 0, 0, 0, False, 0, []),
    (2**64 - 1, 2**63, -1, 2**40, 2, True, 3, [1, 2**64 - 1]),
    (300, 0, 1, 127, 1, False, 0, [128]),
]


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], []])
@pytest.mark.parametrize(("key", "source", "chunks"), [(0, 0, 0), (2**64 - 1, 3, 2), (1, -1, 1)])
@pytest.mark.parametrize("manifest", [[], [7, 2**64 - 1, 300]])
def test_encoding_equals_protobufs_serialization_and_decodes_back(rows, key, source, chunks, manifest):
    """Byte for byte as SerializeToString; protobuf's bytes decode to the same columns."""
    spouts = ["s", "t"] if rows else []
    cols = dict(
        roots=np.array([r[0] for r in rows], np.uint64),
        values=np.array([r[1] for r in rows], np.uint64),
        spout_index=np.array([r[2] for r in rows], np.int32),
        ages_us=np.array([r[3] for r in rows], np.uint64),
        generations=np.array([r[4] for r in rows], np.uint8),
        failed=np.array([r[5] for r in rows], np.bool_),
        resets=np.array([r[6] for r in rows], np.uint32),
        key_counts=np.array([len(r[7]) for r in rows], np.uint32),
        keys=np.array([k for r in rows for k in r[7]], np.uint64),
    )
    message = acker_pb2.HandoffRequest(
        epoch=4,
        root_ids=cols["roots"].tolist(),
        values=cols["values"].tolist(),
        spouts=spouts,
        spout_index=cols["spout_index"].tolist(),
        ages_micros=cols["ages_us"].tolist(),
        generations=cols["generations"].tolist(),
        failed=cols["failed"].tolist(),
        resets=cols["resets"].tolist(),
        key_counts=cols["key_counts"].tolist(),
        dedup_keys=cols["keys"].tolist(),
        chunk_key=key,
        source=source,
        chunks=chunks,
        manifest=manifest,
    )
    data = encode_handoff(
        4, spouts=spouts, chunk_key=key, source=source, chunks=chunks, manifest=np.array(manifest, np.uint64), **cols
    )
    assert data == message.SerializeToString()
    back = decode_handoff(message.SerializeToString())
    assert (back.epoch, back.spouts, back.chunk_key, back.source, back.chunks) == (4, spouts, key, source, chunks)
    assert back.manifest.tolist() == manifest
    for name, column in cols.items():
        assert getattr(back, name).tolist() == column.tolist(), name


def test_bytes_that_are_not_a_handoff_are_refused():
    """Truncated bytes raise ValueError (the servicer answers INVALID_ARGUMENT)."""
    with pytest.raises(ValueError):
        decode_handoff(b"\x12\x10\x01")
