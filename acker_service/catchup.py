"""A restarted replica's catch-up (``--replicas 2``): which ranges still wait for a copy, and what is held meanwhile.

No gRPC and no clock here: the rules only. With two replicas an acker keeps two
*ranges*: the roots it owns (``r % n == i``, also kept by shard ``i + 1``) and
the roots it follows (``r % n == i - 1``, also kept by shard ``i - 1``). An
acker that starts with its partners' addresses (``--peers``) comes back empty,
so it catches up, as the seeded simulation checks (``docs/simulation.md``,
"Catch-up"):

1. It accepts every Apply request for its ranges and **holds it unapplied**
   (validated first, so a refusal is still answered at once; the client hears
   "applied" and counts the copy as delivered to this incarnation).
2. It asks the partner of each range for a snapshot: the partner copies the
   range's entries in one step (the cut) and keeps serving them.
3. Once every range has its snapshot installed, the held requests are applied
   in arrival order through the ledger's normal rules: what the partner had
   applied before its cut is recognised (the ACK's dedup key travels with the
   entry and both replicas' copies carry the same key; an INIT is set-once; a
   FAIL idempotent), the rest applies.

Not an XOR merge: the partner holds every update of the range, the restarted
acker a subset, so adding them would cancel what both hold. A partner that is
catching up for the range itself answers "lost": both copies of those trees
died, and each acker keeps what it holds (the trees end LOST at the spouts'
backstop and are replayed, as without replication).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acker_protocol.v1 import acker_pb2
from google.protobuf.message import DecodeError

from .batch import Batch, validate_batch
from .ledger import Limits
from .reference_ledger import undecodable

__all__ = ["CatchUp", "check_request", "OFF", "CATCHING_UP", "CAUGHT_UP"]

OFF, CATCHING_UP, CAUGHT_UP = "off", "catching-up", "caught-up"


@dataclass
class CatchUp:
    """The catch-up of one acker lifetime: ranges awaiting their snapshot (range -> partner shard) and held requests."""

    waiting: dict[int, int] = field(default_factory=dict)
    held: list[bytes] = field(default_factory=list)
    enabled: bool = False
    copied_entries: int = 0
    copied_trees: int = 0
    lost_ranges: int = 0

    @classmethod
    def for_shard(cls, shard_index: int, shard_count: int, replicas: int, enabled: bool) -> CatchUp:
        """The catch-up an acker starts with: both of its ranges awaited when ``enabled`` and replicated, else none."""
        if not enabled or replicas < 2:
            return cls()
        n = shard_count
        return cls(
            waiting={shard_index: (shard_index + 1) % n, (shard_index - 1) % n: (shard_index - 1) % n},
            enabled=True,
        )

    @property
    def holding(self) -> bool:
        """Whether Apply requests are held (some range still awaits its snapshot)."""
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

    def hold(self, request: bytes) -> None:
        """Keep a validated request to apply once every range is installed."""
        self.held.append(request)

    def installed(self, range_index: int, entries: int, trees: int, lost: bool) -> list[bytes] | None:
        """Record a range's snapshot; the held requests to apply now if it was the last, else None.

        A second snapshot of a range already installed is ignored (None): the
        first one counts, as in the simulation.
        """
        if range_index not in self.waiting:
            return None
        del self.waiting[range_index]
        self.copied_entries += entries
        self.copied_trees += trees
        self.lost_ranges += int(lost)
        if self.waiting:
            return None
        held, self.held = self.held, []
        return held


def check_request(request: bytes, limits: Limits) -> int:
    """Validate a request whole as Apply would, without applying it; its operation count.

    Raises the :class:`~acker_service.batch.BatchError` Apply would raise, so a
    held request is refused at once, not after the catch-up (when the client
    could no longer hear of it).
    """
    try:
        message = acker_pb2.ApplyRequest.FromString(request)
    except DecodeError as exc:
        raise undecodable(exc) from exc
    batch = Batch.of(
        message.kinds, message.root_ids, message.values, message.dedup_keys, message.spouts, message.spout_index
    )
    validate_batch(
        batch,
        shard_index=limits.shard_index,
        shard_count=limits.shard_count,
        max_batch=limits.max_batch,
        replicas=limits.replicas,
    )
    return len(batch)
