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
# Distinct prefixes keep an edge id and a dedup key from ever being the same hash input.
_EDGE_DOMAIN = b"acker-spark/edge/v1"
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


def _message_id_bytes(message_id: Any) -> bytes:
    """Canonical bytes of a MessageId: its (root, id) pairs sorted by root."""
    return b"".join(_PAIR.pack(root, value) for root, value in sorted(message_id.items()))


class DeterministicEdgeIds:
    """EdgeIdSource giving child edge ids that a re-run of the same task reproduces.

    ``edge_id(anchor, ordinal)`` hashes the salt (a bolt's uid), the anchor's
    MessageId and the ordinal, so it does not depend on the order in which a
    partition's records arrive after a shuffle.

    >>> from acker_client import MessageId, TrackedTuple
    >>> ids = DeterministicEdgeIds(salt=7)
    >>> anchor = TrackedTuple("sentence", MessageId.single(11, 13))
    >>> ids.edge_id(anchor, 0) == DeterministicEdgeIds(7).edge_id(anchor, 0) != ids.edge_id(anchor, 1)
    True
    """

    __slots__ = ("_salt", "_last_anchor", "_last_prefix")

    def __init__(self, salt: int) -> None:
        if not 0 < salt < 1 << 64:
            raise ValueError(f"salt must be a non-zero unsigned 64-bit integer, got {salt}")
        self._salt = _U64.pack(salt)
        # A bolt usually emits all children of one anchor in a row: keep that
        # anchor's hash input (a MessageId is immutable; the reference keeps the
        # identity check sound).
        self._last_anchor: Any = None
        self._last_prefix = b""

    @property
    def salt(self) -> int:
        """The salt, normally the uid of the bolt that emits the children."""
        return _U64.unpack(self._salt)[0]

    def edge_id(self, anchor: Any, ordinal: int) -> int:
        """The id of the edge from ``anchor`` to its ``ordinal``-th child (0-based)."""
        if anchor is not self._last_anchor:
            self._last_prefix = b"".join((_EDGE_DOMAIN, self._salt, _message_id_bytes(anchor.message_id)))
            self._last_anchor = anchor
        return stable_id(self._last_prefix + _U64.pack(ordinal))


def dedup_key(bolt_uid: int, partition: int) -> int:
    """The dedup key of one bolt's work on one partition: equal for every attempt of that task."""
    return stable_id(b"".join((_DEDUP_DOMAIN, _U64.pack(bolt_uid), _U64.pack(partition))))
