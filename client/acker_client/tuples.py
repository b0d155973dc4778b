"""MessageId (root -> xor of edge ids) and TrackedTuple, the per-tuple tracking shipped between stages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from acker_protocol.wire import check_id

__all__ = ["MessageId", "TrackedTuple"]


class MessageId:
    """An immutable map ``root id -> xor of edge ids`` (Storm's anchorsToIds); empty = unanchored.

    >>> m = MessageId.single(5, 9)
    >>> m[5], len(m), m.roots
    (9, 1, (5,))
    """

    __slots__ = ("_ids", "_hash")

    EMPTY: MessageId  # set below the class

    def __init__(self, ids: Mapping[int, int] | Iterable[tuple[int, int]] = ()) -> None:
        items = dict(ids.items() if isinstance(ids, Mapping) else ids)
        for root, edge in items.items():
            check_id(root, edge, what="edge id")
        self._ids: dict[int, int] = items
        self._hash: int | None = None

    @classmethod
    def single(cls, root: int, edge: int) -> MessageId:
        """The MessageId of a spout tuple: one root, one edge id."""
        return cls({root: edge})

    @classmethod
    def _trusted(cls, ids: dict[int, int]) -> MessageId:
        # Internal fast path for ids the collector built itself from valid ones.
        self = object.__new__(cls)
        self._ids = ids
        self._hash = None
        return self

    @property
    def roots(self) -> tuple[int, ...]:
        """The root ids this tuple belongs to."""
        return tuple(self._ids)

    def items(self) -> Iterable[tuple[int, int]]:
        """``(root, id)`` pairs."""
        return self._ids.items()

    def get(self, root: int, default: int | None = None) -> int | None:
        """The id for ``root``, or ``default``."""
        return self._ids.get(root, default)

    def __getitem__(self, root: int) -> int:
        return self._ids[root]

    def __contains__(self, root: object) -> bool:
        return root in self._ids

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._ids == other._ids

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._ids.items()))
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # A tuple of (root, id) pairs: about 20 bytes per root after the class reference.
        return (MessageId, (tuple(self._ids.items()),))

    def __repr__(self) -> str:
        inner = ", ".join(f"{r:#x}: {e:#x}" for r, e in self._ids.items())
        return f"MessageId({{{inner}}})"


MessageId.EMPTY = MessageId()


class TrackedTuple:
    """A value with its MessageId; ``out_ack_val`` and ``emit_ordinal`` are this process's bookkeeping.

    Only ``(value, message_id)`` is pickled: a tuple shipped to another stage
    starts with no children there, which is exactly Storm's model.
    """

    __slots__ = ("value", "message_id", "out_ack_val", "emit_ordinal", "settled")

    def __init__(self, value: Any, message_id: MessageId = MessageId.EMPTY) -> None:
        if not isinstance(message_id, MessageId):
            raise TypeError(f"message_id must be a MessageId, not {type(message_id).__name__}")
        self.value = value
        self.message_id = message_id
        # xor of the edge ids of the children anchored to this tuple here.
        self.out_ack_val = 0
        # How many children this tuple got here (deterministic edge ids use it).
        self.emit_ordinal = 0
        # Set once this tuple was acked or failed through a collector in this process.
        self.settled = False

    @property
    def anchored(self) -> bool:
        """True if the tuple belongs to at least one tree."""
        return bool(self.message_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (TrackedTuple, (self.value, self.message_id))

    def __repr__(self) -> str:
        return f"TrackedTuple({self.value!r}, {self.message_id!r}, out_ack_val={self.out_ack_val:#x})"
