"""One acker shard's state and rules: ledger, outcome hub, expiry and metrics, without gRPC.

The ledger is the engine the configuration names (``native`` by default, see
:mod:`acker_service.engines`); its outcomes reach the metrics and the hub as
columns (:class:`~acker_service.outcome_columns.OutcomeColumns`).

The servicer translates protobuf to calls on a :class:`Shard`; the server owns
the event loop, health and the timer that calls :meth:`Shard.advance`. Every
method runs on that one event loop, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable

import numpy as np
from acker_protocol.text import clip
from acker_protocol.wire import check_spout_name

from .batch import Batch, BatchError, InvalidBatch, WrongShard
from .catchup import CatchUp, check_request
from .config import ServerConfig
from .engines import new_ledger
from .handoff import MovedEntries
from .held import HeldOperations
from .layout import PREPARED, ApplyHeld, Layout, LayoutMachine, LayoutRefused
from .layout_file import LayoutFile, LayoutNotRecorded, starting_layout
from .ledger import Limits
from .metrics import AckerMetrics
from .operate import AGE_BUCKETS, check_oldest, check_roots
from .outcome_columns import ColumnarResult, OutcomeColumns
from .outcome_hub import OutcomeChunk, OutcomeHub
from .peers import peer_security
from .request_parts import decode_request, encode_part
from .reshard import Chunk, HandoffFailed, plan_handoffs, send_handoffs
from .tree_info import TreeInfo

__all__ = ["EXPIRY_SLICE", "Shard", "SubscribeRefused", "BadSpoutName", "ShardClosing", "Superseded", "new_incarnation"]

log = logging.getLogger(__name__)

# Trees expired per slice: a few milliseconds of work, so health checks, Apply and
# Subscribe wait at most that long during a mass expiry.
EXPIRY_SLICE = 2048


def new_incarnation() -> int:
    """A random non-zero 64-bit id for one server lifetime."""
    while True:
        value = secrets.randbits(64)
        if value:
            return value


class SubscribeRefused(Exception):
    """A subscription was refused or ended by the shard; the message says what the spout should do."""


class BadSpoutName(SubscribeRefused):
    """The spout name is empty or too long (INVALID_ARGUMENT)."""


class ShardClosing(SubscribeRefused):
    """The shard is shutting down (UNAVAILABLE): resubscribe elsewhere or later, with the position."""


class Superseded(SubscribeRefused):
    """A newer subscription of the same spout took over this one (ABORTED)."""


class TooManySubscriptions(SubscribeRefused):
    """The acker holds its maximum of open subscriptions (--max-subscriptions)."""


class Shard:
    """The pending trees of one shard and the routing of their outcomes to spouts.

    ``apply_request`` validates and applies a request (raising a
    :class:`~acker_service.batch.BatchError` that changes nothing), ``advance``
    expires what the clock says is due, ``subscribe`` streams a spout's
    outcomes, ``close`` ends those streams at shutdown.
    """

    def __init__(
        self, config: ServerConfig, clock: Callable[[], float] | None = None, incarnation: int | None = None
    ) -> None:
        clock = clock or time.monotonic  # None: real time (callers can pass an optional clock through)
        self.config = config
        self.incarnation = incarnation or new_incarnation()
        self.ledger = new_ledger(
            config.engine,
            config.message_timeout,
            config.buckets,
            clock,
            timeout_mode=config.timeout_mode,
            max_tree_lifetime=config.max_tree_lifetime,
        )
        # Which roots are ours, and a layout change in progress (issue 29; see layout.py).
        # A joining acker (--join, index >= count) starts outside the layout, as a drained one ends.
        # With --layout-file the last committed layout wins over the flags (layout_file.py).
        self.layout_file = LayoutFile(config.layout_file) if config.layout_file else None
        initial = self._starting_layout(Layout(0, config.shard_count, config.shard_index if config.in_layout else -1))
        self.layout = LayoutMachine(initial)
        self.limits = Limits(max(initial.index, 0), initial.count, config.max_batch, config.replicas)
        # During a change the ledger is asked per operation, ownership checked by the layout (route()).
        self._any_root = Limits(0, 1, config.max_batch, 1)
        self.held = HeldOperations(config.max_held_operations)  # operations on roots still moving here
        self._unsent: list[Chunk] = []  # handoff chunks a cut could not deliver yet (sent again by the next cut)
        self._cut_moved = (0, 0)  # (trees, entries) this change's cut took out
        self._merged_chunks: dict[int, set[int]] = {}  # per old shard: its handoff chunk keys merged
        self._cutting = False
        self.hub = OutcomeHub(
            config.retain_outcomes,
            config.retain_seconds,
            self.incarnation,
            clock,
            subscriber_buffer_bytes=config.subscriber_buffer_bytes,
        )
        self.metrics = AckerMetrics(
            self.ledger.stats,
            self.hub,
            shard_index=self.place[0],
            shard_count=self.place[1],
            engine=config.engine,
        )
        # A restarted replica copies each of its two ranges from a partner before it applies its operations (catchup.py).
        self.catchup = CatchUp.for_shard(
            config.shard_index,
            config.shard_count,
            config.replicas,
            enabled=bool(config.peer_addresses),
            max_held=config.max_held_operations,
        )
        self.metrics.catchup = self.catchup
        self._closing = False
        # Called once at close: each open ApplyStream's way to end itself (see apply_stream).
        self.closing_callbacks: set[Callable[[], None]] = set()

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
    def place(self) -> tuple[int, int]:
        """(shard index, shard count) this acker reports; a drained or joining acker keeps its flag's index."""
        current = self.layout.current
        return (current.index if current.index >= 0 else self.config.shard_index), current.count

    @property
    def pending_trees(self) -> int:
        """Trees started and not yet ended."""
        return self.ledger.pending_trees

    def apply_request(self, data: bytes) -> ColumnarResult:
        """Decode, validate whole and apply serialized ``ApplyRequest`` bytes; route the outcomes (the hot path).

        Raises a :class:`~acker_service.batch.BatchError` that changes nothing,
        also for bytes that are not an ``ApplyRequest``.
        """
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
        if self.catchup.holding:
            return self._apply_catching_up(data)
        # Due trees collect in slices on the ticker, not in Apply's latency; a due
        # tree the batch touches still expires first (exactly one outcome).
        result = self.ledger.apply(data, self.limits, max_expired=0)
        self._applied(result)
        return result

    def _applied(self, result: ColumnarResult) -> None:
        self._settle(result.ended)
        # Not ends, so no latency or outcome metrics: only the spout must know.
        self.hub.publish(result.timeout_resets)
        self.metrics.batch_operations.observe(result.operations)

    def _apply_moving(self, data: bytes) -> ColumnarResult:
        """Apply during a layout change: each operation applies now, is held for its old owner's handoff, or refuses the request.

        The request is validated whole first, and refused whole (nothing applied,
        nothing held) when one root is not served here any more: the client then
        re-routes every operation of it by the next layout, each with its dedup key.
        """
        batch = decode_request(data, self.config.max_batch)
        route = self.layout.route(batch.roots)
        if route.refused >= 0:
            raise WrongShard(self.layout.refusal(int(batch.roots[route.refused])))
        return self._apply_holding(
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

    def _apply_catching_up(self, data: bytes) -> ColumnarResult:
        """Apply while catching up: operations on a copied range apply now, the others wait for their range's copy.

        Validated whole first (a refusal is answered now, nothing held); refused
        whole with UNAVAILABLE when what it would hold passes the bound.
        """
        batch = check_request(data, self.limits)
        return self._apply_holding(
            data, batch, self.catchup.awaited(batch.roots), self.catchup.held, self.limits, self.catchup.refusal
        )

    def _apply_holding(
        self,
        data: bytes,
        batch: Batch,
        source: np.ndarray,
        held: HeldOperations,
        limits: Limits,
        refusal: Callable[[int], str],
    ) -> ColumnarResult:
        """Apply the operations whose ``source`` is -1 now and hold the others per source, in arrival order.

        Nothing is applied or held when the operations to hold pass ``held``'s
        bound: :class:`ApplyHeld` (UNAVAILABLE) carries ``refusal(n)``'s message.
        """
        holding = source >= 0
        n_held = int(holding.sum())
        if not n_held:
            result = self.ledger.apply(data, limits, max_expired=0)
        elif not held.room_for(n_held):
            raise ApplyHeld(refusal(n_held))
        elif n_held < len(batch):
            result = self.ledger.apply(encode_part(batch, ~holding), limits, max_expired=0)
        else:
            result = ColumnarResult(0, 0, 0, OutcomeColumns.empty(), OutcomeColumns.empty())
        # Held after the part applied now: that one could still have been refused (it never is, validated).
        for key in np.unique(source[holding]).tolist():
            mask = source == key
            held.hold(key, encode_part(batch, mask), int(mask.sum()))
        self._applied(result)
        result.held = n_held
        return result

    def advance(self) -> int:
        """Expire every due tree and old retained outcomes at once; return how many trees timed out."""
        timed_out, _ = self.ledger.advance(None)
        self._settle(timed_out)
        self.hub.expire()
        return len(timed_out)

    def advance_slice(self, max_expired: int = EXPIRY_SLICE) -> tuple[int, bool]:
        """Expire at most ``max_expired`` due trees and old retained outcomes.

        Returns how many trees timed out and whether more are due: the caller
        yields to the event loop and calls again while they are.
        """
        timed_out, more = self.ledger.advance(max_expired)
        self._settle(timed_out)
        self.hub.expire()
        return len(timed_out), more

    def _settle(self, ended: OutcomeColumns) -> None:
        """Record and route the outcomes of ended trees, refresh the scrape-time gauges."""
        if len(ended):
            self.metrics.complete_latency.observe_many(ended.latency_seconds())
            self.hub.publish(ended)
        self.metrics.refresh_gauges(self.ledger.pending_trees, self.ledger.orphan_entries)

    async def subscribe(
        self, spout: str, *, incarnation: int, after_sequence: int, limit: int
    ) -> AsyncGenerator[OutcomeChunk, None]:
        """Yield the spout's retained outcomes after the resume position, then live ones, ``limit`` at a time.

        Ends by raising :class:`SubscribeRefused`: a bad name, a newer
        subscription of the same spout, or shutdown (after everything retained
        was yielded). Close the iterator (``contextlib.aclosing``) when the
        stream ends early, so the subscription is released at once.
        """
        try:
            check_spout_name(spout)
        except ValueError as exc:
            raise BadSpoutName(f"{exc}; name the spout used in INIT operations") from None
        if self._closing:
            raise ShardClosing("this acker is shutting down; subscribe again later")
        bound = self.config.max_subscriptions
        if bound and self.hub.subscribers >= bound and not self.hub.is_subscribed(spout):
            # A takeover replaces a stream and is allowed; a new spout would exceed the bound.
            raise TooManySubscriptions(
                f"this acker has {self.hub.subscribers} open subscriptions, its maximum (--max-subscriptions "
                f"{bound}); close unused spouts or raise the limit"
            )
        wakeup = asyncio.Event()
        subscription = self.hub.subscribe(
            spout, incarnation=incarnation, after_sequence=after_sequence, wake=wakeup.set
        )
        try:
            while True:
                if subscription.superseded:
                    raise Superseded(
                        f"a newer Subscribe for spout {clip(spout)} took over; one subscription per spout per acker"
                    )
                chunk = self.hub.take(subscription, limit)
                if chunk is not None:
                    yield chunk
                elif self._closing:
                    # Everything retained was sent; the spout resumes from its position elsewhere.
                    raise ShardClosing("this acker is shutting down; resubscribe with your position")
                else:
                    wakeup.clear()
                    await wakeup.wait()
        finally:
            self.hub.unsubscribe(subscription)

    # -- operating a running shard (issue 21) ------------------------------------

    def inspect(self, roots: list[int], oldest: int) -> tuple[list[TreeInfo], list[TreeInfo]]:
        """The state of ``roots`` and the ``oldest`` oldest pending trees; a BatchError refuses bad input."""
        check_roots(
            roots,
            shard_index=self.config.shard_index,
            shard_count=self.config.shard_count,
            replicas=self.config.replicas,
        )
        check_oldest(oldest)
        return self.ledger.inspect(roots), self.ledger.oldest(oldest) if oldest else []

    def force_fail(self, roots: list[int]) -> OutcomeColumns:
        """End the pending trees among ``roots`` FAILED now and route the outcomes; a BatchError refuses bad input."""
        check_roots(
            roots,
            shard_index=self.config.shard_index,
            shard_count=self.config.shard_count,
            replicas=self.config.replicas,
        )
        ended = self.ledger.force_fail(roots)
        self._settle(ended)
        return ended

    def force_fail_spout(self, spout: str) -> OutcomeColumns:
        """End every pending tree of ``spout`` FAILED now and route the outcomes."""
        try:
            check_spout_name(spout)
        except ValueError as exc:
            raise BadSpoutName(str(exc)) from None
        ended = self.ledger.force_fail_spout(spout)
        self._settle(ended)
        return ended

    # -- layout changes (issue 29): prepare, cut, commit, and the handoffs between ackers --

    def prepare_layout(self, layout: Layout, previous: Layout | None = None) -> None:
        """Learn this acker's place in the next layout and in the one left (LayoutRefused: nothing changed)."""
        if self.config.replicas > 1:
            raise LayoutRefused(
                "resharding with --replicas 2 is not supported yet: a follower's copies would have to move too; "
                "nothing changed"
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
            self._unsent, self._cut_moved = [], (0, 0)
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
            if self.layout.state == PREPARED:
                # One event-loop step: the entries leave and their roots are refused from now on,
                # so no update lands here after its entry left (docs/acker-semantics.md).
                moved = self.ledger.export_moving(target.count, target.index)
                self.layout.mark_cut()
                self._settle(OutcomeColumns.empty())  # refresh the pending gauge
                source = self.layout.previous.index if self.layout.previous else -1
                if source >= 0:  # an acker new in this layout was no old owner: it hands nothing over
                    # Off the event loop (the ledger is not touched): Apply goes on meanwhile.
                    self._unsent = await asyncio.to_thread(plan_handoffs, moved, target, source)
                self._cut_moved = (moved.trees, len(moved))
                self.layout.count_moved(*self._cut_moved)
            self._unsent = await send_handoffs(self._unsent, target, metadata, peer_security(self.config))
        finally:
            self._cutting = False
        if self._unsent:
            waiting = sum(len(c.entries) for c in self._unsent)
            raise HandoffFailed(
                f"{len(self._unsent)} handoffs ({waiting} moved entries) could not reach their new owners yet; "
                "they are kept here: call CutLayout again (acker-ctl reshard again) once every acker of the new "
                "layout is reachable"
            )
        return self._cut_moved

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
        self._settle(self.ledger.import_entries(moved))
        merged.add(key)
        complete = len(merged) >= chunks
        if complete:
            self.layout.source_merged(source)
        else:
            self.layout.chunk_merged(source, moved.roots, manifest)
        self._release(source, complete)
        return len(moved)

    def _release(self, source: int, complete: bool) -> None:
        """Apply what was held for old owner ``source``'s roots whose entries are here (all, once ``complete``)."""
        for request in self.held.release(source):
            try:
                if complete:
                    self._applied(self.ledger.apply(request, self._any_root, max_expired=0))
                    continue
                batch = decode_request(request, self.config.max_batch)
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
        n, i = self.config.shard_count, self.config.shard_index
        if shard_count != n or not 0 <= range_index < n:
            raise InvalidBatch(
                f"snapshot of range {range_index} of {shard_count} shards asked, but this cluster has {n} shards "
                f"(ranges 0..{n - 1}); ask with this acker's shard count; nothing was copied"
            )
        if self.config.replicas < 2:
            raise WrongShard("this acker runs with --replicas 1: it keeps no partner's range; nothing was copied")
        if range_index not in (i, (i - 1) % n):
            raise WrongShard(
                f"shard {i} keeps ranges {i} and {(i - 1) % n}, not {range_index}; ask shard {range_index} "
                f"or {(range_index + 1) % n}; nothing was copied"
            )
        if self.catchup.lost(range_index):
            return None
        moved = self.ledger.export_snapshot(n, range_index)
        self._settle(OutcomeColumns.empty())
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
        held = self.catchup.installed(range_index, len(entries), entries.trees, moved is None)
        for data in held or ():
            try:
                result = self.ledger.apply(data, self.limits, max_expired=0)
            except BatchError as exc:  # validated when held: only a changed layout could refuse it now
                log.error("a held Apply request could not be applied after its range's copy: %s", exc)
                continue
            self._applied(result)
        return not self.catchup.holding

    def tree_ages(self) -> tuple[list[int], float, float]:
        """Pending trees counted by age over :data:`~acker_service.operate.AGE_BUCKETS`, the age sum, and the oldest's age.

        The oldest age is 0 with nothing pending. Both are counted here, at a
        metrics scrape, never per operation.
        """
        counts, total = self.ledger.age_histogram(AGE_BUCKETS)
        oldest = self.ledger.oldest(1)
        return counts, total, oldest[0].age_seconds if oldest else 0.0

    def close(self) -> None:
        """End every subscription once it has yielded what is retained, and every ApplyStream (shutdown)."""
        self._closing = True
        self.hub.wake_all()
        for callback in list(self.closing_callbacks):
            callback()

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called (shutdown)."""
        return self._closing
