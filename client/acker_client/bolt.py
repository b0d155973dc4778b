"""BoltCollector: Storm's anchoring (anchorsToIds / updateAckVal), ack, fail and reset_timeout for bolt code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from acker_protocol.wire import MAX_ID, shard_of

from .errors import ShardUnavailable
from .ids import EdgeIdSource, RandomEdgeIds
from .tuples import TrackedTuple, single, tracked

__all__ = ["BoltCollector", "COLUMNS_FROM"]

COLUMNS_FROM = 64
"""A commit holding acks for this many roots or more sends them as columns (``ClusterClient.ack_columns``)."""


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
        self._held_fails: dict[int, str | None] = {}  # root -> the reason given, if any
        # Roots of the last commit whose operations were dropped (their shard was
        # unreachable): the trees that will time out because of it, not of the work.
        self.undelivered: tuple[int, ...] = ()
        # The reasons given to fail() for the trees failed by the last commit (root -> reason).
        self.fail_reasons: dict[int, str] = {}

    def emit(self, value: Any, anchors: Sequence[TrackedTuple] | TrackedTuple = ()) -> TrackedTuple:
        """Return a child tuple anchored to ``anchors`` (one tuple or several; none: unanchored, untracked)."""
        if isinstance(anchors, TrackedTuple):
            anchors = (anchors,)
        if len(anchors) != 1:
            return self._emit_many(value, anchors)
        # One anchor of one tree, the common case, with the edge drawing inlined:
        # this runs once per emitted tuple.
        (anchor,) = anchors
        root = anchor._root
        if not root or anchor.settled:
            return self._emit_many(value, anchors)
        return single(value, root, self._next_edge(anchor))

    def _emit_many(self, value: Any, anchors: Sequence[TrackedTuple]) -> TrackedTuple:
        """emit() in general: the child's id per root is the XOR of the new edges from the anchors of that tree."""
        child: dict[int, int] = {}
        for anchor in anchors:
            if anchor.settled:
                raise ValueError(f"cannot anchor to {anchor!r}: it was already acked or failed")
            roots = anchor.message_id.roots
            if not roots:
                continue  # an unanchored input adds no edge
            edge = self._next_edge(anchor)
            for root in roots:
                child[root] = child.get(root, 0) ^ edge
        return tracked(value, child)

    def _next_edge(self, anchor: TrackedTuple) -> int:
        """Draw the edge to ``anchor``'s next child and register it in the anchor's ``out_ack_val``."""
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
        root = t._root
        if root:  # one tree: no MessageId, no loop
            if self.hold:
                held = self._held_acks
                held[root] = held.get(root, 0) ^ t._ident ^ t.out_ack_val
            else:
                self.cluster.ack(root, t._ident ^ t.out_ack_val)
            return
        out = t.out_ack_val
        for root, ident in t.message_id.items():
            if self.hold:
                self._held_acks[root] = self._held_acks.get(root, 0) ^ ident ^ out
            else:
                self.cluster.ack(root, ident ^ out)

    def fail(self, t: TrackedTuple, reason: str | None = None) -> None:
        """Fail ``t``: every tree it belongs to fails (and its spout replays the record).

        ``reason`` (e.g. ``"bad date: 2026-13-01"``) says why; with ``hold=True``
        the last commit's reasons are in :attr:`fail_reasons`, which a Spark
        ``Bolt`` reports to its driver for the record's dead letter.
        """
        self._mark_settled(t)
        for root in t.message_id.roots:
            if self.hold:
                self._held_fails[root] = reason
            else:
                self.cluster.fail(root)

    def reset_timeout(self, t: TrackedTuple) -> None:
        """Give every tree of ``t`` a fresh acker timeout (sent at once, even in hold mode: it changes no checksum)."""
        for root in t.message_id.roots:
            self.cluster.reset_timeout(root)

    def _mark_settled(self, t: TrackedTuple) -> None:
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
        self.undelivered = ()
        self.fail_reasons = {root: why for root, why in fails.items() if why}
        try:
            for root in fails:
                self.cluster.fail(root)
            ack_columns = getattr(self.cluster, "ack_columns", None)
            if ack_columns is not None and len(acks) >= COLUMNS_FROM:
                # One numpy column instead of a call, a fold and a protobuf field per root.
                roots = np.fromiter(acks.keys(), np.uint64, len(acks))
                ack_columns(roots, np.fromiter(acks.values(), np.uint64, len(acks)), dedup_key)
            else:
                for root, value in acks.items():
                    if value:  # a zero xor changes no checksum
                        self.cluster.ack(root, value, dedup_key)
            self.cluster.flush()
        except ShardUnavailable as err:
            # Name the trees this commit could not reach, so whoever reports the
            # failure can tell "acks undelivered" from "the work was too slow".
            self.undelivered = self._roots_on(set(err.shards), [*fails, *acks])
            raise

    def _roots_on(self, shards: set[int], roots: list[int]) -> tuple[int, ...]:
        count = getattr(self.cluster, "shard_count", None)
        if not isinstance(count, int) or not shards:
            return tuple(dict.fromkeys(roots))  # unknown layout: every root of the commit may be affected
        return tuple(dict.fromkeys(r for r in roots if shard_of(r, count) in shards))

    def withhold(self, shards: set[int], shard_count: int) -> tuple[int, ...]:
        """Drop the held acks and fails of trees on ``shards`` (known unreachable); return their roots.

        The next commit then sends the other shards' operations without waiting
        on those shards; the caller reports the returned trees as undelivered.
        """
        gone = tuple(
            r for r in dict.fromkeys([*self._held_acks, *self._held_fails]) if shard_of(r, shard_count) in shards
        )
        for root in gone:
            self._held_acks.pop(root, None)
            self._held_fails.pop(root, None)
        return gone

    def discard(self) -> None:
        """Drop the held acks and fails (the attempt failed; its re-run will send its own)."""
        self._held_acks, self._held_fails = {}, {}
