"""An acker's place in the shard layout and the steps of changing it live, without gRPC or clock.

A layout is (epoch, shard count, this acker's index, the addresses of every
shard); the design's rule holds inside each one: root ``r`` belongs to shard
``r % count``. A change goes prepare -> cut -> commit on every acker of the old
and the new layout, driven by ``acker-ctl reshard`` / ``drain``. Only the roots
that change owner wait; every other root is served by its owner throughout:

* ``prepare``: the acker learns the layout it leaves and the next one. From
  then on it also takes the roots the next layout gives it; those whose old
  owner has not handed its entries over yet are **held** (accepted, not
  applied) until that handoff is merged. Roots it owns in both layouts are
  served as before, and roots it is about to give away are still served.
* ``cut``: in one event-loop step the acker lists the entries the next
  layout gives away and from then on refuses their roots (FAILED_PRECONDITION,
  naming the next layout); it then takes them out and hands them to their new
  owners in slices, youngest first (see :mod:`acker_service.moving.reshard`).
* merge: a new owner merges the chunks of an old owner's handoff and applies
  what it held for a root once that root cannot be waiting any more: its
  entry's chunk was merged, or the first chunk's manifest (every root the old
  owner hands over) does not name it, or every chunk was merged.
* ``commit``: the next layout becomes the current one.

:meth:`LayoutMachine.route` says, per operation, which of apply / hold / refuse
applies. Why no rule breaks through a move: docs/acker-semantics.md, "Moving
trees".

With two replicas (``replicas=2``) root ``r`` lives on shards ``r % count``
(its owner) and ``r % count + 1``, and the rules are the seeded simulation's
(docs/simulation.md, "Reshard with two replicas"): a root *moves* when the set
of ackers (addresses) keeping it changes; one whose set stays is served as
before. On a moving root **each old copy moves to exactly one new keeper**: a
keeper that stays keeps its own copy and serves the root throughout; a keeper
that leaves serves it until its own cut, then hands its copy to the one new
keeper it is paired with (:meth:`LayoutMachine.handoff_targets`: the leavers in
their old roles' order meet the newcomers in their new roles' order, so old
owner -> new owner and old follower -> new follower when both change) and
refuses it; a newcomer holds the root's operations until its paired leaver's
entry is merged or known not to be coming. Nothing is dropped, so each new
copy carries one old keeper's whole history, as replicas do without a move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from acker_protocol.wire import HELD_AT_BOUND

from ..batch import BatchError

__all__ = [
    "Layout",
    "LayoutMachine",
    "LayoutRefused",
    "ApplyHeld",
    "Arrivals",
    "CutPlan",
    "Route",
    "SERVING",
    "PREPARED",
    "CUT",
]

SERVING, PREPARED, CUT = "serving", "prepared", "cut"


class LayoutRefused(Exception):
    """A layout step out of order or with a bad layout (FAILED_PRECONDITION); nothing changed."""


class ApplyHeld(BatchError):
    """The acker cannot take the request now (UNAVAILABLE): retry the same batch; nothing was applied.

    Its message ends with :data:`~acker_protocol.wire.HELD_AT_BOUND`, so a client
    with two replicas retries it rather than skipping this copy.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} {HELD_AT_BOUND}")


@dataclass(frozen=True)
class Layout:
    """Shard ``index`` of ``count`` in layout ``epoch``; ``index`` -1: not in it (drained, or not yet in)."""

    epoch: int
    count: int
    index: int
    addresses: tuple[str, ...] = field(default_factory=tuple)

    def owns(self, root: int) -> bool:
        """Whether this acker owns ``root`` in this layout."""
        return self.index >= 0 and root % self.count == self.index

    def owned(self, roots: np.ndarray) -> np.ndarray:
        """Which of ``roots`` (uint64) this acker owns in this layout, as a boolean mask."""
        if self.index < 0:
            return np.zeros(len(roots), np.bool_)
        return roots % np.uint64(self.count) == np.uint64(self.index)

    def holders(self, roots: np.ndarray, replicas: int) -> list[np.ndarray]:
        """The shard indices keeping each of ``roots`` (uint64): the owner first, then (two replicas) the next shard."""
        owners = (roots % np.uint64(self.count)).astype(np.int64)
        return [(owners + k) % self.count for k in range(replicas)]

    def held(self, roots: np.ndarray, replicas: int) -> np.ndarray:
        """Which of ``roots`` (uint64) this acker keeps in this layout (as owner or follower), as a boolean mask."""
        if self.index < 0:
            return np.zeros(len(roots), np.bool_)
        return np.logical_or.reduce([h == self.index for h in self.holders(roots, replicas)])

    def where(self, root: int) -> str:
        """Where ``root`` lives in this layout, for a refusal a person can act on."""
        shard = root % self.count
        address = f" ({self.addresses[shard]})" if self.addresses else ""
        return f"shard {shard}{address} of the {self.count} of layout epoch {self.epoch}"

    def check(self) -> None:
        """Raise LayoutRefused unless the layout is coherent."""
        if self.count < 1:
            raise LayoutRefused(f"a layout needs at least one shard, got {self.count}")
        if not -1 <= self.index < self.count:
            raise LayoutRefused(f"shard index {self.index} is outside 0..{self.count - 1} (or -1: leaving)")
        if self.addresses and len(self.addresses) != self.count:
            raise LayoutRefused(
                f"a layout of {self.count} shards needs {self.count} addresses, got {len(self.addresses)}"
            )


class Arrivals:
    """What one old owner has handed this acker so far: its manifest (sorted) and which of its roots were merged."""

    def __init__(self) -> None:
        self.manifest: np.ndarray | None = None
        self.merged = np.zeros(0, np.bool_)
        self._early: list[np.ndarray] = []  # roots of chunks merged before the manifest came

    def chunk_merged(self, roots: np.ndarray, manifest: np.ndarray | None) -> None:
        """A chunk carrying ``roots`` (and, the first one, the ``manifest``) was merged."""
        if manifest is not None and len(manifest) and self.manifest is None:
            self.manifest = np.sort(np.asarray(manifest, np.uint64))
            self.merged = np.zeros(len(self.manifest), np.bool_)
            for early in self._early:
                self._mark(early)
            self._early = []
        if self.manifest is None:
            self._early.append(np.asarray(roots, np.uint64))
        else:
            self._mark(roots)

    def _mark(self, roots: np.ndarray) -> None:
        at, found = self._find(np.asarray(roots, np.uint64))
        self.merged[at[found]] = True

    def _find(self, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self.manifest is not None
        at = np.minimum(np.searchsorted(self.manifest, roots), max(len(self.manifest) - 1, 0))
        found = self.manifest[at] == roots if len(self.manifest) else np.zeros(len(roots), np.bool_)
        return at, found

    def waiting(self, roots: np.ndarray) -> np.ndarray:
        """Which of ``roots`` may still have an entry on its way here (all of them until the manifest came)."""
        if self.manifest is None:
            return np.ones(len(roots), np.bool_)
        at, found = self._find(roots)
        return found & ~self.merged[at]


@dataclass(frozen=True)
class CutPlan:
    """What a two-replica cut takes out: the moving roots this acker leaves, and the new keeper of each copy.

    ``leave`` are the roots whose entries leave the ledger, slice by slice, from the cut (this acker
    keeps them in the layout left, not in the next one); ``targets`` the new
    shard index each one's copy goes to (:meth:`LayoutMachine.handoff_targets`).
    The moving roots this acker keeps in both layouts stay, untouched.
    """

    leave: np.ndarray
    targets: np.ndarray
    ages: np.ndarray  # each leaving root's age (microseconds), for the youngest-first slices


@dataclass(frozen=True)
class Route:
    """What to do with each operation of a request during a move.

    ``source[i]`` is the old owner's shard index when operation ``i`` is held
    for its handoff, -1 when it applies now; ``refused`` is the index of the
    first operation this acker must refuse (-1: none).
    """

    source: np.ndarray
    refused: int


class LayoutMachine:
    """The current layout and a change in progress; the shard asks it how to route each Apply."""

    def __init__(self, initial: Layout, replicas: int = 1) -> None:
        initial.check()
        self.replicas = replicas
        self.current = initial
        self.previous: Layout | None = None  # the layout being left, while a change is under way
        self.next: Layout | None = None
        self.state = SERVING
        # Old shard indices whose handoff to this acker is not merged yet: their roots may be held.
        self.awaiting: set[int] = set()
        self.arrivals: dict[int, Arrivals] = {}
        self.moved_trees = 0  # handed over by the cuts
        self.moved_entries = 0

    @property
    def moving(self) -> bool:
        """Whether a change is under way here (between prepare and commit)."""
        return self.next is not None

    def prepare(self, layout: Layout, previous: Layout | None = None) -> None:
        """Learn the next layout (and the one left, default: the current); a retried call with the same layout is a no-op."""
        layout.check()
        if self.next == layout and self.state in (PREPARED, CUT):
            return
        if self.state != SERVING:
            raise LayoutRefused(
                f"a change to epoch {self.next.epoch if self.next else '?'} is in progress ({self.state}); "
                "finish it (acker-ctl reshard again with the same shards) before starting another"
            )
        if layout.epoch <= self.current.epoch:
            raise LayoutRefused(f"layout epoch {layout.epoch} is not above the current {self.current.epoch}")
        previous = previous or self.current
        previous.check()
        if previous.epoch >= layout.epoch:
            raise LayoutRefused(f"the layout left (epoch {previous.epoch}) must be older than epoch {layout.epoch}")
        if self.replicas > 1:
            self._check_replicated(layout, previous)
        self.previous, self.next, self.state = previous, layout, PREPARED
        # Every old owner but this acker itself hands over (an empty handoff too): await each one.
        # (Two replicas too: a keeper that stays keeps its own copy, it hands nothing to itself.)
        own = previous.index
        self.awaiting = {i for i in range(previous.count) if i != own} if layout.index >= 0 else set()
        self.arrivals = {i: Arrivals() for i in self.awaiting}

    def _check_replicated(self, layout: Layout, previous: Layout) -> None:
        """Two replicas: both layouts name every acker's address (holders are compared by address), two shards each."""
        for which, lay in (("next", layout), ("left", previous)):
            if len(lay.addresses) != lay.count:
                raise LayoutRefused(
                    f"with --replicas {self.replicas} the layout {which} (epoch {lay.epoch}) must list every "
                    "acker's address: a tree moves when the set of ackers holding it changes"
                )
            if lay.count < self.replicas:
                raise LayoutRefused(
                    f"with --replicas {self.replicas} the layout {which} needs at least {self.replicas} ackers, "
                    f"got {lay.count}"
                )

    def moves(self, roots: np.ndarray) -> np.ndarray:
        """During a change: which of ``roots`` change their set of holders (compared by address)."""
        assert self.previous is not None and self.next is not None
        previous, nxt = self.previous, self.next
        # Each old shard's index in the next layout (-1: it leaves), so both sets are in next-layout indices.
        place = {a: i for i, a in enumerate(nxt.addresses)}
        old_to_new = np.array([place.get(a, -1) for a in previous.addresses], np.int64)
        before = [old_to_new[h] for h in previous.holders(roots, self.replicas)]
        after = nxt.holders(roots, self.replicas)
        if self.replicas == 1:
            return before[0] != after[0]
        (a, b), (c, d) = before, after
        return ~(((a == c) & (b == d)) | ((a == d) & (b == c)))

    def _keepers(self, roots: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Two replicas: each root's old keepers (old indices), the same in next-layout indices (-1: it leaves the
        cluster), and its new keepers (next indices); owner first in each."""
        assert self.previous is not None and self.next is not None
        place = {a: i for i, a in enumerate(self.next.addresses)}
        old_to_new = np.array([place.get(a, -1) for a in self.previous.addresses], np.int64)
        old = self.previous.holders(roots, self.replicas)
        return old, [old_to_new[h] for h in old], self.next.holders(roots, self.replicas)

    def handoff_targets(self, roots: np.ndarray) -> np.ndarray:
        """Two replicas: for moving roots this acker leaves (uint64), the new shard index its copy of each goes to.

        Each old keeper that leaves a root hands its copy to one new keeper that
        did not keep it: the leavers in their old roles' order (owner first) meet
        the newcomers in their new roles' order. One leaver: to the one newcomer;
        two (no keeper stays): old owner -> new owner, old follower -> new follower.
        Every acker computes the same from the two layouts alone.
        """
        assert self.previous is not None
        roots = np.asarray(roots, np.uint64)
        (h0, _), (o0, o1), (n0, n1) = self._keepers(roots)
        owner_leaves = (o0 != n0) & (o0 != n1)
        first_newcomer = np.where((n0 != o0) & (n0 != o1), n0, n1)
        as_follower = np.where(owner_leaves, n1, first_newcomer)  # the second newcomer when both leave
        return np.where(h0 == self.previous.index, first_newcomer, as_follower)

    def handoff_sources(self, roots: np.ndarray) -> np.ndarray:
        """Two replicas: for moving roots new to this acker (uint64), the old shard index whose copy it takes over."""
        assert self.next is not None
        roots = np.asarray(roots, np.uint64)
        (h0, h1), (o0, o1), (n0, n1) = self._keepers(roots)
        first_leaver = np.where((o0 != n0) & (o0 != n1), h0, h1)
        as_follower = np.where((n0 != o0) & (n0 != o1), h1, first_leaver)  # the second leaver when both are new
        return np.where(n0 == self.next.index, first_leaver, as_follower)

    def cut_plan(self, roots: np.ndarray, ages_us: np.ndarray | None = None) -> CutPlan:
        """Two replicas: of the roots held here (uint64, aged ``ages_us``), those a cut takes out, and the new keeper of each."""
        assert self.previous is not None and self.next is not None
        roots = np.asarray(roots, np.uint64)
        leaves = self.moves(roots) & self.previous.held(roots, self.replicas) & ~self.next.held(roots, self.replicas)
        leave = roots[leaves]
        ages = np.zeros(len(leave), np.int64) if ages_us is None else np.asarray(ages_us)[leaves]
        return CutPlan(leave, self.handoff_targets(leave), ages)

    def start_cut(self, epoch: int) -> Layout:
        """The layout to cut to; refused unless ``epoch`` was prepared (a repeated cut is allowed: it re-sends)."""
        if self.next is None or self.next.epoch != epoch:
            raise LayoutRefused(f"epoch {epoch} was not prepared on this acker; call PrepareLayout first")
        return self.next

    def mark_cut(self) -> None:
        """The entries that leave were listed: refuse their roots from now on (same event-loop step as the listing)."""
        self.state = CUT

    def count_moved(self, trees: int, entries: int) -> None:
        """Record what a cut handed over."""
        self.moved_trees += trees
        self.moved_entries += entries

    def accepts_handoff(self, epoch: int) -> bool:
        """Whether moved entries of ``epoch`` may be merged now (prepared or cut for it)."""
        return self.next is not None and self.next.epoch == epoch and self.state in (PREPARED, CUT)

    def chunk_merged(self, source: int, roots: np.ndarray, manifest: np.ndarray | None = None) -> None:
        """A chunk of old owner ``source`` was merged: its roots (and, with the manifest, every root not named) apply now."""
        if source in self.arrivals:
            self.arrivals[source].chunk_merged(roots, manifest)

    def source_merged(self, source: int) -> None:
        """Old owner ``source``'s whole handoff was merged: its roots are no longer held."""
        self.awaiting.discard(source)
        self.arrivals.pop(source, None)

    def route(self, roots: np.ndarray) -> Route:
        """Per root (uint64) during a change: apply now, hold for an old owner's handoff, or refuse."""
        assert self.previous is not None and self.next is not None, "route() is for a change under way"
        if self.replicas > 1:
            return self._route_replicated(roots)
        previous, nxt = self.previous, self.next
        new_owned = nxt.owned(roots)
        old_owned = previous.owned(roots)
        old_shard = (roots % np.uint64(previous.count)).astype(np.int64)
        arriving = new_owned & ~old_owned
        source = np.full(len(roots), -1, np.int64)
        if self.awaiting and arriving.any():
            for s in self.awaiting:
                at = np.flatnonzero(arriving & (old_shard == s))
                if len(at):
                    source[at[self.arrivals[s].waiting(roots[at])]] = s
        # Until its cut an old owner still serves the roots it gives away.
        served = new_owned | old_owned if self.state == PREPARED else new_owned
        foreign = np.flatnonzero(~served)
        return Route(source, int(foreign[0]) if len(foreign) else -1)

    def _route_replicated(self, roots: np.ndarray) -> Route:
        """Two replicas: a keeper that stays applies; one that leaves, until its cut; a newcomer holds for its leaver.

        The layout a request was routed by plays no part: a keeper that stays
        keeps one copy throughout, whichever layout routed an operation to it.
        """
        assert self.previous is not None and self.next is not None
        new_held = self.next.held(roots, self.replicas)
        old_held = self.previous.held(roots, self.replicas)
        # Until its cut an old keeper still serves the roots it leaves.
        served = new_held | old_held if self.state == PREPARED else new_held
        source = np.full(len(roots), -1, np.int64)
        if self.awaiting:
            arriving = np.flatnonzero(new_held & ~old_held & self.moves(roots))
            if len(arriving):
                sources = self.handoff_sources(roots[arriving])
                for s in self.awaiting:
                    at = arriving[sources == s]
                    if len(at):
                        source[at[self.arrivals[s].waiting(roots[at])]] = s
        foreign = np.flatnonzero(~served)
        return Route(source, int(foreign[0]) if len(foreign) else -1)

    def refusal(self, root: int) -> str:
        """Why ``root`` is refused here during a change, and where to send it."""
        assert self.next is not None
        if self.replicas > 1:
            shards = [int(h[0]) for h in self.next.holders(np.array([root], np.uint64), self.replicas)]
            where = " and ".join(f"shard {i} ({self.next.addresses[i]})" for i in shards)
            return (
                f"root {root} is kept by {where} of the {self.next.count} of layout epoch {self.next.epoch}, not by "
                "this acker (any more); ask Describe for the next layout and send every copy there; nothing of "
                "this request was applied"
            )
        if self.previous is not None and self.previous.owns(root):
            return (
                f"root {root} moved to {self.next.where(root)} at this acker's cut; ask Describe for the next "
                "layout and send it there; nothing of this request was applied"
            )
        return f"root {root} belongs to {self.next.where(root)}, not to this acker; nothing of this request was applied"

    def commit(self, epoch: int, record: Callable[[Layout], None] | None = None) -> Layout:
        """Take the next layout and serve again (committing the current epoch again is a no-op).

        ``record`` is called with the layout once the commit is allowed and before it
        is taken (the acker keeps it durable there, :mod:`acker_service.moving.layout_file`).
        """
        if self.next is None and self.current.epoch == epoch:
            return self.current
        if self.next is None or self.next.epoch != epoch or self.state != CUT:
            raise LayoutRefused(f"epoch {epoch} cannot commit here ({self.state}); every acker must be cut first")
        if self.awaiting:
            raise LayoutRefused(
                f"epoch {epoch} cannot commit here: the handoffs of old shards {sorted(self.awaiting)} have not "
                "arrived; cut every acker of the old layout first (acker-ctl reshard again)"
            )
        if record is not None:
            record(self.next)
        self.current, self.previous, self.next, self.state = self.next, None, None, SERVING
        self.arrivals = {}
        return self.current
