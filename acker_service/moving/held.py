"""Operations a new owner holds during a layout change, unapplied, until their trees' entries arrive.

A prepared acker takes the roots the next layout gives it at once, but an
operation on a root whose old owner has not handed its entries over yet must
not apply before them: applied now and merged by XOR later, a batch the old
owner applied (its answer lost) and the client re-sent here would cancel its
own first copy. So such operations wait here, per old owner, in arrival order,
as the serialized requests they came in; once that old owner's handoff is
merged the shard applies them through the ledger's normal rules (dedup keys,
set-once init, idempotent fail). Pure data: no gRPC, no clock.

The number held is bounded (``--max-held-operations``): past the bound the
shard refuses the request whole (UNAVAILABLE, retried by the client), so a
slow handoff costs memory only up to the bound.

A restarted replica's catch-up holds its operations the same way, keyed by
the range awaiting its partner's copy instead of an old owner (catchup.py).
"""

from __future__ import annotations

__all__ = ["HeldOperations"]


class HeldOperations:
    """Held requests per source, and how many operations they carry.

    The source is an old owner (its shard index in the layout left) during a
    layout change, a range awaiting its copy during a catch-up.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self._by_source: dict[int, list[bytes]] = {}
        self._counts: dict[int, int] = {}
        self.operations = 0

    @property
    def requests(self) -> int:
        """How many requests (or parts of one, one per source) are held."""
        return sum(map(len, self._by_source.values()))

    def room_for(self, n: int) -> bool:
        """Whether ``n`` more operations stay within the limit."""
        return not self.limit or self.operations + n <= self.limit

    def hold(self, source: int, request: bytes, n: int) -> None:
        """Keep ``request`` (``n`` operations on roots old owner ``source`` gives away) until it hands them over."""
        self._by_source.setdefault(source, []).append(request)
        self._counts[source] = self._counts.get(source, 0) + n
        self.operations += n

    def release(self, source: int) -> list[bytes]:
        """The requests held for ``source``, in arrival order, no longer held."""
        self.operations -= self._counts.pop(source, 0)
        return self._by_source.pop(source, [])

    def sources(self) -> set[int]:
        """The sources some request is held for."""
        return set(self._by_source)

    def clear(self) -> None:
        """Forget everything held (a change that starts over)."""
        self._by_source.clear()
        self._counts.clear()
        self.operations = 0
