"""An ``ApplyRequest`` taken apart by operation and put together again, for routing per operation during a move.

Outside a layout change the ledger engine decodes the request bytes itself
and refuses a batch whole. During one, the shard must apply some operations
of a request now and hold others for their old owner's handoff
(:mod:`acker_service.layout`), so it decodes the request here, validates it
whole first (a refused request changes nothing) and re-encodes each part with
every field of its operations kept: the dedup keys above all, which make a
held ACK re-sent after the move a recognised repeat.
"""

from __future__ import annotations

import numpy as np
from acker_protocol.packed import encode_apply_request
from acker_protocol.v1 import acker_pb2
from google.protobuf.message import DecodeError

from .batch import Batch, validate_batch
from .reference_ledger import undecodable

__all__ = ["decode_request", "encode_part"]


def decode_request(data: bytes, max_batch: int) -> Batch:
    """The request's operations as a validated :class:`Batch` (ownership not checked: the caller routes per root).

    Raises a :class:`~acker_service.batch.BatchError` for bytes that do not
    decode or a batch that is invalid, as the ledger would.
    """
    try:
        message = acker_pb2.ApplyRequest.FromString(data)
    except DecodeError as exc:
        raise undecodable(exc) from exc
    batch = Batch.of(
        message.kinds, message.root_ids, message.values, message.dedup_keys, message.spouts, message.spout_index
    )
    validate_batch(batch, shard_index=0, shard_count=1, max_batch=max_batch)
    return batch


def encode_part(batch: Batch, mask: np.ndarray) -> bytes:
    """The operations of ``batch`` that ``mask`` selects, as ApplyRequest bytes (spout names kept whole)."""
    return encode_apply_request(
        batch.kinds[mask],
        batch.roots[mask],
        batch.values[mask],
        batch.dedup_keys[mask] if len(batch.dedup_keys) else None,
        batch.spouts,
        batch.spout_index[mask] if len(batch.spout_index) else None,
    )
