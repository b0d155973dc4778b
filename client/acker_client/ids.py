"""Root and edge ids: non-zero 64-bit values from the OS CSPRNG, safe across forks."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .tuples import TrackedTuple

__all__ = ["new_id", "EdgeIdSource", "RandomEdgeIds"]


def new_id() -> int:
    """Return a random non-zero 64-bit id (0 means "complete" to the acker, so it is redrawn)."""
    # secrets reads the OS CSPRNG on every call: a forked Spark worker never
    # repeats its parent's or its siblings' ids, unlike a seeded random.Random.
    while True:
        value = secrets.randbits(64)
        if value:
            return value


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
