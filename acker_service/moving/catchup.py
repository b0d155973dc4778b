"""A restarted replica's catch-up (``--replicas 2``): which ranges still wait for a copy, and what is held meanwhile.

No gRPC and no clock here: the rules only. With two replicas an acker keeps two
*ranges*: the roots it owns (``r % n == i``, also kept by shard ``i + 1``) and
the roots it follows (``r % n == i - 1``, also kept by shard ``i - 1``). An
acker that starts with its partners' addresses (``--peers``) comes back empty,
so it catches up, range by range, as the seeded simulation checks
(``docs/simulation.md``, "Catch-up"):

1. It accepts every Apply request for its ranges (validated whole first, so a
   refusal is still answered at once; the client hears "applied" and counts
   the copy as delivered to this incarnation). The operations on a range whose
   copy is installed apply at once; those on a range still awaiting its copy
   are **held unapplied**, per range, in arrival order (a request with roots in
   both ranges is split per range, so no root's operations overtake each other).
2. It asks the partner of each range for a snapshot: the partner copies the
   range's entries in one step (the cut) and keeps serving them.
3. As soon as a range's snapshot is installed, the operations held for that
   range are applied in arrival order through the ledger's normal rules: what
   the partner had applied before its cut is recognised (the ACK's dedup key
   travels with the entry and both replicas' copies carry the same key; an INIT
   is set-once; a FAIL idempotent), the rest applies. The other range need not
   be copied yet.

The operations held are bounded (``--max-held-operations``, the bound of a
layout change's holds too): past it a request that would be held is refused
whole (UNAVAILABLE, nothing applied, nothing held), and the client sends it
again, so a partner unreachable for a long time costs memory only up to the
bound.

Not an XOR merge: the partner holds every update of the range, the restarted
acker a subset, so adding them would cancel what both hold. A partner that is
catching up for the range itself answers "lost": both copies of those trees
died, and each acker keeps what it holds (the trees end LOST at the spouts'
backstop and are replayed, as without replication).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .held import HeldOperations

__all__ = ["CatchUp", "OFF", "CATCHING_UP", "CAUGHT_UP"]

OFF, CATCHING_UP, CAUGHT_UP = "off", "catching-up", "caught-up"


@dataclass
class CatchUp:
    """The catch-up of one acker lifetime: ranges awaiting their snapshot (range -> partner shard) and held operations."""

    waiting: dict[int, int] = field(default_factory=dict)
    held: HeldOperations = field(default_factory=lambda: HeldOperations(0))  # per range, until its copy
    enabled: bool = False
    shard_count: int = 1
    copied_entries: int = 0
    copied_trees: int = 0
    lost_ranges: int = 0
    refused: int = 0  # requests refused at the bound of held operations

    @classmethod
    def for_shard(cls, shard_index: int, shard_count: int, replicas: int, enabled: bool, max_held: int = 0) -> CatchUp:
        """The catch-up an acker starts with: both of its ranges awaited when ``enabled`` and replicated, else none.

        ``max_held`` bounds the operations held meanwhile (0: no bound).
        """
        if not enabled or replicas < 2:
            return cls(shard_count=shard_count)
        n = shard_count
        return cls(
            waiting={shard_index: (shard_index + 1) % n, (shard_index - 1) % n: (shard_index - 1) % n},
            held=HeldOperations(max_held),
            enabled=True,
            shard_count=n,
        )

    @property
    def holding(self) -> bool:
        """Whether Apply requests may be held (some range still awaits its snapshot)."""
        return bool(self.waiting)

    @property
    def state(self) -> str:
        """``off`` (nothing to catch up), ``catching-up`` or ``caught-up``."""
        if not self.enabled:
            return OFF
        return CATCHING_UP if self.waiting else CAUGHT_UP

    def lost(self, range_index: int) -> bool:
        """Whether this acker has no copy of ``range_index`` to give (it awaits one itself)."""
        return range_index in self.waiting

    def awaited(self, roots: np.ndarray) -> np.ndarray:
        """Per root, its range if that range still awaits its copy (the operation is held), else -1 (it applies)."""
        ranges = (roots % np.uint64(self.shard_count)).astype(np.int64)
        return np.where(np.isin(ranges, list(self.waiting)), ranges, -1)

    def refusal(self, n: int) -> str:
        """Count a request refused because its ``n`` operations to hold pass the bound; the message to answer."""
        self.refused += 1
        return (
            f"this acker restarted and holds {self.held.operations} operations until its partners' copies of "
            f"ranges {sorted(self.waiting)} arrive, its limit (--max-held-operations {self.held.limit}) leaves "
            f"no room for {n} more; nothing was applied, retry the same batch shortly (check that the partners "
            f"named by --peers are up)"
        )

    def installed(self, range_index: int, entries: int, trees: int, lost: bool) -> list[bytes] | None:
        """Record a range's snapshot; the requests held for that range, in arrival order, to apply now.

        A second snapshot of a range already installed is ignored (None): the
        first one counts, as in the simulation.
        """
        if range_index not in self.waiting:
            return None
        del self.waiting[range_index]
        self.copied_entries += entries
        self.copied_trees += trees
        self.lost_ranges += int(lost)
        return self.held.release(range_index)
