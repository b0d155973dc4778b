"""One acker's membership: which roots it owns, the layout changes that move them, and a restarted replica's catch-up.

The :class:`~acker_service.shard.Shard` serves Apply, expiry and subscriptions;
it hands everything about moving trees between ackers to its
:class:`Membership`: the layout (and its file), the Apply requests that arrive
while trees move (applied now, held for their entries, or refused), the cut
that hands entries away, the handoffs merged here, the commit, and the
snapshots a restarted partner copies. Like the shard it runs on the server's
one event loop, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np
from acker_protocol.apply_codec import encode_part

from ..batch import BatchError, InvalidBatch, WrongShard, check_request
from ..config import ServerConfig
from ..handoff import MovedEntries
from ..ledger import Ledger, Limits
from ..outcome_columns import ColumnarResult, OutcomeColumns
from .catchup import CatchUp
from .held import HeldOperations
from .layout import PREPARED, Layout, LayoutMachine, LayoutRefused
from .layout_file import LayoutFile, LayoutNotRecorded, starting_layout
from .peers import peer_security
from .request_parts import apply_in_parts
from .reshard import Chunk, HandoffFailed, HandoffRefused, Slice, plan_slices, send_handoffs
from .transfers import Transfers

__all__ = ["Membership"]

log = logging.getLogger(__name__)


class Membership:
    """The layout a shard serves and the moves of its trees: prepare, cut, handoffs, commit, catch-up.

    ``settle`` records and routes ended trees' outcomes (and refreshes the
    gauges); ``applied`` does what the shard does after any applied request.
    """

    def __init__(
        self,
        config: ServerConfig,
        ledger: Ledger,
        settle: Callable[[OutcomeColumns], None],
        applied: Callable[[ColumnarResult], None],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self._settle = settle
        self._applied = applied
        # Which roots are ours, and a layout change in progress (see layout.py).
        # A joining acker (--join, index >= count) starts outside the layout, as a drained one ends.
        # With --layout-file the last committed layout wins over the flags (layout_file.py).
        self.layout_file = LayoutFile(config.layout_file) if config.layout_file else None
        initial = self._starting_layout(Layout(0, config.shard_count, config.shard_index if config.in_layout else -1))
        self.layout = LayoutMachine(initial, config.replicas)
        self.limits = Limits(max(initial.index, 0), initial.count, config.max_batch, config.replicas)
        # During a change the ledger is asked per operation, ownership checked by the layout (route()).
        self._any_root = Limits(0, 1, config.max_batch, 1)
        self.held = HeldOperations(config.max_held_operations)  # operations on roots still moving here
        # Handoff chunks a cut could not deliver yet (sent again by the next cut), and slices not taken out yet.
        self._unsent: list[Chunk | Slice] = []
        self._slices_left = 0  # slices of this change's cut whose entries are still in the ledger
        self._cut_moved = (0, 0)  # (trees, entries) this change's cut took out
        self._merged_chunks: dict[int, set[int]] = {}  # per old shard: its handoff chunk keys merged
        self._cutting = False
        # A restarted replica copies each of its two ranges from a partner before it applies its operations
        # (catchup.py): the ranges of the layout it starts in (the layout file's, after a reshard).
        self.catchup = CatchUp.for_shard(
            max(initial.index, 0),
            initial.count,
            config.replicas,
            enabled=bool(config.peer_addresses) and initial.index >= 0,
            max_held=config.max_held_operations,
        )
        self.transfers = Transfers()  # trees and entries copied in and out (the metrics read them)

    def _starting_layout(self, flags: Layout) -> Layout:
        """The flags' layout, or the layout file's when it is newer (LayoutFileError: the file is unreadable)."""
        if self.layout_file is None:
            return flags
        stored = self.layout_file.load()
        layout = starting_layout(flags, stored)
        if layout is not flags:
            log.info(
                "layout file %s holds committed layout epoch %d: starting as shard %s of %d there "
                "(the flags say shard %d of %d)",
                self.layout_file.path,
                layout.epoch,
                layout.index if layout.index >= 0 else "none (drained)",
                layout.count,
                self.config.shard_index,
                self.config.shard_count,
            )
        elif stored is None:
            log.info("no layout file at %s yet: starting from the flags' layout", self.layout_file.path)
        return layout

    @property
    def catchup_peers(self) -> tuple[str, ...]:
        """Whom a restarted replica copies its ranges from: the addresses of the layout it started in, else ``--peers``."""
        current = self.layout.current
        return current.addresses if len(current.addresses) == current.count else self.config.peer_addresses

    @property
    def place(self) -> tuple[int, int]:
        """(shard index, shard count) this acker reports; a drained or joining acker keeps its flag's index."""
        current = self.layout.current
        return (current.index if current.index >= 0 else self.config.shard_index), current.count

    @property
    def steady(self) -> bool:
        """Whether Apply takes a request whole with :attr:`limits` (no move, no catch-up, a place in the layout)."""
        return not self.layout.moving and self.layout.current.index >= 0 and not self.catchup.holding

    # -- Apply while not steady ------------------------------------------------

    def apply(self, data: bytes) -> ColumnarResult:
        """Apply a request while not :attr:`steady`: routed per operation, or refused whole (a BatchError)."""
        if self.layout.moving:
            return self._apply_moving(data)
        if self.layout.current.index < 0:
            place = (
                f"left the cluster at layout epoch {self.layout.current.epoch}"
                if self.layout.current.epoch or self.config.in_layout
                else "joins the cluster and has no place until acker-ctl reshard gives it one"
            )
            raise WrongShard(
                f"this acker {place} and owns no roots; ask Describe for the layout and send to the shards it names"
            )
        return self._apply_catching_up(data)

    def _apply_moving(self, data: bytes) -> ColumnarResult:
        """Apply during a layout change: each operation applies now, is held for its old owner's handoff, or refuses the request.

        The request is validated whole first, and refused whole (nothing applied,
        nothing held) when one root is not served here any more: the client then
        re-routes every operation of it by the next layout, each with its dedup key.
        """
        batch = check_request(data, self._any_root)
        route = self.layout.route(batch.roots)
        if route.refused >= 0:
            raise WrongShard(self.layout.refusal(int(batch.roots[route.refused])))
        result = apply_in_parts(
            self.ledger,
            data,
            batch,
            route.source,
            self.held,
            self._any_root,
            lambda n: (
                f"this acker holds {self.held.operations} operations for trees still moving to it, its limit "
                f"(--max-held-operations {self.held.limit}); nothing was applied, retry the same batch shortly"
            ),
        )
        self._applied(result)
        return result

    def _apply_catching_up(self, data: bytes) -> ColumnarResult:
        """Apply while catching up: operations on a copied range apply now, the others wait for their range's copy.

        Validated whole first (a refusal is answered now, nothing held); refused
        whole with UNAVAILABLE when what it would hold passes the bound.
        """
        batch = check_request(data, self.limits)
        catchup = self.catchup
        result = apply_in_parts(
            self.ledger, data, batch, catchup.awaited(batch.roots), catchup.held, self.limits, catchup.refusal
        )
        self._applied(result)
        return result

    # -- layout changes: prepare, cut, commit, and the handoffs between ackers --

    def prepare_layout(self, layout: Layout, previous: Layout | None = None) -> None:
        """Learn this acker's place in the next layout and in the one left (LayoutRefused: nothing changed)."""
        if self.catchup.holding and layout != self.layout.next:
            raise LayoutRefused(
                f"this acker restarted and is still copying ranges {sorted(self.catchup.waiting)} from its partners "
                "(catch-up); nothing changed: run acker-ctl again once Describe says caught-up"
            )
        if previous is not None and previous.index < 0 and self.ledger.pending_trees and layout != self.layout.next:
            raise LayoutRefused(
                f"this acker holds {self.ledger.pending_trees} pending trees but the change names it as no shard "
                f"of layout epoch {previous.epoch}; list it among the current ackers; nothing changed"
            )
        if self.layout_file is not None:
            # A disk that cannot take the file refuses the change here, where nothing has moved and
            # running acker-ctl reshard again is safe, rather than at the commit.
            try:
                self.layout_file.save(self.layout.current)
            except OSError as exc:
                raise LayoutNotRecorded(
                    f"cannot write the layout file {self.layout_file.path} ({exc}); nothing changed: "
                    "make it writable and run acker-ctl reshard again"
                ) from exc
        fresh = layout != self.layout.next
        self.layout.prepare(layout, previous)
        if fresh:
            self._merged_chunks.clear()
            self._unsent, self._cut_moved, self._slices_left = [], (0, 0), 0
            self.held.clear()

    async def cut_layout(self, epoch: int, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[int, int]:
        """Hand the entries the next layout gives away to their new owners; (trees, entries) moved by this call.

        Raises HandoffFailed when a new owner did not acknowledge its entries: they
        are kept and sent again by the next call (nothing is lost or merged twice).
        """
        target = self.layout.start_cut(epoch)
        if self._cutting:
            raise LayoutRefused("a cut is already running on this acker")
        self._cutting = True
        try:
            if self.layout.state == PREPARED and self.config.replicas > 1:
                await self._cut_replicated(target)
            elif self.layout.state == PREPARED:
                # One event-loop step: the roots that leave are listed and refused from now on, so
                # no update lands here after the cut; their entries stay, untouched, until their
                # slice is taken out and sent, youngest first (docs/acker-semantics.md).
                roots, ages = self.ledger.moving_roots(target.count, target.index)
                self.layout.mark_cut()
                source = self.layout.previous.index if self.layout.previous else -1
                if source >= 0:  # an acker new in this layout was no old owner: it hands nothing over
                    # Off the event loop (the ledger is not touched): Apply goes on meanwhile.
                    slices = await asyncio.to_thread(plan_slices, roots, ages, target, source, self._take_slice)
                    self._unsent, self._slices_left = list(slices), len(slices)
            self._unsent = await send_handoffs(self._unsent, target, metadata, peer_security(self.config))
        finally:
            self._cutting = False
        if self._unsent:
            waiting = sum(len(c.entries) if isinstance(c, Chunk) else len(c.roots) for c in self._unsent)
            refused = [c for c in self._unsent if isinstance(c, Chunk) and c.refusal]
            if refused:
                addresses = target.addresses
                why = "; ".join(
                    sorted(
                        {f"{addresses[c.shard] if c.shard < len(addresses) else c.shard}: {c.refusal}" for c in refused}
                    )
                )
                raise HandoffRefused(
                    f"{len(refused)} of {len(self._unsent)} handoffs ({waiting} moved entries) were refused by their "
                    f"new owners ({why}); the entries are kept here. An acker restarted after an earlier cut of "
                    "this move does not rejoin it (docs/acker-semantics.md, 'Moving trees')"
                )
            raise HandoffFailed(
                f"{len(self._unsent)} handoffs ({waiting} moved entries) could not reach their new owners yet; "
                "they are kept here: call CutLayout again (acker-ctl reshard again) once every acker of the new "
                "layout is reachable"
            )
        return self._cut_moved

    async def _cut_replicated(self, target: Layout) -> None:
        """Two replicas: refuse the moving roots this acker leaves, in one step, and slice their copies, each for one new keeper.

        In one event-loop step every live root here is listed and, from then on,
        the moving roots this acker leaves are refused; their entries stay in the
        ledger, untouched, until their slice is taken out and sent, youngest first,
        as with one replica (:func:`plan_slices`). Each copy goes to the one new
        keeper paired with this acker for its root
        (:meth:`LayoutMachine.handoff_targets`). The moving roots this acker keeps
        in both layouts stay in its ledger, served throughout: no copy is dropped.
        The slices are sent by the caller (every new shard but this acker's own
        place gets one, empty too).
        """
        roots, ages = self.ledger.moving_roots(1, -1)  # every live root here, with nothing removed
        self.layout.mark_cut()
        source = self.layout.previous.index if self.layout.previous else -1
        if source >= 0:  # an acker new in this layout kept no root: it hands nothing over
            # Off the event loop (the ledger is not touched): Apply goes on meanwhile.
            slices = await asyncio.to_thread(self._plan_replicated, roots, ages, target, source)
            self._unsent, self._slices_left = list(slices), len(slices)

    def _plan_replicated(self, roots: np.ndarray, ages: np.ndarray, target: Layout, source: int) -> list[Slice]:
        """The slices of a two-replica cut: the roots this acker leaves, by the new keeper each copy goes to."""
        plan = self.layout.cut_plan(roots, ages)
        return plan_slices(plan.leave, plan.ages, target, source, self._take_slice, plan.targets)

    def _take_slice(self, roots: np.ndarray) -> MovedEntries:
        """Take one slice of the cut out of the ledger (one event-loop step) and count what left."""
        self._slices_left -= 1
        moved = self.ledger.export_roots(roots, last=self._slices_left <= 0)
        self._settle(OutcomeColumns.empty())  # refresh the pending gauge
        self._cut_moved = (self._cut_moved[0] + moved.trees, self._cut_moved[1] + len(moved))
        self.layout.count_moved(moved.trees, len(moved))
        self.transfers.handoff_out_trees += moved.trees
        self.transfers.handoff_out_entries += len(moved)
        return moved

    def take_handoff(
        self, epoch: int, source: int, chunks: int, key: int, moved: MovedEntries, manifest: np.ndarray | None = None
    ) -> int:
        """Merge a chunk old owner ``source`` handed over (once per key); how many entries were merged.

        The operations held for a root of ``source`` then apply, in arrival order,
        through the ledger's normal rules, once its entry's chunk is merged, or the
        ``manifest`` (carried by the first chunk) shows no entry is coming for it,
        or all ``chunks`` are merged.
        """
        if not self.layout.accepts_handoff(epoch):
            raise LayoutRefused(f"this acker is not prepared for layout epoch {epoch}; moved entries refused")
        previous = self.layout.previous
        if previous is None or not 0 <= source < previous.count or chunks < 1 or not key:
            raise InvalidBatch(
                "a handoff names its sender's shard in the layout left (source), its chunk count (at least 1) "
                "and a non-zero chunk key; nothing merged"
            )
        merged = self._merged_chunks.setdefault(source, set())
        if key in merged:
            return 0  # a resent chunk whose first answer was lost: merged already
        if source not in self.layout.awaiting:
            raise LayoutRefused(
                f"every handoff of old shard {source} was merged already (or it is this acker); chunk refused"
            )
        chunk = Chunk(max(self.layout.next.index, 0) if self.layout.next else 0, key, moved, source, chunks, manifest)
        # Two replicas too, before this acker's own cut: its roots are new here, it held no copy of them.
        return self._merge(source, chunk)

    def _merge(self, source: int, chunk: Chunk) -> int:
        """Merge one chunk of old shard ``source`` (its key not merged yet), then apply what was held and may apply now."""
        moved = chunk.entries
        self._settle(self.ledger.import_entries(moved))
        self.transfers.handoff_in_trees += moved.trees
        self.transfers.handoff_in_entries += len(moved)
        merged = self._merged_chunks.setdefault(source, set())
        merged.add(chunk.key)
        complete = len(merged) >= chunk.count
        if complete:
            self.layout.source_merged(source)
        else:
            self.layout.chunk_merged(source, moved.roots, chunk.manifest)
        self._release(source, complete)
        return len(moved)

    def _release(self, source: int, complete: bool) -> None:
        """Apply what was held for old owner ``source``'s roots whose entries are here (all, once ``complete``)."""
        for request in self.held.release(source):
            try:
                if complete:
                    self._applied(self.ledger.apply(request, self._any_root, max_expired=0))
                    continue
                batch = check_request(request, self._any_root)
                waiting = self.layout.route(batch.roots).source >= 0
                if not waiting.all():
                    part = request if not waiting.any() else encode_part(batch, ~waiting)
                    self._applied(self.ledger.apply(part, self._any_root, max_expired=0))
                if waiting.any():  # back in the queue in the same order: later arrivals stay behind it
                    self.held.hold(
                        source, request if waiting.all() else encode_part(batch, waiting), int(waiting.sum())
                    )
            except BatchError:  # validated whole when it was held: not expected
                log.exception("an operation held during the layout change could not be applied")

    def commit_layout(self, epoch: int) -> Layout:
        """Take the next layout and serve Apply again."""
        if self._cutting:
            raise LayoutRefused("this acker's cut is still handing its entries over; commit once it has answered")
        if self._unsent:
            raise LayoutRefused("this acker still holds moved entries it could not hand over; cut again first")
        layout = self.layout.commit(epoch, self._record)
        self._merged_chunks.clear()
        self.limits = Limits(max(layout.index, 0), layout.count, self.config.max_batch, self.config.replicas)
        return layout

    def _record(self, layout: Layout) -> None:
        """Write the layout about to be committed to the layout file (if any), before it is served.

        A write failing here does not stop the commit: the other ackers may have
        committed already and this one must agree with them now. It is logged; a
        restart before the next successful write would come back in the older layout.
        (The write blocks the event loop for an fsync, once per layout change.)
        """
        if self.layout_file is None:
            return
        try:
            self.layout_file.save(layout)
        except OSError as exc:
            log.error(
                "layout epoch %d is committed but could not be written to %s (%s): a restart would start in "
                "the older layout; fix the file's disk and run acker-ctl reshard again with the same addresses",
                layout.epoch,
                self.layout_file.path,
                exc,
            )

    # -- a restarted replica's catch-up (--replicas 2; the rules are in catchup.py) --

    def snapshot(self, shard_count: int, range_index: int) -> MovedEntries | None:
        """Copy the entries of ``range_index`` for a restarted partner, in one step; None if lost here too.

        Raises :class:`~acker_service.batch.InvalidBatch` for a shard count that
        is not this acker's or a range outside it, and
        :class:`~acker_service.batch.WrongShard` with one replica or for a range
        this acker does not keep. Nothing changes either way.
        """
        # The ranges of the layout served now (after a reshard: not the flags').
        n, i = self.layout.current.count, self.layout.current.index
        if shard_count != n or not 0 <= range_index < n:
            raise InvalidBatch(
                f"snapshot of range {range_index} of {shard_count} shards asked, but this cluster has {n} shards "
                f"(ranges 0..{n - 1}); ask with this acker's shard count; nothing was copied"
            )
        if self.config.replicas < 2:
            raise WrongShard("this acker runs with --replicas 1: it keeps no partner's range; nothing was copied")
        if i < 0:
            raise WrongShard(
                f"this acker has no place in layout epoch {self.layout.current.epoch}: it keeps no range; nothing "
                "was copied"
            )
        if range_index not in (i, (i - 1) % n):
            raise WrongShard(
                f"shard {i} keeps ranges {i} and {(i - 1) % n}, not {range_index}; ask shard {range_index} "
                f"or {(range_index + 1) % n}; nothing was copied"
            )
        if self.catchup.lost(range_index):
            return None
        moved = self.ledger.export_snapshot(n, range_index)
        self._settle(OutcomeColumns.empty())
        self.transfers.snapshot_out_trees += moved.trees
        self.transfers.snapshot_out_entries += len(moved)
        return moved

    def install_snapshot(self, range_index: int, moved: MovedEntries | None) -> bool:
        """Take a partner's copy of ``range_index`` (None: it lost the range too); True once caught up.

        A copy of a range already installed is ignored. The operations held for
        the range are then applied in arrival order through the ledger's rules,
        whether or not the other range is copied yet.
        """
        if not self.catchup.lost(range_index):
            return not self.catchup.holding
        entries = moved if moved is not None else MovedEntries()
        self._settle(self.ledger.import_entries(entries))
        self.transfers.catchup_in_trees += entries.trees
        self.transfers.catchup_in_entries += len(entries)
        held = self.catchup.installed(range_index, len(entries), entries.trees, moved is None)
        for data in held or ():
            try:
                result = self.ledger.apply(data, self.limits, max_expired=0)
            except BatchError as exc:  # validated when held: only a changed layout could refuse it now
                log.error("a held Apply request could not be applied after its range's copy: %s", exc)
                continue
            self._applied(result)
        return not self.catchup.holding
