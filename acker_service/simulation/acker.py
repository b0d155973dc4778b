"""A simulated acker: the real reference ledger behind the ownership, reshard and catch-up protocols.

Layouts
    A layout is an epoch and the acker id of each shard index; root ``r``
    belongs to shard ``r % count`` (and, with two replicas, to the next shard
    too). An acker refuses a root it does not hold, naming its newest layout;
    the client adopts a newer layout from the refusal and re-routes.

Reshard from layout ``(e, n)`` to ``(e + 1, m)`` (one replica; a drain is a
reshard that leaves one acker out)
    1. *Prepare*: the controller sends the new layout to every acker of both
       layouts and waits for every reply. A prepared acker accepts the roots it
       owns under the new layout. For a root whose old owner ``o`` is another
       acker it **holds the operation unapplied** until ``o``'s handoff has been
       merged; an old owner still applies the roots it owns under the old
       layout until its cut.
    2. *Cut*: the controller then sends the cut to every old owner. At its
       cut, in one step, an old owner collects its due trees, lists every
       entry it does not own under the new layout and from then on refuses
       those roots (naming the new layout). It sends each new owner its
       entries (an empty handoff too, so every new owner learns that ``o`` is
       done), re-sent until acknowledged: the first chunk at once, each other
       one taken out of its ledger only when it is sent, a little later; an
       entry meanwhile stays there untouched and may time out there.
    3. *Merge*: a new owner merges the first handoff from each old owner (a
       re-sent or duplicated one is acknowledged and ignored): an entry it
       cannot already hold is re-created as it was (value, spout, failed flag,
       dedup keys), then the operations it held for that old owner are applied
       in arrival order through the ledger's normal rules.
    The handoff travels as the server sends it: one to four *chunks* per new
    owner, each under its own key and re-sent until acknowledged, the first
    carrying the *manifest* (every root of all the chunks). A new owner merges
    each key once and applies what it held for a root as soon as no entry can
    be on its way for it: the root's chunk was merged, the manifest does not
    name it, or every chunk was merged (the others stay held, in order).
    Holding, rather than applying and merging by XOR later, is what makes a
    client's retry across the cut harmless: a batch applied by the old owner
    whose reply was lost is re-sent to the new owner, and applying it there
    after the handoff is deduplicated (the ACK's key travels with the entry, an
    INIT is set-once, a FAIL idempotent), where an XOR merge of two applied
    copies would cancel it (``--broken reshard-xor`` shows the false acks).

Reshard with two replicas (``reshard-replicas``)
    Root ``r`` lives on two ackers in each layout; it is *moving* when its set
    of keepers changes (an unchanged set, even with the roles swapped, keeps
    serving as before). On a moving root **each old copy moves to exactly one
    new keeper** (:func:`pairing`): a keeper that stays keeps its own copy; each
    keeper that leaves hands its copy to one newcomer, the leavers in their old
    roles' order meeting the newcomers in their new roles' order (old owner ->
    new owner and old follower -> new follower when both change), which every
    acker computes from the two layouts alone.
    1. *Prepare*: an old keeper goes on applying the root's operations (a
       keeper that stays, throughout, whatever layout routed them); a newcomer
       holds them, unapplied, until its leaver's entry is merged or known not
       to be coming (chunks and manifest as above; merged as they come, before
       the newcomer's own cut too: it kept no copy of the root).
    2. *Cut*: in one step a keeper that leaves lists the entries of the
       moving roots it leaves and refuses those roots from then on; it sends
       each newcomer its part (an empty chunk too) in chunks as with one
       replica: the first at once, each other one taken out of its ledger only
       when it is sent, a little later (an entry meanwhile stays there
       untouched and may time out there). Nothing is dropped.
    3. A client refused for a moving root adopts the new layout and sends
       *every* copy of the operation again, to both new keepers, whatever the
       old keepers answered: it does not know which newcomer the refusing
       keeper's copy goes to, and that newcomer needs the operation; at a
       keeper that has it already the repeat is absorbed (dedup key, set-once
       init, idempotent fail).
    So each new copy is one old keeper's whole history plus every operation
    sent to it since, each applied once, as replicas are without a move: an
    update a client skipped at one keeper (unreachable, the other copy
    applied) is missing from that copy's line only, and the other line ACKs.
    No epoch is needed: a keeper that stays keeps one copy whichever layout
    routed an operation to it, and the others' routing depends on the root
    alone. (``--broken source-to-both`` is the rule before: the source, the
    old owner, hands its copy to both new keepers and the other old keeper
    drops its own, by the epoch each operation was routed by; a source the
    clients could not reach, skipping its copies, then loses trees.)

A kill during a reshard (one replica)
    An old owner keeps what its cut handed to each new owner for the whole
    epoch. A restarted acker learns the move under way from the controller and
    rejoins it empty: as an old owner it sends every new owner an empty handoff
    (its entries died with it: their trees are replayed, as at any kill); as a
    new owner it awaits every old owner again, asking each (re-asked until
    merged) to hand its entries again, and holds operations until then.

Catch-up after a restart (two replicas)
    The partner holds every update of their shared range, the restarted acker
    ``R`` a subset, so they must not merge by XOR. Instead:
    1. ``R`` comes back *catching up* for each of its two ranges (the roots it
       owns, shared with its successor; the roots it follows, shared with its
       predecessor). It accepts every operation for a catching range and
       **holds it unapplied**.
    2. ``R`` asks the partner of each range for a snapshot (re-asked until one
       arrives). The partner copies the range's entries in one step (the cut)
       and keeps serving; ``R`` installs the first snapshot it receives for the
       range and ignores later ones.
    3. ``R`` applies the held operations in arrival order through the normal
       rules: those the partner had applied before the cut are recognised
       (dedup key, set-once init, idempotent fail), the others apply. The range
       is then caught up; when both are, ``R`` is.
    A partner that is itself catching up for that range answers "nothing":
    both copies were lost, each keeps the operations it holds.
    This needs two things of the client: an ACK carries the same dedup key in
    both replicas' copies and in every retry, and an operation counts as
    delivered to a replica only while that replica's incarnation lives or the
    other copy is delivered too (an acker's crash puts its copies of
    operations whose other copy is still in flight back into the send queue),
    and a copy is skipped for a down replica only after the other copy was
    applied. Then every operation is either in the snapshot or reaches ``R``.

Batches and the held-operation bound
    Clients send each acker *batches* (the copies buffered for it within a few
    milliseconds). An acker routes a batch per operation as the server does:
    refused whole when one root is not served here, else each operation applies
    or is held. The operations held are bounded per protocol
    (``--max-held-operations``: the reshard's holds and the catch-up's each):
    a batch whose held part passes the bound is answered ``held-full``, nothing
    applied or held. The client retries such a batch and never skips it for the
    other replica: the acker is alive and will need the operation once its copy
    is installed. (Skipping it, as for an unreachable replica, loses the update
    when the partner applied its copy after the snapshot's cut: ``--broken
    bound-skip`` replays trees so.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..outcome_columns import Resolution
from ..reference_ledger import ReferenceLedger
from ..tree_info import TreeStatus
from .events import World
from .transfer import EntryCopy, Op, apply_op, collect_due, copy_entries, import_ops, xor_merge_ops

__all__ = ["Layout", "SimAcker", "RETRY_SECONDS", "HELD_FULL", "pairing"]

# The answer to a batch refused at the bound of held operations (the server's UNAVAILABLE with its message).
HELD_FULL = "held-full"

# A message unanswered for this long is sent again (handoffs, snapshot requests, client copies).
RETRY_SECONDS = 0.2
# How often an acker collects its due trees (the server's rotation timer).
TICK_SECONDS = 1.0

Reply = Callable[[str, "Layout", int], None]


@dataclass(frozen=True)
class Layout:
    """A layout epoch and the acker id of each shard index."""

    epoch: int
    ackers: tuple[int, ...]

    def shard(self, root: int) -> int:
        """The shard index that owns ``root``."""
        return root % len(self.ackers)

    def holders(self, root: int, replicas: int) -> tuple[int, ...]:
        """The acker ids holding ``root``: its owner, then (two replicas) the next shard's acker."""
        i = self.shard(root)
        if replicas == 1:
            return (self.ackers[i],)
        return (self.ackers[i], self.ackers[(i + 1) % len(self.ackers)])


def pairing(old_holders: tuple[int, ...], new_holders: tuple[int, ...]) -> dict[int, int]:
    """Two replicas, a moving root: each old keeper that leaves it -> the one new keeper it hands its copy to.

    The leavers in their old roles' order (owner first) meet the newcomers in
    their new roles' order: one leaver hands to the one newcomer, two (no
    keeper stays) hand old owner -> new owner and old follower -> new follower.
    A keeper that stays keeps its own copy. Every acker computes it from the
    two layouts alone.
    """
    leavers = [a for a in old_holders if a not in new_holders]
    newcomers = [a for a in new_holders if a not in old_holders]
    return dict(zip(leavers, newcomers))


@dataclass
class Counters:
    """What one ledger incarnation handed over, and the batches it refused at the bound of held operations."""

    exported_trees: int = 0
    refused_at_bound: int = 0


@dataclass
class Arrivals:
    """A new owner's view of one old owner's handoff: the chunk keys merged, the manifest, the roots merged."""

    keys: set[int] = field(default_factory=set)
    manifest: frozenset[int] | None = None
    merged: set[int] = field(default_factory=set)

    def waiting(self, root: int) -> bool:
        """Whether an entry for ``root`` may still be on its way (always, until the manifest came)."""
        if root in self.merged:
            return False
        return self.manifest is None or root in self.manifest


@dataclass(frozen=True)
class Chunk:
    """One handoff message: its key, its place among ``count`` chunks, its entries, the manifest (the first only)."""

    key: int
    count: int
    entries: list[EntryCopy]
    manifest: frozenset[int] | None


@dataclass
class SimAcker:
    """One acker process: a ledger per incarnation, its layout state, and the holds of the two protocols."""

    world: World
    ident: int
    layout: Layout
    replicas: int
    message_timeout: float
    emit: Callable[[SimAcker, list[Resolution]], None]
    problem: Callable[[str], None]
    broken: str | None = None
    max_held: int = 0  # bound on the operations held per protocol (0: none), --max-held-operations
    peers: dict[int, SimAcker] = field(default_factory=dict)
    up: bool = True
    partitioned: bool = False  # up, but the clients cannot reach it (their copies for it fail as for a down one)
    incarnation: int = 0
    old: Layout | None = None
    cut_done: bool = True
    awaiting: set[int] = field(default_factory=set)
    arrivals: dict[int, Arrivals] = field(default_factory=dict)  # per old owner awaited: its chunks so far
    held: dict[int, list[Op]] = field(default_factory=dict)
    catching: dict[int, int] = field(default_factory=dict)  # shard index of a range -> partner acker id
    catch_held: dict[int, list[Op]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    # What this acker's cut handed to each new owner, kept for the whole epoch: a new owner that
    # restarts during the move lost what it merged, and is sent it again.
    outbox: dict[int, list[Chunk]] = field(default_factory=dict)
    outbox_epoch: int = -1
    untaken: set[tuple[int, int]] = field(default_factory=set)  # (new owner, chunk index) still in the ledger
    # Two replicas: chunks that reached this new holder before its own cut (merged at the cut), by old owner.
    early_chunks: list[tuple[int, Chunk]] = field(default_factory=list)
    ledger: ReferenceLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = ReferenceLedger(self.message_timeout, clock=self.world.clock)

    # -- operations from clients --

    def receive(self, op: Op, reply: Reply) -> None:
        """One operation arrives alone (a batch of one), routed by this acker's own layout."""
        self.receive_batch([op], reply, [self.layout.epoch])

    def receive_batch(self, ops: list[Op], reply: Reply, epochs: list[int]) -> None:
        """A batch arrives (each operation with the epoch it was routed by): refused whole, refused at the held
        bound, or each operation applied or held."""
        if not self.up or self.partitioned:
            return  # the connection broke (with the process, or cut): the client's retry timer re-sends
        routes = [self._route(op.root, epoch) for op, epoch in zip(ops, epochs)]
        if self.world.tracing:
            for op, (verdict, _) in zip(ops, routes):
                self.world.log(
                    f"acker {self.ident} {verdict} {op.kind.name} {op.root:#x} value {op.value:#x} key {op.key:#x}"
                )
        if any(verdict == "refuse" for verdict, _ in routes):
            self.world.send(reply, "refused", self.layout, self.incarnation)
            return
        to_hold = sum(verdict == "hold-reshard" for verdict, _ in routes)
        to_catch = sum(verdict == "hold-catchup" for verdict, _ in routes)
        if self.max_held and (
            (to_hold and sum(map(len, self.held.values())) + to_hold > self.max_held)
            or (to_catch and sum(map(len, self.catch_held.values())) + to_catch > self.max_held)
        ):
            self.counters.refused_at_bound += 1
            self.world.count("batches refused at the held bound")
            self.world.log(f"acker {self.ident} refuses a batch of {len(ops)}: held operations at their bound")
            self.world.send(reply, HELD_FULL, self.layout, self.incarnation)
            return
        self.world.count("batches applied")
        if len(ops) > 1:
            self.world.count("batches of several operations")
        for op, (verdict, source) in zip(ops, routes):
            if verdict == "hold-reshard":
                self.held.setdefault(source, []).append(op)
            elif verdict == "hold-catchup":
                self.catch_held[source].append(op)
            else:
                self._apply(op)
        self.world.send(reply, "ok", self.layout, self.incarnation)

    @property
    def reachable(self) -> bool:
        """Whether the clients can reach it (up and not cut off from them)."""
        return self.up and not self.partitioned

    def _route(self, root: int, epoch: int) -> tuple[str, int]:
        """Whether this acker applies, holds (and for whom) or refuses an operation on ``root`` routed by ``epoch``."""
        if self.replicas == 2 and self.old is not None:
            return self._route_replicated_move(root, epoch)
        if self.replicas == 2:
            shard = self.layout.shard(root)
            if self.ident not in self.layout.holders(root, 2):
                return "refuse", -1
            if shard in self.catching and self.broken != "catchup-xor":
                return "hold-catchup", shard
            return "apply", -1
        if self.layout.holders(root, 1)[0] == self.ident:
            if self.old is not None and self.broken != "reshard-xor":
                source = self.old.holders(root, 1)[0]
                if source != self.ident and source in self.awaiting and self.arrivals[source].waiting(root):
                    return "hold-reshard", source
            return "apply", -1
        if self.old is not None and not self.cut_done and self.old.holders(root, 1)[0] == self.ident:
            return "apply", -1  # still the old owner: its cut has not come yet
        return "refuse", -1

    def _route_replicated_move(self, root: int, epoch: int) -> tuple[str, int]:
        """Two replicas during a move: see "Reshard with two replicas" above."""
        assert self.old is not None
        old_holders, new_holders = self.old.holders(root, 2), self.layout.holders(root, 2)
        if set(old_holders) == set(new_holders):
            return ("apply", -1) if self.ident in new_holders else ("refuse", -1)
        if self.broken == "source-to-both":
            return self._route_source_to_both(root, epoch, old_holders, new_holders)
        if self.ident in old_holders and self.ident in new_holders:
            return "apply", -1  # it stays a keeper: its own copy stays, whatever layout routed the operation
        if self.ident in old_holders:
            return ("apply", -1) if not self.cut_done else ("refuse", -1)  # leaving: served until its cut
        if self.ident not in new_holders:
            return "refuse", -1
        source = {new: old for old, new in pairing(old_holders, new_holders).items()}[self.ident]
        if source in self.awaiting and self.arrivals[source].waiting(root):
            return "hold-reshard", source
        return "apply", -1

    def _route_source_to_both(
        self, root: int, epoch: int, old_holders: tuple[int, ...], new_holders: tuple[int, ...]
    ) -> tuple[str, int]:
        """``--broken source-to-both``, the protocol before: the source's copy to both new keepers, by epoch."""
        if epoch < self.layout.epoch:
            if self.ident in old_holders and not self.cut_done:
                return "apply", -1
            return "refuse", -1
        if self.ident not in new_holders:
            return "refuse", -1
        source = old_holders[0]
        if not self.cut_done or (source in self.awaiting and self.arrivals[source].waiting(root)):
            return "hold-reshard", source
        return "apply", -1

    def _apply(self, op: Op) -> None:
        self.emit(self, apply_op(self.ledger, op))
        self.check_conservation()

    def check_conservation(self) -> None:
        """Invariant 3 for this ledger: inits = ended + pending + handed off."""
        s = self.ledger.stats
        ended = s.acked + s.failed + s.timed_out
        if s.inits != ended + self.ledger.pending_trees + self.counters.exported_trees:
            self.problem(
                f"conservation broken on acker {self.ident}: {s.inits} inits, {ended} ended, "
                f"{self.ledger.pending_trees} pending, {self.counters.exported_trees} handed off"
            )

    def tick(self, until: float) -> None:
        """Collect due trees now and again every tick until ``until`` (the server's rotation timer)."""
        if self.up:
            self.emit(self, collect_due(self.ledger))
            self.check_conservation()
        if self.world.now + TICK_SECONDS <= until:
            self.world.at(TICK_SECONDS, self.tick, until)

    # -- reshard and drain --

    def prepare(self, layout: Layout, reply: Callable[[int], None]) -> None:
        """Enter ``layout`` as prepared: hold the roots moving here until their old owner's handoff is merged."""
        if not self.up:
            return
        if layout.epoch > self.layout.epoch:
            self.old, self.layout = self.layout, layout
            self.cut_done = self.ident not in self.old.ackers
            self.awaiting = self._sources(self.old, layout)
            self.arrivals = {o: Arrivals() for o in self.awaiting}
            self.early_chunks = []
            self.world.log(f"acker {self.ident} prepared epoch {layout.epoch} {layout.ackers}")
            self._maybe_settled()
        self.world.send(reply, self.ident)

    def _sources(self, old: Layout, new: Layout) -> set[int]:
        """The old ackers whose handoff this acker awaits in ``new`` (``source-to-both``: itself too, at its cut)."""
        if self.ident not in new.ackers:
            return set()
        return {o for o in old.ackers if o != self.ident or self.broken == "source-to-both"}

    def cut(self, epoch: int, reply: Callable[[int], None]) -> None:
        """Take the cut: in one step, stop serving the roots that leave, and hand their entries to their new owners."""
        if not self.up:
            return
        if epoch == self.layout.epoch and not self.cut_done and self.replicas == 2:
            self._cut_replicated(epoch)
        elif epoch == self.layout.epoch and not self.cut_done:
            self.emit(self, collect_due(self.ledger))
            if self.broken == "cut-late":
                moving = copy_entries(self.ledger, lambda r: self.layout.holders(r, 1)[0] != self.ident, remove=True)
                self.counters.exported_trees += sum(1 for e in moving if e.spout is not None)
                # Not atomic: the entries left, but the roots are still served for a while (lost updates).
                self.world.at(0.3, self._finish_cut, epoch)
            else:
                # As the server cuts: the moving roots are listed and refused in this step, their
                # entries stay (untouched, and may still time out here) until their chunk is taken out.
                moving = copy_entries(self.ledger, lambda r: self.layout.holders(r, 1)[0] != self.ident, remove=False)
                self.cut_done = True
            self.world.log(f"acker {self.ident} cut epoch {epoch}: {len(moving)} entries leave")
            self.outbox_epoch = epoch
            self.untaken = set()
            self.outbox = {
                dest: self._chunks([e for e in moving if self.layout.holders(e.root, 1)[0] == dest])
                for dest in self.layout.ackers
                if dest != self.ident
            }
            for dest, chunks in self.outbox.items():
                for i, chunk in enumerate(chunks):
                    if self.broken == "cut-late":
                        self._send_handoff(dest, epoch, chunk, self.incarnation, [False])
                    else:  # the first chunk now, the others a little later, each taken out as it is sent
                        self.untaken.add((dest, i))
                        self.world.at(0.0 if i == 0 else self.world.rng.uniform(0.0, 1.5), self._take_chunk,
                                      dest, epoch, i, self.incarnation)  # fmt: skip
            self.check_conservation()
            self._maybe_settled()
        self.world.send(reply, self.ident)

    def _cut_replicated(self, epoch: int) -> None:
        """Two replicas: refuse the moving roots this acker leaves and hand their copies, each to its one new keeper, in chunks."""
        old, new = self.old, self.layout
        assert old is not None
        if self.broken == "source-to-both":
            self._cut_source_to_both(epoch)
            return
        self.emit(self, collect_due(self.ledger))

        def leaves(root: int) -> bool:
            return self.ident in old.holders(root, 2) and self.ident not in new.holders(root, 2)

        # As the server cuts: the roots it leaves are listed and refused in this step, their entries
        # stay (untouched, and may still time out here) until their chunk is taken out, as with one replica.
        moving = copy_entries(self.ledger, leaves, remove=False)
        self.cut_done = True
        self.world.log(f"acker {self.ident} cut epoch {epoch}: {len(moving)} entries leave, each to one new keeper")
        self.outbox_epoch = epoch
        self.untaken = set()
        target = {e.root: pairing(old.holders(e.root, 2), new.holders(e.root, 2))[self.ident] for e in moving}
        self.outbox = {
            dest: self._chunks([e for e in moving if target[e.root] == dest])
            for dest in new.ackers
            if dest != self.ident
        }
        for dest, chunks in self.outbox.items():
            for i in range(len(chunks)):  # the first chunk now, the others a little later, each taken out as sent
                self.untaken.add((dest, i))
                self.world.at(0.0 if i == 0 else self.world.rng.uniform(0.0, 1.5), self._take_chunk,
                              dest, epoch, i, self.incarnation)  # fmt: skip
        self.check_conservation()
        self._maybe_settled()

    def _cut_source_to_both(self, epoch: int) -> None:
        """``--broken source-to-both``: every moving copy out, the source's to both new keepers, the others dropped."""
        old, new = self.old, self.layout
        assert old is not None
        self.emit(self, collect_due(self.ledger))
        moving = copy_entries(self.ledger, lambda r: set(old.holders(r, 2)) != set(new.holders(r, 2)), remove=True)
        self.counters.exported_trees += sum(1 for e in moving if e.spout is not None)
        self.cut_done = True
        sourced = [e for e in moving if old.holders(e.root, 2)[0] == self.ident]
        self.world.log(f"acker {self.ident} cut epoch {epoch}: {len(moving)} entries out, {len(sourced)} handed on")
        self.outbox_epoch = epoch
        self.outbox = {
            dest: self._chunks([e for e in sourced if dest in new.holders(e.root, 2)]) for dest in new.ackers
        }
        for dest, chunks in self.outbox.items():
            for chunk in chunks:
                if dest == self.ident:
                    self._merge(epoch, self.ident, chunk)
                else:
                    self._send_handoff(dest, epoch, chunk, self.incarnation, [False])
        early, self.early_chunks = self.early_chunks, []
        for source, chunk in early:
            self._merge(epoch, source, chunk)
        for source in list(self.held):
            self._release(source, self.arrivals.get(source))
        self.check_conservation()
        self._maybe_settled()

    def _take_chunk(self, dest: int, epoch: int, index: int, incarnation: int) -> None:
        """Take chunk ``index`` for ``dest`` out of the ledger (its roots refused since the cut) and send it.

        A tree among its roots that timed out here meanwhile, or ended, is not in
        it: the manifest still names it, so the new owner holds its operations
        until every chunk is merged, then applies them as for a tree that ended
        before the cut. A crash before this step loses the entries with the ledger.
        """
        if not self.up or incarnation != self.incarnation or self.outbox_epoch != epoch:
            return
        planned = self.outbox[dest][index]
        self.untaken.discard((dest, index))
        roots = {e.root for e in planned.entries}
        self.emit(self, collect_due(self.ledger))  # the ticker's work, done here so a due entry stays and times out
        taken = copy_entries(self.ledger, roots.__contains__, remove=True)
        self.counters.exported_trees += sum(1 for e in taken if e.spout is not None)
        chunk = Chunk(planned.key, planned.count, taken, planned.manifest)
        self.outbox[dest][index] = chunk  # what a restarted new owner is sent again
        self._send_handoff(dest, epoch, chunk, self.incarnation, [False])
        self.check_conservation()

    def _finish_cut(self, epoch: int) -> None:
        if self.layout.epoch == epoch:
            self.cut_done = True
            self._maybe_settled()

    def _chunks(self, entries: list[EntryCopy]) -> list[Chunk]:
        """One new owner's part as the server cuts it: one to four chunks (at least one, even empty), the manifest in the first."""
        count = max(1, min(len(entries), self.world.rng.randint(1, 4)))
        manifest = frozenset(e.root for e in entries)
        size = -(-len(entries) // count) if entries else 0
        return [
            Chunk(
                self.world.rng.getrandbits(63) | 1,
                count,
                entries[i * size : (i + 1) * size],
                manifest if i == 0 else None,
            )
            for i in range(count)
        ]

    def _send_handoff(self, dest: int, epoch: int, chunk: Chunk, incarnation: int, acked: list[bool]) -> None:
        if acked[0] or not self.up or incarnation != self.incarnation:
            return

        def done(_: int) -> None:
            acked[0] = True

        self.world.send(self.peers[dest].handoff, epoch, self.ident, chunk, done)
        self.world.at(RETRY_SECONDS, self._send_handoff, dest, epoch, chunk, incarnation, acked)

    def handoff(self, epoch: int, source: int, chunk: Chunk, reply: Callable[[int], None]) -> None:
        """Merge a chunk from ``source`` once per key, acknowledge it (``source-to-both``: kept until its own cut)."""
        if not self.up:
            return
        if epoch > self.layout.epoch:
            # Not prepared for that layout yet: no answer, so the sender keeps the chunk and sends it again
            # (the server refuses it, FAILED_PRECONDITION). Acknowledged unmerged, it would never come back.
            return
        if (
            self.broken == "source-to-both"
            and not self.cut_done
            and epoch == self.layout.epoch
            and source in self.awaiting
        ):
            if all(c.key != chunk.key for _, c in self.early_chunks):
                self.early_chunks.append((source, chunk))
        else:
            self._merge(epoch, source, chunk)
        self.world.send(reply, self.ident)

    def _merge(self, epoch: int, source: int, chunk: Chunk) -> None:
        """Merge a chunk from ``source`` once per key, then apply what was held for the roots no longer awaited."""
        arrivals = self.arrivals.get(source)
        if epoch == self.layout.epoch and source in self.awaiting and arrivals and chunk.key not in arrivals.keys:
            for entry in chunk.entries:
                if self.broken == "reshard-xor":
                    ops = xor_merge_ops(self.ledger, entry)
                else:
                    self._expect_absent(entry.root, f"handoff from {source}")
                    if self.broken == "handoff-no-keys":
                        entry = replace(entry, keys=())  # wrong on purpose: the dedup keys stay behind
                    ops = import_ops(entry)
                for op in ops:
                    self._apply(op)
            arrivals.keys.add(chunk.key)
            self.world.count("handoff chunks merged")
            arrivals.merged.update(e.root for e in chunk.entries)
            if chunk.manifest is not None:
                arrivals.manifest = chunk.manifest
            if len(arrivals.keys) >= chunk.count:
                self.awaiting.discard(source)
                del self.arrivals[source]
            self._release(source, arrivals if source in self.awaiting else None)
            self.world.log(
                f"acker {self.ident} merged {len(chunk.entries)} entries from {source} "
                f"({len(arrivals.keys)} of {chunk.count} chunks, epoch {epoch})"
            )
            self._maybe_settled()

    def _release(self, source: int, arrivals: Arrivals | None) -> None:
        """Apply, in arrival order, what was held for ``source``'s roots that no entry can be on its way for."""
        held = self.held.pop(source, [])
        still = [op for op in held if arrivals is not None and arrivals.waiting(op.root)]
        for op in held:
            if arrivals is None or not arrivals.waiting(op.root):
                self._apply(op)
        if still:
            self.held[source] = still

    def _maybe_settled(self) -> None:
        if self.old is not None and self.cut_done and not self.awaiting and not self.early_chunks:
            self.old = None

    @property
    def moving(self) -> bool:
        """Whether a reshard is still under way here (cut not taken, or handoffs not merged)."""
        return self.old is not None

    # -- crash, restart, catch-up --

    def crash(self) -> None:
        """kill -9: the ledger, the holds and every message in flight to this incarnation are gone."""
        self.up = False
        self.incarnation += 1
        self.held.clear()
        self.arrivals.clear()
        self.early_chunks.clear()
        self.untaken.clear()
        self.catching.clear()
        self.catch_held.clear()
        self.world.log(f"acker {self.ident} crashed")

    def restart(self, move: tuple[Layout, Layout] | None = None) -> None:
        """Come back empty; with two replicas, catch up each range from its partner.

        With one replica and a move under way (``move``: the old and the new
        layout, from the controller), it rejoins the move with nothing to hand
        over: it sends every new owner an empty handoff (its entries died with
        it; their trees are replayed), and as a new owner awaits every old
        owner's handoff again (they re-send what their cut took, see
        :meth:`peer_restarted`).
        """
        self.up = True
        self.incarnation += 1
        self.ledger = ReferenceLedger(self.message_timeout, clock=self.world.clock)
        self.counters = Counters()
        self.world.log(f"acker {self.ident} restarted")
        if self.replicas == 1:
            self.old, self.awaiting, self.cut_done = None, set(), True
            if move is not None:
                old, new = move
                self.old, self.layout = old, new
                self.awaiting = {o for o in old.ackers if o != self.ident} if self.ident in new.ackers else set()
                self.arrivals = {o: Arrivals() for o in self.awaiting}
                if self.ident in old.ackers:
                    self.outbox_epoch = new.epoch
                    self.outbox = {dest: self._chunks([]) for dest in new.ackers if dest != self.ident}
                    for dest, chunks in self.outbox.items():
                        for chunk in chunks:
                            self._send_handoff(dest, new.epoch, chunk, self.incarnation, [False])
                self._maybe_settled()
            for source in sorted(self.awaiting):
                self._ask_handoff(source, self.incarnation)
        if self.replicas == 2:
            n = len(self.layout.ackers)
            mine = self.layout.ackers.index(self.ident)
            self.catching = {
                mine: self.layout.ackers[(mine + 1) % n],
                (mine - 1) % n: self.layout.ackers[(mine - 1) % n],
            }
            self.catch_held = {shard: [] for shard in self.catching}
            for shard in sorted(self.catching):
                self._ask_snapshot(shard, self.incarnation)

    def _ask_handoff(self, source: int, incarnation: int) -> None:
        """Ask an old owner for its handoff again, until it is merged (the request or the answer may be lost)."""
        if self.up and incarnation == self.incarnation and source in self.awaiting:
            self.world.send(self.peers[source].peer_restarted, self.ident)
            self.world.at(RETRY_SECONDS * 2, self._ask_handoff, source, incarnation)

    def peer_restarted(self, ident: int) -> None:
        """A new owner restarted during the move: hand it this epoch's entries again (it merges the first copy).

        Before its cut an old owner has nothing to re-send: the cut sends the handoff.
        """
        if self.broken == "no-resend":
            return  # wrong on purpose: the restarted new owner waits for a handoff that never comes again
        if self.up and self.cut_done and self.outbox_epoch == self.layout.epoch and ident in self.outbox:
            for index, chunk in enumerate(self.outbox[ident]):
                if (ident, index) not in self.untaken:  # one not taken out yet is sent when it is
                    self._send_handoff(ident, self.outbox_epoch, chunk, self.incarnation, [False])

    @property
    def caught_up(self) -> bool:
        """Whether every range has its snapshot installed (always, with one replica)."""
        return self.up and not self.catching

    def _ask_snapshot(self, shard: int, incarnation: int) -> None:
        if not self.up or incarnation != self.incarnation or shard not in self.catching:
            return
        partner = self.peers[self.catching[shard]]
        self.world.send(partner.snapshot, shard, self._install, incarnation)
        self.world.at(RETRY_SECONDS, self._ask_snapshot, shard, incarnation)

    def snapshot(self, shard: int, reply: Callable[[int, int, list[EntryCopy] | None], None], token: int) -> None:
        """Copy the entries of range ``shard`` in one step (the cut) for a restarted partner; None if lost here too."""
        if not self.up:
            return
        if shard in self.catching:
            self.world.send(reply, shard, token, None)
            return
        self.emit(self, collect_due(self.ledger))
        self.check_conservation()
        n = len(self.layout.ackers)
        entries = copy_entries(self.ledger, lambda r: r % n == shard, remove=False)
        self.world.send(reply, shard, token, entries)

    def _install(self, shard: int, incarnation: int, entries: list[EntryCopy] | None) -> None:
        if not self.up or incarnation != self.incarnation or shard not in self.catching:
            return  # a duplicate or late snapshot: the first one was installed
        del self.catching[shard]
        for entry in entries or ():
            if self.broken == "catchup-xor":
                ops = xor_merge_ops(self.ledger, entry)
            else:
                self._expect_absent(entry.root, "snapshot")
                ops = import_ops(entry)
            for op in ops:
                self._apply(op)
        for op in self.catch_held.pop(shard, []):
            self._apply(op)
        what = "nothing (partner restarted too)" if entries is None else f"{len(entries)} entries"
        self.world.log(f"acker {self.ident} installed range {shard}: {what}; caught up: {self.caught_up}")

    def _expect_absent(self, root: int, where: str) -> None:
        (info,) = self.ledger.inspect([root])
        if info.status is not TreeStatus.ABSENT:
            self.problem(f"acker {self.ident}: {where} brings root {root:#x}, which it already holds")
