"""Deterministic ids for Spark tasks: edge ids and dedup keys that a re-run reproduces.

Spark runs a task more than once on its own (retries, recomputation of a lost
partition, speculative copies). Random edge ids would give a re-run children the
first run never announced, and a repeated XOR ack would cancel the first. So an
executor derives every id from things a re-run sees again: the bolt's uid (drawn
once on the driver), the anchor's MessageId and the child's ordinal among that
anchor's children; and it tags its folded acks with a dedup key derived from the
bolt's uid and the partition index, which the acker applies once per tree.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

__all__ = ["stable_id", "DeterministicEdgeIds", "dedup_key"]

_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<QQ")
_BLOCK = struct.Struct("<8Q")
_ZERO = b"zero"
# Distinct prefixes keep an edge id and a dedup key from ever being the same hash input.
_EDGE_DOMAIN = b"acker-spark/edge/v2"  # v2: 8 ids per hash
_DEDUP_DOMAIN = b"acker-spark/dedup/v1"


def stable_id(data: bytes) -> int:
    """A non-zero 64-bit id from ``data``: blake2b-64, rehashed in the 2^-64 case it is 0."""
    digest = hashlib.blake2b(data, digest_size=8).digest()
    value = _U64.unpack(digest)[0]
    while value == 0:
        # Zero means "no id" on the wire; rehashing keeps the result deterministic.
        digest = hashlib.blake2b(digest, digest_size=8).digest()
        value = _U64.unpack(digest)[0]
    return value


def _message_id_bytes(ids: Any) -> bytes:
    """Canonical bytes of a MessageId (or its ``{root: id}`` dict): its (root, id) pairs sorted by root."""
    if len(ids) == 1:
        for pair in ids.items():
            return _PAIR.pack(*pair)
    return b"".join(_PAIR.pack(root, value) for root, value in sorted(ids.items()))


class DeterministicEdgeIds:
    """EdgeIdSource giving child edge ids that a re-run of the same task reproduces.

    The ids of an anchor's children come in blocks of 8: block ``b`` is the
    64-byte blake2b of (domain, salt, the anchor's MessageId, ``b``), read as 8
    little-endian uint64s, and child ``n`` takes number ``n % 8`` of block
    ``n // 8`` (a zero, 2^-64-likely, is rehashed with its ordinal). One hash
    serves 8 children, and nothing depends on the order in which a partition's
    records arrive after a shuffle.

    >>> from acker_client import MessageId, TrackedTuple
    >>> ids = DeterministicEdgeIds(salt=7)
    >>> anchor = TrackedTuple("sentence", MessageId.single(11, 13))
    >>> ids.edge_id(anchor, 0) == DeterministicEdgeIds(7).edge_id(anchor, 0) != ids.edge_id(anchor, 1)
    True
    """

    __slots__ = ("_salt", "_anchor", "_prefix", "_block_index", "_block")

    def __init__(self, salt: int) -> None:
        if not 0 < salt < 1 << 64:
            raise ValueError(f"salt must be a non-zero unsigned 64-bit integer, got {salt}")
        self._salt = _U64.pack(salt)
        # A bolt usually emits all children of one anchor in a row: keep that
        # anchor's hash input and current block (its ids are immutable; holding
        # the reference keeps the identity check sound).
        self._anchor: Any = None
        self._prefix = b""
        self._block_index = -1
        self._block: tuple[int, ...] = ()

    @property
    def salt(self) -> int:
        """The salt, normally the uid of the bolt that emits the children."""
        return _U64.unpack(self._salt)[0]

    def edge_id(self, anchor: Any, ordinal: int) -> int:
        """The id of the edge from ``anchor`` to its ``ordinal``-th child (0-based)."""
        if anchor is not self._anchor:
            self._prefix = b"".join((_EDGE_DOMAIN, self._salt, _message_id_bytes(anchor.message_id)))
            self._anchor = anchor
            self._block_index = -1
        index = ordinal >> 3
        if index != self._block_index:
            self._block = _BLOCK.unpack(hashlib.blake2b(self._prefix + _U64.pack(index), digest_size=64).digest())
            self._block_index = index
        edge = self._block[ordinal & 7]
        if edge == 0:
            # Zero means "no id" on the wire: derive another, still deterministically.
            return stable_id(self._prefix + _U64.pack(ordinal) + _ZERO)
        return edge


def dedup_key(bolt_uid: int, partition: int) -> int:
    """The dedup key of one bolt's work on one partition: equal for every attempt of that task."""
    return stable_id(b"".join((_DEDUP_DOMAIN, _U64.pack(bolt_uid), _U64.pack(partition))))
