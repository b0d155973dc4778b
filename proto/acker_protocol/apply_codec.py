"""An ``ApplyRequest`` taken apart into operation columns, and put together again per owner.

The one place where Python decodes an Apply request and splits it. The
steady-state Apply path never comes here: the acker's native core reads the
request bytes itself. Only what must route single operations does:

* the acker during a layout change or a restarted replica's catch-up, which
  applies some operations of a request now and holds the others, per old owner
  or per range, until their entries arrive (``acker_service.moving``);
* the client after a refusal during a layout change, which sends the refused
  request's operations again split by their owner in the new layout (with two
  replicas: to both holders of each root), each part stamped with the new
  layout's epoch (``acker_client.relayout``).

Each part keeps every field of its operations (the dedup keys above all, which
make a re-sent ACK a recognised repeat) and the request's spout names whole.
Parts are written from numpy columns with :func:`~acker_protocol.packed.encode_apply_request`,
byte for byte what protobuf would write, without a Python object per operation.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
from google.protobuf.message import DecodeError

from .packed import _varint, encode_apply_request
from .v1 import acker_pb2

__all__ = [
    "ApplyColumns",
    "OperationColumns",
    "UndecodableRequest",
    "not_an_apply_request",
    "decode_apply_request",
    "encode_part",
    "split_by",
    "split_by_owner",
    "split_by_holders",
    "with_layout_epoch",
    "layout_epoch_of",
]

_LAYOUT_EPOCH = 7  # ApplyRequest.layout_epoch


class OperationColumns(Protocol):
    """Anything holding a request's operations as parallel columns (:class:`ApplyColumns`, the acker's ``Batch``)."""

    @property
    def kinds(self) -> np.ndarray: ...
    @property
    def roots(self) -> np.ndarray: ...
    @property
    def values(self) -> np.ndarray: ...
    @property
    def dedup_keys(self) -> np.ndarray: ...
    @property
    def spouts(self) -> list[str]: ...
    @property
    def spout_index(self) -> np.ndarray: ...


class ApplyColumns(NamedTuple):
    """The fields of an ``ApplyRequest`` as numpy columns; an absent optional field is an empty column."""

    kinds: np.ndarray  # int64
    roots: np.ndarray  # uint64
    values: np.ndarray  # uint64
    dedup_keys: np.ndarray  # uint64, empty: no keys
    spouts: list[str]
    spout_index: np.ndarray  # int64, empty: every INIT names spouts[0]


def not_an_apply_request(detail: object) -> str:
    """The refusal's message for bytes that are not an ApplyRequest (the acker answers it with INVALID_ARGUMENT)."""
    return (
        f"the request is not a valid acker_service.v1.ApplyRequest ({detail}); "
        "send a message encoded from proto/acker_protocol/v1/acker.proto"
    )


class UndecodableRequest(ValueError):
    """The bytes are not an ``ApplyRequest``."""

    def __init__(self, detail: object) -> None:
        super().__init__(not_an_apply_request(detail))
        self.detail = detail  # what the decoder said


def decode_apply_request(data: bytes) -> ApplyColumns:
    """The request's operations as columns, not validated (UndecodableRequest: the bytes do not decode)."""
    try:
        message = acker_pb2.ApplyRequest.FromString(data)
    except DecodeError as exc:
        raise UndecodableRequest(exc) from exc
    return ApplyColumns(
        np.asarray(message.kinds, dtype=np.int64),
        np.asarray(message.root_ids, dtype=np.uint64),
        np.asarray(message.values, dtype=np.uint64),
        np.asarray(message.dedup_keys, dtype=np.uint64),
        list(message.spouts),
        np.asarray(message.spout_index, dtype=np.int64),
    )


def _pick(column: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
    # Empty: the field was absent in the request, and stays absent in each part (its default applies).
    return column[mask] if len(column) else None


def encode_part(columns: OperationColumns, mask: np.ndarray) -> bytes:
    """The operations ``mask`` selects (a boolean or index array), as ApplyRequest bytes with the spout names kept whole."""
    return encode_apply_request(
        columns.kinds[mask],
        columns.roots[mask],
        columns.values[mask],
        _pick(columns.dedup_keys, mask),
        columns.spouts,
        _pick(columns.spout_index, mask),
    )


def split_by(columns: OperationColumns, keys: np.ndarray) -> dict[int, bytes]:
    """One request per key >= 0 of ``keys`` (one key per operation), its operations in their order; keys < 0 are left out."""
    keys = np.asarray(keys)
    return {key: encode_part(columns, keys == key) for key in np.unique(keys[keys >= 0]).tolist()}


def split_by_owner(data: bytes, shard_count: int) -> dict[int, bytes]:
    """A serialized ApplyRequest's operations regrouped by owner (``root % shard_count``), every field of each kept.

    Raises :class:`UndecodableRequest` for bytes that are not an ApplyRequest.
    """
    columns = decode_apply_request(data)
    return split_by(columns, (columns.roots % np.uint64(shard_count)).astype(np.int64))


def split_by_holders(data: bytes, shard_count: int, replicas: int) -> dict[int, bytes]:
    """A serialized ApplyRequest's operations regrouped by every shard that keeps their root, every field kept.

    With ``replicas`` 2 an operation on root ``r`` is in the part of shard
    ``r % shard_count`` and in that of the next shard (both copies, as the
    client's own buffers send them), in the request's order; with 1 this is
    :func:`split_by_owner`. Raises :class:`UndecodableRequest` for bytes that
    are not an ApplyRequest.
    """
    columns = decode_apply_request(data)
    owners = (columns.roots % np.uint64(shard_count)).astype(np.int64)
    copies = [(owners + k) % shard_count for k in range(replicas)]
    return {
        shard: encode_part(columns, np.logical_or.reduce([held == shard for held in copies]))
        for shard in np.unique(np.concatenate(copies)).tolist()
    }


def with_layout_epoch(data: bytes, epoch: int) -> bytes:
    """ApplyRequest bytes with ``layout_epoch`` set to ``epoch`` (appended: protobuf keeps a scalar's last value).

    Epoch 0 is the field's default: the bytes come back unchanged.
    """
    if not epoch:
        return data
    return data + _varint(_LAYOUT_EPOCH << 3) + _varint(int(epoch))


def layout_epoch_of(data: bytes) -> int:
    """The layout epoch ApplyRequest bytes were routed by (0: not stated); UndecodableRequest if they do not decode."""
    try:
        return int(acker_pb2.ApplyRequest.FromString(data).layout_epoch)
    except DecodeError as exc:
        raise UndecodableRequest(exc) from exc
