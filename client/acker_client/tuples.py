"""MessageId (root -> xor of edge ids) and TrackedTuple, the per-tuple tracking shipped between stages.

Both are on the per-tuple path of every bolt, so they are built to be cheap:
a TrackedTuple of one tree keeps its root and id in two int slots (no dict,
no MessageId object until someone asks for ``message_id``), and both pickle
flat, ``(value, root, id, ...)``, through module-level restoring functions
that skip the constructors' checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from acker_protocol.wire import check_id

__all__ = ["MessageId", "TrackedTuple"]

_new = object.__new__


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
        check_id(root, edge, what="edge id")
        return cls._trusted({root: edge})

    @classmethod
    def _trusted(cls, ids: dict[int, int]) -> MessageId:
        # Internal fast path for ids the collector built itself from valid ones.
        self = _new(cls)
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
        # Flat (root, id, root, id, ...): the numbers after a memoised reference to the
        # restoring function, and no tuple per pair (its size: docs/benchmarks.md).
        return (_message_id, _flat(self._ids))

    def __repr__(self) -> str:
        inner = ", ".join(f"{r:#x}: {e:#x}" for r, e in self._ids.items())
        return f"MessageId({{{inner}}})"


MessageId.EMPTY = MessageId()


class TrackedTuple:
    """A value with its MessageId; ``out_ack_val`` and ``emit_ordinal`` are this process's bookkeeping.

    Only the value and the ids are pickled: a tuple shipped to another stage
    starts with no children there, which is exactly Storm's model.
    """

    # The ids, as the collector reads them on its hot paths: one root (by far the
    # commonest) in two int slots, _root and _ident, with _more None; several in
    # the dict _more, with _root 0; none: _root 0 and _more None. No container per
    # tuple for one root: each one would count towards the garbage collector's
    # next pass. _mid: the MessageId view, made on first use of message_id.
    __slots__ = ("value", "_root", "_ident", "_more", "_mid", "out_ack_val", "emit_ordinal", "settled")

    def __init__(self, value: Any, message_id: MessageId = MessageId.EMPTY) -> None:
        if not isinstance(message_id, MessageId):
            raise TypeError(f"message_id must be a MessageId, not {type(message_id).__name__}")
        self.value = value
        ids = message_id._ids
        if len(ids) == 1:
            ((self._root, self._ident),) = ids.items()
            self._more = None
        else:
            self._root = self._ident = 0
            self._more = ids or None
        self._mid: MessageId | None = message_id
        # xor of the edge ids of the children anchored to this tuple here.
        self.out_ack_val = 0
        # How many children this tuple got here (deterministic edge ids use it).
        self.emit_ordinal = 0
        # Set once this tuple was acked or failed through a collector in this process.
        self.settled = False

    @property
    def message_id(self) -> MessageId:
        """The tuple's ids: root -> xor of the edge ids it carries for that tree."""
        m = self._mid
        if m is None:
            if self._root:
                m = MessageId._trusted({self._root: self._ident})
            else:
                m = MessageId._trusted(self._more) if self._more else MessageId.EMPTY
            self._mid = m
        return m

    @property
    def anchored(self) -> bool:
        """True if the tuple belongs to at least one tree."""
        return bool(self._root or self._more)

    def __reduce__(self) -> tuple[Any, ...]:
        # Flat: the value, then the ids; the commonest case, one root, is two ints.
        if self._root:
            return (_tracked, (self.value, self._root, self._ident))
        if self._more:
            return (_tracked, (self.value, *_flat(self._more)))
        return (_tracked, (self.value,))

    def __repr__(self) -> str:
        return f"TrackedTuple({self.value!r}, {self.message_id!r}, out_ack_val={self.out_ack_val:#x})"


def single(value: Any, root: int, ident: int) -> TrackedTuple:
    """A TrackedTuple of one tree (``root``, ``ident``: checked by the caller), for the collector's hot path."""
    t = _new(TrackedTuple)
    t.value = value
    t._root = root
    t._ident = ident
    t._more = None
    t._mid = None
    t.out_ack_val = 0
    t.emit_ordinal = 0
    t.settled = False
    return t


def tracked(value: Any, ids: dict[int, int]) -> TrackedTuple:
    """A TrackedTuple over ``ids`` (root -> id), a dict the caller built from checked ids and hands over."""
    if len(ids) == 1:
        for root, ident in ids.items():
            return single(value, root, ident)
    t = single(value, 0, 0)
    if ids:
        t._more = ids
    else:
        t._mid = MessageId.EMPTY
    return t


def _flat(ids: dict[int, int]) -> tuple[int, ...]:
    """``(root, id, root, id, ...)`` of ``ids``."""
    return tuple(n for pair in ids.items() for n in pair)


def _ids_of(flat: tuple[int, ...]) -> dict[int, int]:
    """The ``{root: id}`` dict of flat pickled numbers (refusing a malformed list)."""
    if len(flat) % 2:
        raise ValueError(f"a pickled MessageId needs (root, id) pairs, got {len(flat)} numbers")
    ids = dict(zip(flat[::2], flat[1::2]))
    if len(ids) * 2 != len(flat):
        raise ValueError("a pickled MessageId lists a root twice")
    return ids


def _message_id(*flat: int) -> MessageId:
    """Unpickle a MessageId from its flat ``(root, id, ...)`` numbers."""
    if not flat:
        return MessageId.EMPTY
    return MessageId._trusted(_ids_of(flat))


def _tracked(value: Any, *flat: int) -> TrackedTuple:
    """Unpickle a TrackedTuple: fresh per-process bookkeeping, ids as pickled.

    The ids are not range-checked here: a pickle can run arbitrary code
    anyway, so its data is trusted as far as the pickle itself is, and they
    were checked where they were made.
    """
    if len(flat) == 2:
        return single(value, flat[0], flat[1])
    return tracked(value, _ids_of(flat))
