"""Root and edge ids: non-zero 64-bit values from the OS CSPRNG, drawn in blocks, safe across forks."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .tuples import TrackedTuple

__all__ = ["new_id", "EdgeIdSource", "RandomEdgeIds"]


# One read of the OS CSPRNG yields this many ids: a read costs about as much
# as 8 bytes do (a system call), so drawing 8 bytes per id spent most of
# new_id() in the kernel.
_BLOCK = struct.Struct("<1024Q")
_pool: list[int] = []


def _random_bytes(size: int) -> bytes:
    return os.urandom(size)


def new_id() -> int:
    """Return a random non-zero 64-bit id (0 means "complete" to the acker, so it is never returned)."""
    # list.pop() is atomic under the GIL: threads share the pool safely, and two
    # threads refilling it at once only draw a block more than needed.
    while True:
        try:
            return _pool.pop()
        except IndexError:
            _pool.extend(value for value in _BLOCK.unpack(_random_bytes(_BLOCK.size)) if value)


def _forget_pool_in_child() -> None:
    # A forked Spark worker must never hand out ids its parent or a sibling
    # holds too: the child starts with an empty pool and reads its own block.
    _pool.clear()


os.register_at_fork(after_in_child=_forget_pool_in_child)


@runtime_checkable
class EdgeIdSource(Protocol):
    """Where a bolt collector gets the edge id of each new anchor-to-child edge."""

    def edge_id(self, anchor: TrackedTuple, ordinal: int) -> int:
        """Return a non-zero edge id for ``anchor``'s child number ``ordinal`` (0-based)."""
        ...


class RandomEdgeIds:
    """The default edge id source: a fresh random id per edge, ignoring its arguments."""

    __slots__ = ()

    def edge_id(self, anchor: TrackedTuple, ordinal: int) -> int:
        """Return :func:`new_id`."""
        return new_id()
