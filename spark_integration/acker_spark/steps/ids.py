"""Deterministic ids for Spark tasks: edge ids and dedup keys that a re-run reproduces.

Spark runs a task more than once on its own (retries, recomputation of a lost
partition, speculative copies). Random edge ids would give a re-run children the
first run never announced, and a repeated XOR ack would cancel the first. So an
executor derives every id from things a re-run sees again: the bolt's uid (drawn
once on the driver), the anchor's MessageId and the child's ordinal among that
anchor's children; and it tags its folded acks with a dedup key derived from the
bolt's uid and the partition index, which the acker applies once per tree.

There is one id scheme, the splitmix64 mixing of :mod:`acker_client.columns`:
the row-function :class:`~acker_spark.steps.executor.Bolt` derives its ids one tuple at
a time with the scalar twins there (``derive_id``, ``message_digest``), the
column-wise :class:`~acker_spark.steps.arrow_bolt.ArrowBolt` a batch at a time with the
array functions (``derive_ids``, ``row_digests``); both give a child the same id
for the same (salt, anchor, ordinal).
"""

from __future__ import annotations

from typing import Any

from acker_client.columns import derive_id, edge_key, message_digest, mix64_int, parent_key

__all__ = ["stable_id", "DeterministicEdgeIds", "dedup_key"]

_MASK = (1 << 64) - 1
# Domain constants keep a dedup key and a stable_id from sharing a mixing chain with edge ids.
_DEDUP_DOMAIN = 0x61636B65722F6464  # "acker/dd"
_BYTES_DOMAIN = 0x61636B65722F6279  # "acker/by"


def _nonzero(value: int, key: int) -> int:
    while value == 0:
        # Zero means "no id" on the wire; rehashing keeps the result deterministic.
        value = mix64_int(value ^ key)
    return value


def stable_id(data: bytes) -> int:
    """A non-zero 64-bit id from ``data``, the same in every process: its 8-byte words chained through splitmix64.

    Deterministic and well mixed, not cryptographic (do not use it where someone
    could choose inputs to collide). The pipeline derives no id from bytes; this
    is for user code that wants a reproducible id or draw from a record.
    """
    view = memoryview(data).cast("B")
    h = mix64_int(len(view) ^ _BYTES_DOMAIN)
    for at in range(0, len(view), 8):
        h = mix64_int(h ^ int.from_bytes(view[at : at + 8], "little"))
    return _nonzero(h, _BYTES_DOMAIN)


class DeterministicEdgeIds:
    """EdgeIdSource giving child edge ids that a re-run of the same task reproduces.

    Child ``n`` of an anchor gets ``derive_id(key, parent_key(key, digest), n)``
    (:mod:`acker_client.columns`), with ``key = edge_key(salt)`` and ``digest``
    the XOR of the mixes of the anchor's ``(root, id)`` pairs: exactly the id an ArrowBolt with the same salt
    derives for that row's child ``n``. Nothing depends on the order in which a
    partition's records arrive after a shuffle.

    >>> from acker_client import MessageId, TrackedTuple
    >>> ids = DeterministicEdgeIds(salt=7)
    >>> anchor = TrackedTuple("sentence", MessageId.single(11, 13))
    >>> ids.edge_id(anchor, 0) == DeterministicEdgeIds(7).edge_id(anchor, 0) != ids.edge_id(anchor, 1)
    True
    """

    __slots__ = ("_salt", "_key", "_anchor", "_parent")

    def __init__(self, salt: int) -> None:
        self._key = edge_key(salt)  # ValueError unless 0 < salt < 2^64
        self._salt = salt
        # A bolt usually emits all children of one anchor in a row: keep that
        # anchor's parent key (its ids are immutable; holding the reference
        # keeps the identity check sound).
        self._anchor: Any = None
        self._parent = 0

    @property
    def salt(self) -> int:
        """The salt, normally the uid of the bolt that emits the children."""
        return self._salt

    def edge_id(self, anchor: Any, ordinal: int) -> int:
        """The id of the edge from ``anchor`` to its ``ordinal``-th child (0-based)."""
        if anchor is not self._anchor:
            self._parent = parent_key(self._key, message_digest(anchor.message_id.items()))
            self._anchor = anchor
        return derive_id(self._key, self._parent, ordinal)


def dedup_key(bolt_uid: int, partition: int) -> int:
    """The dedup key of one bolt's work on one partition: equal for every attempt of that task."""
    if not 0 <= bolt_uid <= _MASK or not 0 <= partition <= _MASK:
        raise ValueError(f"bolt uid and partition must be unsigned 64-bit integers, got {bolt_uid}, {partition}")
    key = mix64_int(bolt_uid ^ _DEDUP_DOMAIN)
    return _nonzero(mix64_int((key + partition) & _MASK), key)
