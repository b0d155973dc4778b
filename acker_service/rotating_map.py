"""RotatingMap: Storm's timeout structure, a list of hash maps rotated by the owner.

Entries are written to the newest bucket (the nursery). ``rotate()`` drops the
oldest bucket and hands its entries back, so with ``b`` buckets rotated every
``T / (b - 1)`` seconds an entry put at time ``t`` expires in
``[t + T, t + T + T / (b - 1)]``. The map never reads a clock and starts no
thread: when to rotate is the owner's decision (see ``Ledger.advance``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["RotatingMap"]


class RotatingMap(Generic[K, V]):
    """A map whose entries expire after a number of ``rotate()`` calls.

    >>> m = RotatingMap(buckets=3)
    >>> m.put(7, "x")
    >>> m.rotate(), m.rotate(), m.rotate()
    ({}, {}, {7: 'x'})
    """

    __slots__ = ("_buckets",)

    def __init__(self, buckets: int = 3) -> None:
        if buckets < 2:
            raise ValueError(f"a RotatingMap needs at least 2 buckets, got {buckets}")
        # Newest first: _buckets[0] is the nursery.
        self._buckets: list[dict[K, V]] = [{} for _ in range(buckets)]

    @property
    def bucket_count(self) -> int:
        """Number of buckets, the ``b`` of the timeout formula."""
        return len(self._buckets)

    def live_buckets(self) -> list[dict[K, V]]:
        """The buckets themselves, newest first, for an owner's inlined hot loop.

        Valid until the next ``rotate()``; callers must keep the invariant that
        a key lives in at most one bucket (write new keys to the nursery only).
        """
        return self._buckets

    def put(self, key: K, value: V) -> None:
        """Store ``key`` in the nursery, removing it from older buckets (fresh timeout)."""
        buckets = self._buckets
        buckets[0][key] = value
        for bucket in buckets[1:]:
            bucket.pop(key, None)

    def get(self, key: K, default: V | None = None) -> V | None:
        """Return the value for ``key`` from whichever bucket holds it."""
        for bucket in self._buckets:
            if key in bucket:
                return bucket[key]
        return default

    def __contains__(self, key: object) -> bool:
        return any(key in bucket for bucket in self._buckets)

    def remove(self, key: K) -> V | None:
        """Remove ``key`` wherever it is; return its value, or None if absent."""
        for bucket in self._buckets:
            if key in bucket:
                return bucket.pop(key)
        return None

    def rotate(self) -> dict[K, V]:
        """Drop the oldest bucket, open a fresh nursery, and return the expired entries."""
        expired = self._buckets.pop()
        self._buckets.insert(0, {})
        return expired

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets)

    def __iter__(self) -> Iterator[K]:
        for bucket in self._buckets:
            yield from bucket
