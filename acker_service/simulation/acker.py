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
       cut, in one step, an old owner collects its due trees, takes out every
       entry it does not own under the new layout, from then on refuses those
       roots (naming the new layout), and sends each new owner its entries
       (an empty handoff too, so every new owner learns that ``o`` is done),
       re-sent until acknowledged.
    3. *Merge*: a new owner merges the first handoff from each old owner (a
       re-sent or duplicated one is acknowledged and ignored): an entry it
       cannot already hold is re-created as it was (value, spout, failed flag,
       dedup keys), then the operations it held for that old owner are applied
       in arrival order through the ledger's normal rules.
    Holding, rather than applying and merging by XOR later, is what makes a
    client's retry across the cut harmless: a batch applied by the old owner
    whose reply was lost is re-sent to the new owner, and applying it there
    after the handoff is deduplicated (the ACK's key travels with the entry, an
    INIT is set-once, a FAIL idempotent), where an XOR merge of two applied
    copies would cancel it (``--broken reshard-xor`` shows the false acks).

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..outcome_columns import Resolution
from ..reference_ledger import ReferenceLedger
from ..tree_info import TreeStatus
from .events import World
from .transfer import EntryCopy, Op, apply_op, collect_due, copy_entries, import_ops, xor_merge_ops

__all__ = ["Layout", "SimAcker", "RETRY_SECONDS"]

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


@dataclass
class Counters:
    """What one ledger incarnation handed over, for the conservation check."""

    exported_trees: int = 0


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
    peers: dict[int, SimAcker] = field(default_factory=dict)
    up: bool = True
    incarnation: int = 0
    old: Layout | None = None
    cut_done: bool = True
    awaiting: set[int] = field(default_factory=set)
    held: dict[int, list[Op]] = field(default_factory=dict)
    catching: dict[int, int] = field(default_factory=dict)  # shard index of a range -> partner acker id
    catch_held: dict[int, list[Op]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    # What this acker's cut handed to each new owner, kept for the whole epoch: a new owner that
    # restarts during the move lost what it merged, and is sent it again.
    outbox: dict[int, list[EntryCopy]] = field(default_factory=dict)
    outbox_epoch: int = -1
    ledger: ReferenceLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = ReferenceLedger(self.message_timeout, clock=self.world.clock)

    # -- operations from clients --

    def receive(self, op: Op, reply: Reply) -> None:
        """An operation arrives: apply it, hold it, or refuse it naming the newest layout."""
        if not self.up:
            return  # the connection broke with the process: the client's retry timer re-sends
        verdict, source = self._route(op.root)
        if self.world.tracing:
            self.world.log(
                f"acker {self.ident} {verdict} {op.kind.name} {op.root:#x} value {op.value:#x} key {op.key:#x}"
            )
        if verdict == "refuse":
            self.world.send(reply, "refused", self.layout, self.incarnation)
            return
        if verdict == "hold-reshard":
            self.held.setdefault(source, []).append(op)
        elif verdict == "hold-catchup":
            self.catch_held[source].append(op)
        else:
            self._apply(op)
        self.world.send(reply, "ok", self.layout, self.incarnation)

    def _route(self, root: int) -> tuple[str, int]:
        """Whether this acker applies, holds (and for whom) or refuses an operation on ``root``."""
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
                if source != self.ident and source in self.awaiting:
                    return "hold-reshard", source
            return "apply", -1
        if self.old is not None and not self.cut_done and self.old.holders(root, 1)[0] == self.ident:
            return "apply", -1  # still the old owner: its cut has not come yet
        return "refuse", -1

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
            self.awaiting = {o for o in self.old.ackers if o != self.ident} if self.ident in layout.ackers else set()
            self.world.log(f"acker {self.ident} prepared epoch {layout.epoch} {layout.ackers}")
            self._maybe_settled()
        self.world.send(reply, self.ident)

    def cut(self, epoch: int, reply: Callable[[int], None]) -> None:
        """Take the cut: in one step, stop serving the roots that leave, and hand their entries to their new owners."""
        if not self.up:
            return
        if epoch == self.layout.epoch and not self.cut_done:
            self.emit(self, collect_due(self.ledger))
            moving = copy_entries(self.ledger, lambda r: self.layout.holders(r, 1)[0] != self.ident, remove=True)
            self.counters.exported_trees += sum(1 for e in moving if e.spout is not None)
            if self.broken == "cut-late":
                # Not atomic: the entries left, but the roots are still served for a while (lost updates).
                self.world.at(0.3, self._finish_cut, epoch)
            else:
                self.cut_done = True
            self.world.log(f"acker {self.ident} cut epoch {epoch}: {len(moving)} entries leave")
            self.outbox_epoch = epoch
            self.outbox = {
                dest: [e for e in moving if self.layout.holders(e.root, 1)[0] == dest]
                for dest in self.layout.ackers
                if dest != self.ident
            }
            for dest, part in self.outbox.items():
                self._send_handoff(dest, epoch, part, self.incarnation, [False])
            self.check_conservation()
            self._maybe_settled()
        self.world.send(reply, self.ident)

    def _finish_cut(self, epoch: int) -> None:
        if self.layout.epoch == epoch:
            self.cut_done = True
            self._maybe_settled()

    def _send_handoff(
        self, dest: int, epoch: int, entries: list[EntryCopy], incarnation: int, acked: list[bool]
    ) -> None:
        if acked[0] or not self.up or incarnation != self.incarnation:
            return

        def done(_: int) -> None:
            acked[0] = True

        self.world.send(self.peers[dest].handoff, epoch, self.ident, entries, done)
        self.world.at(RETRY_SECONDS, self._send_handoff, dest, epoch, entries, incarnation, acked)

    def handoff(self, epoch: int, source: int, entries: list[EntryCopy], reply: Callable[[int], None]) -> None:
        """Merge the first handoff from ``source`` for this epoch, then apply what was held for it."""
        if not self.up:
            return
        if epoch == self.layout.epoch and source in self.awaiting:
            for entry in entries:
                if self.broken == "reshard-xor":
                    ops = xor_merge_ops(self.ledger, entry)
                else:
                    self._expect_absent(entry.root, f"handoff from {source}")
                    if self.broken == "handoff-no-keys":
                        entry = replace(entry, keys=())  # wrong on purpose: the dedup keys stay behind
                    ops = import_ops(entry)
                for op in ops:
                    self._apply(op)
            self.awaiting.discard(source)
            for op in self.held.pop(source, []):
                self._apply(op)
            self.world.log(f"acker {self.ident} merged {len(entries)} entries from {source} (epoch {epoch})")
            self._maybe_settled()
        self.world.send(reply, self.ident)

    def _maybe_settled(self) -> None:
        if self.old is not None and self.cut_done and not self.awaiting:
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
                if self.ident in old.ackers:
                    self.outbox_epoch = new.epoch
                    self.outbox = {dest: [] for dest in new.ackers if dest != self.ident}
                    for dest in self.outbox:
                        self._send_handoff(dest, new.epoch, [], self.incarnation, [False])
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
            self._send_handoff(ident, self.outbox_epoch, self.outbox[ident], self.incarnation, [False])

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
