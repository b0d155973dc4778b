"""BoltCollector: Storm's anchoring (anchorsToIds / updateAckVal), ack, fail and reset_timeout for bolt code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acker_protocol.wire import MAX_ID

from .ids import EdgeIdSource, RandomEdgeIds
from .tuples import _NO_IDS, TrackedTuple, tracked

__all__ = ["BoltCollector"]


class BoltCollector:
    """Emits anchored tuples and acks or fails input tuples, for one task (not shared between threads).

    Emitting sends nothing to the acker: the new edge is reported with the
    anchor's ack (Storm's optimisation). With ``hold=True`` acks and fails are
    kept in memory until :meth:`commit` (the task attempt succeeded: send them,
    folded per root, tagged with the attempt's dedup key) or :meth:`discard`
    (the attempt failed: drop them, so a failed attempt changes no ledger).
    """

    def __init__(self, cluster, *, edge_ids: EdgeIdSource | None = None, hold: bool = False) -> None:
        self.cluster = cluster
        self.edge_ids: EdgeIdSource = edge_ids if edge_ids is not None else RandomEdgeIds()
        self.hold = hold
        self._held_acks: dict[int, int] = {}  # root -> xor of held ack values
        self._held_fails: dict[int, None] = {}

    def emit(self, value: Any, anchors: Sequence[TrackedTuple] = ()) -> TrackedTuple:
        """Return a child tuple anchored to ``anchors`` (none: unanchored, untracked)."""
        if isinstance(anchors, TrackedTuple):
            anchors = (anchors,)
        if len(anchors) != 1:
            return self._emit_many(value, anchors)
        # One anchor, the common case: the child carries the new edge for each of
        # the anchor's roots, with no per-root loop in Python.
        (anchor,) = anchors
        if anchor.settled:
            raise ValueError(f"cannot anchor to {anchor!r}: it was already acked or failed")
        ids = anchor._ids
        if not ids:
            return tracked(value, ids)  # an unanchored input adds no edge
        # self._edge(anchor), inlined: this runs once per emitted tuple.
        ordinal = anchor.emit_ordinal
        edge = self.edge_ids.edge_id(anchor, ordinal)
        if not 0 < edge <= MAX_ID:
            raise ValueError(f"edge id source returned {edge!r}; edge ids must be non-zero 64-bit integers")
        anchor.emit_ordinal = ordinal + 1
        anchor.out_ack_val ^= edge
        return tracked(value, dict.fromkeys(ids, edge))

    def _emit_many(self, value: Any, anchors: Sequence[TrackedTuple]) -> TrackedTuple:
        """emit() for zero or several anchors: the child's id per root is the XOR of the new edges."""
        child: dict[int, int] = {}
        for anchor in anchors:
            if anchor.settled:
                raise ValueError(f"cannot anchor to {anchor!r}: it was already acked or failed")
            if not anchor._ids:
                continue  # an unanchored input adds no edge
            edge = self._edge(anchor)
            for root in anchor._ids:
                child[root] = child.get(root, 0) ^ edge
        return tracked(value, child) if child else tracked(value, _NO_IDS)

    def _edge(self, anchor: TrackedTuple) -> int:
        """Draw the id of the edge from ``anchor`` to its next child and fold it into the anchor."""
        ordinal = anchor.emit_ordinal
        edge = self.edge_ids.edge_id(anchor, ordinal)
        if not 0 < edge <= MAX_ID:
            raise ValueError(f"edge id source returned {edge!r}; edge ids must be non-zero 64-bit integers")
        anchor.emit_ordinal = ordinal + 1
        anchor.out_ack_val ^= edge
        return edge

    def ack(self, t: TrackedTuple) -> None:
        """Ack ``t``: for each root, report its id xor the edges of the children it got here."""
        if t.settled:
            raise ValueError(f"{t!r} was already acked or failed")
        t.settled = True
        out = t.out_ack_val
        if self.hold:
            held = self._held_acks
            for root, ident in t._ids.items():
                held[root] = held.get(root, 0) ^ ident ^ out
        else:
            ack = self.cluster.ack
            for root, ident in t._ids.items():
                ack(root, ident ^ out)

    def fail(self, t: TrackedTuple) -> None:
        """Fail ``t``: every tree it belongs to fails (and its spout replays the record)."""
        self._settle(t)
        for root in t._ids:
            if self.hold:
                self._held_fails[root] = None
            else:
                self.cluster.fail(root)

    def reset_timeout(self, t: TrackedTuple) -> None:
        """Give every tree of ``t`` a fresh acker timeout (sent at once, even in hold mode: it changes no checksum)."""
        for root in t._ids:
            self.cluster.reset_timeout(root)

    def _settle(self, t: TrackedTuple) -> None:
        # Acking a tuple twice would XOR its id back in and hang (or falsely
        # complete) the tree: refuse it loudly.
        if t.settled:
            raise ValueError(f"{t!r} was already acked or failed")
        t.settled = True

    @property
    def held(self) -> int:
        """Operations held for the next commit (roots with a held ack, plus held fails)."""
        return len(self._held_acks) + len(self._held_fails)

    def commit(self, dedup_key: int = 0) -> None:
        """Send the held acks (one per root, carrying ``dedup_key``) and fails, then flush; raise if not delivered."""
        if not self.hold:
            raise RuntimeError("commit() is for collectors created with hold=True")
        acks, fails = self._held_acks, self._held_fails
        self._held_acks, self._held_fails = {}, {}
        for root in fails:
            self.cluster.fail(root)
        for root, value in acks.items():
            if value:  # a zero xor changes no checksum
                self.cluster.ack(root, value, dedup_key)
        self.cluster.flush()

    def discard(self) -> None:
        """Drop the held acks and fails (the attempt failed; its re-run will send its own)."""
        self._held_acks, self._held_fails = {}, {}
