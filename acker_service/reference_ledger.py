"""The reference ledger: Storm's XOR tree tracking over a RotatingMap, in plain Python, with no I/O.

This is the executable model of the acker-semantics spec: the native ledger
(:mod:`acker_service.native_ledger`, the server's default engine) must agree with
it on every outcome and counter, which a differential test checks. It also
serves (``--engine reference``) where the native extension cannot be built.

One ``ReferenceLedger`` holds the pending trees of one shard. It implements the
:class:`~acker_service.ledger.Ledger` contract and converts at its own edge:
request bytes are decoded with protobuf into a :class:`~acker_service.batch.Batch`
and validated whole, the inner loop produces one :class:`Resolution` per ended
tree, and those become :class:`~acker_service.outcome_columns.OutcomeColumns` on
the way out. It rotates its RotatingMap on the injected monotonic clock. Each
rule cites the reason it exists; the full contract is the project's
acker-semantics spec.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from acker_protocol.wire import OpKind, Outcome

from .batch import Batch, check_request
from .handoff import MovedEntries, merge_keys, owned
from .ledger import LedgerStats, Limits
from .outcome_columns import ColumnarResult, OutcomeColumns, Resolution
from .rotating_map import RotatingMap
from .tree_info import TIMEOUT_MODES, TreeInfo, TreeStatus, check_timeout_rules

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = ["ReferenceLedger", "LedgerStats", "Resolution", "BatchResult"]

Clock = Callable[[], float]

_INIT, _ACK, _FAIL, _RESET = (int(k) for k in OpKind)
_ACKED, _FAILED, _RESET_OUTCOME = Outcome.ACKED, Outcome.FAILED, Outcome.TIMEOUT_RESET


class _Entry:
    """Per-root state: a constant size whatever the tree's size (dedup keys aside)."""

    __slots__ = ("val", "spout", "failed", "started", "dedup", "resets", "outlived")

    def __init__(self, started: float) -> None:
        self.val = 0
        self.spout: str | None = None  # unknown until init: an ack may overtake its init
        self.failed = False
        self.started = started
        # Dedup keys applied to this tree: None, one key as a plain int (the
        # common case, one client batch key: an int is far smaller than a set), or a set.
        self.dedup: int | set[int] | None = None
        self.resets = 0  # RESET_TIMEOUTs applied (Inspect shows it)
        # Set when the entry becomes due: whether it had reached the lifetime cap at that rotation.
        self.outlived = False


@dataclass
class BatchResult:
    """What one batch did inside the reference engine (before its edge turns it into columns), with the trees it ended (and any that expired first).

    ``timeout_resets`` lists the trees with a known spout that a RESET_TIMEOUT
    gave a fresh timeout (outcome ``TIMEOUT_RESET``, not an end): the spout must
    hear of them, or its own backstop would give up on a tree the acker keeps.
    """

    applied: int
    deduplicated: int
    ignored: int
    resolutions: list[Resolution]
    timeout_resets: list[Resolution] = field(default_factory=list)


class ReferenceLedger:
    """Pending tuple trees of one shard, expiring after ``message_timeout`` seconds.

    >>> import numpy as np
    >>> from acker_protocol.packed import encode_apply_request
    >>> from acker_service.ledger import UNLIMITED
    >>> ledger = ReferenceLedger(message_timeout=30.0, clock=lambda: 0.0)
    >>> request = encode_apply_request(np.array([1, 2]), np.array([5, 5]), np.array([9, 9]), spouts=["s"])
    >>> ledger.apply(request, UNLIMITED).ended.resolutions()
    [Resolution(spout='s', root=5, outcome=<Outcome.ACKED: 1>, latency_seconds=0.0)]
    """

    engine: ClassVar[str] = "reference"

    def __init__(
        self,
        message_timeout: float,
        buckets: int = 3,
        clock: Clock = time.monotonic,
        *,
        timeout_mode: str = "fixed",
        max_tree_lifetime: float = 0.0,
    ) -> None:
        if not message_timeout > 0:  # also refuses NaN, which would make every comparison false
            raise ValueError(f"message_timeout must be positive, got {message_timeout}")
        self.message_timeout = float(message_timeout)
        self._clock = clock
        start = clock()
        # Start times in whole microseconds since here, as the native core keeps them:
        # the lifetime cap and the ages compare the same integers in both engines.
        self._epoch = start
        # Only pending trees are kept, as in Storm: a message for a tree that
        # already ended (a Spark re-run after completion) cannot be told from an
        # ack overtaking its init, so it makes an entry without a spout that
        # expires as an orphan. Remembering ended roots instead would cost memory
        # for every tree for a whole timeout window, i.e. scale with throughput.
        self._pending: RotatingMap[int, _Entry] = RotatingMap(buckets)
        self._period = self.message_timeout / (buckets - 1)
        self._next_rotation = start + self._period
        # Buckets a rotation detached and whose entries have not all been expired
        # yet (sliced expiry, see ``advance_some``). Their trees are already due:
        # an operation that touches one expires it first.
        self._draining: deque[dict[int, _Entry]] = deque()
        self._open_trees = 0  # entries whose init was applied
        self.stats = LedgerStats()
        check_timeout_rules(timeout_mode, max_tree_lifetime, self._period)
        self.timeout_mode = timeout_mode
        self.max_tree_lifetime = float(max_tree_lifetime)
        self._progress = timeout_mode == TIMEOUT_MODES[1]
        self._cap_us = _micros(max_tree_lifetime)  # 0: no cap
        self._rotated_at_us = 0  # ledger time of the last rotation: the cap is judged there

    @property
    def buckets(self) -> int:
        """Number of RotatingMap buckets."""
        return self._pending.bucket_count

    @property
    def rotation_period(self) -> float:
        """Seconds between rotations, ``T / (b - 1)``."""
        return self._period

    @property
    def pending_trees(self) -> int:
        """Trees whose init was applied and that have no outcome yet."""
        return self._open_trees

    @property
    def orphan_entries(self) -> int:
        """Entries created by acks or fails whose init has not (yet) arrived."""
        return len(self._pending) + sum(map(len, self._draining)) - self._open_trees

    def apply(self, request: bytes, limits: Limits, max_expired: int | None = None) -> ColumnarResult:
        """Decode with protobuf, validate whole, then apply (the :class:`~acker_service.ledger.Ledger` contract).

        Raises a :class:`~acker_service.batch.BatchError` and changes nothing on refusal.
        """
        batch = check_request(request, limits)
        result = self._apply_batch(batch, max_expired)
        return ColumnarResult(
            result.applied,
            result.deduplicated,
            result.ignored,
            OutcomeColumns.from_resolutions(result.resolutions),
            OutcomeColumns.from_resolutions(result.timeout_resets),
        )

    def advance(self, max_expired: int | None = None) -> tuple[OutcomeColumns, bool]:
        """Rotate as due, then collect at most ``max_expired`` due entries (None: all), as columns."""
        resolutions, more = self._advance_some(max_expired)
        return OutcomeColumns.from_resolutions(resolutions), more

    def _apply_batch(self, batch: Batch, max_expired: int | None = None) -> BatchResult:
        """Apply a batch that :func:`~acker_service.batch.validate_batch` accepted.

        This is the hot path, so the per-operation rules are inlined in one
        loop over plain Python ints (the numpy arrays are converted once).
        Trees that are due collect first, at most ``max_expired`` of them (all
        by default); a due tree the batch touches expires before the batch
        applies to it, so a sliced expiry never changes what a client sees.
        """
        resolutions, _ = self._advance_some(max_expired)
        now = self._clock()
        stats = self.stats
        n = len(batch.kinds)
        spouts = batch.spouts  # one str object per name, shared by all its entries
        op_spouts: Iterable[str | None]
        if len(batch.spout_index):
            op_spouts = [spouts[i] if i < len(spouts) else None for i in batch.spout_index.tolist()]
        else:
            op_spouts = repeat(spouts[0] if spouts else None, n)
        keys = batch.dedup_keys.tolist() if len(batch.dedup_keys) else repeat(0, n)
        # No rotation happens inside a batch, so the bucket lists stay valid.
        nursery, *older = self._pending.live_buckets()
        draining = self._draining
        timed_out = 0
        applied = deduplicated = ignored = 0
        inits = acks = fails = resets = dup_inits = acked = failed = 0
        timeout_resets: list[Resolution] = []
        progress = self._progress
        for kind, root, value, key, spout in zip(
            batch.kinds.tolist(), batch.roots.tolist(), batch.values.tolist(), keys, op_spouts
        ):
            home = nursery
            entry = nursery.get(root)
            if entry is None:
                for home in older:
                    entry = home.get(root)
                    if entry is not None:
                        break
                else:
                    if draining:
                        # Due, not collected yet: it expires now, as the scan would have.
                        timed_out += self._expire_touched(root, now, resolutions)
                    if kind == _RESET:
                        # Nothing to keep alive; an entry would only be an orphan.
                        ignored += 1
                        continue
                    # An ack or fail may overtake its init: create the entry now.
                    entry = _Entry(now)
                    home = nursery
                    nursery[root] = entry
            if kind == _ACK:
                if key:
                    seen = entry.dedup
                    if seen is None:
                        entry.dedup = key
                    elif seen == key or (isinstance(seen, set) and key in seen):
                        # A re-run Spark task or a re-sent client batch: the first copy counted.
                        deduplicated += 1
                        continue
                    elif isinstance(seen, set):
                        seen.add(key)
                    else:
                        entry.dedup = {seen, key}
                entry.val ^= value
                acks += 1
                if progress and home is not nursery:
                    # Progress mode: an applied ack is progress, the tree gets a fresh timeout.
                    del home[root]
                    nursery[root] = entry
                    home = nursery
            elif kind == _INIT:
                if entry.spout is not None:
                    # Init is set-once: a retried init must not XOR itself back
                    # out and let the tree reach 0 (a false ack).
                    dup_inits += 1
                    ignored += 1
                    continue
                entry.val ^= value
                entry.spout = spout
                entry.started = now  # latency is measured from init
                inits += 1
            elif kind == _FAIL:
                entry.failed = True
                fails += 1
            else:
                # reset_timeout: back to the nursery, a fresh timeout for slow work.
                self._pending.put(root, entry)
                entry.resets += 1
                resets += 1
                applied += 1
                if entry.spout is not None:
                    timeout_resets.append(Resolution(entry.spout, root, _RESET_OUTCOME, now - entry.started))
                continue
            applied += 1
            if entry.spout is not None:
                # Storm's order: a zero checksum wins over the failed flag.
                if entry.val == 0:
                    outcome = _ACKED
                    acked += 1
                elif entry.failed:
                    outcome = _FAILED
                    failed += 1
                else:
                    continue
                del home[root]
                resolutions.append(Resolution(entry.spout, root, outcome, now - entry.started))
        self._open_trees += inits - acked - failed - timed_out
        stats.timed_out += timed_out
        stats.acked += acked
        stats.failed += failed
        stats.inits += inits
        stats.acks += acks
        stats.fails += fails
        stats.resets += resets
        stats.duplicate_inits += dup_inits
        stats.deduplicated += deduplicated
        return BatchResult(applied, deduplicated, ignored, resolutions, timeout_resets)

    def _advance_some(self, max_expired: int | None) -> tuple[list[Resolution], bool]:
        """Rotate as due, then expire at most ``max_expired`` due entries (None: all).

        Entries without a spout (acks whose init never came) are dropped and
        counted as orphaned, as the spec says.

        Returns the trees that timed out and whether more are due. A rotation
        detaches its expired bucket at once, so the expiry window is the same
        however the expiry is sliced; only collecting the entries is spread
        over calls (the server yields to its event loop in between).
        """
        now = self._clock()
        resolutions: list[Resolution] = []
        if now >= self._next_rotation:
            # A long stall (a suspended host) may owe many rotations; count them
            # instead of looping, since more than `buckets` of them change nothing.
            due = int((now - self._next_rotation) // self._period) + 1
            self._next_rotation += due * self._period
            detached = []
            for _ in range(min(due, self.buckets)):
                expired = self._pending.rotate()
                if expired:
                    detached.append(expired)
            self._draining.extend(detached)
            self._rotated_at_us = self._micros(now)
            if self._cap_us:
                # Judged now, at the rotation that made them due, however late they are collected.
                for bucket in detached:
                    for entry in bucket.values():
                        entry.outlived = self._outlived(entry)
                self._detach_outlived()
        budget = -1 if max_expired is None else max_expired
        draining = self._draining
        while draining and budget != 0:
            bucket = draining[0]
            taken = self._expire(bucket, budget, now, resolutions)
            if budget > 0:
                budget -= taken
            if not bucket:
                draining.popleft()
        return resolutions, bool(draining)

    def _expire(self, bucket: dict[int, _Entry], limit: int, now: float, resolutions: list[Resolution]) -> int:
        """Remove up to ``limit`` entries (-1: all) from a detached bucket; return how many."""
        if limit < 0 or limit >= len(bucket):
            items = list(bucket.items())
            bucket.clear()
        else:
            items = [bucket.popitem() for _ in range(limit)]
        stats = self.stats
        timed_out = 0
        for root, entry in items:
            if entry.spout is None:
                stats.orphaned += 1
                continue
            timed_out += 1
            resolutions.append(
                Resolution(entry.spout, root, self._timeout_outcome(entry), max(0.0, now - entry.started))
            )
        self._open_trees -= timed_out
        stats.timed_out += timed_out
        return len(items)

    def _expire_touched(self, root: int, now: float, resolutions: list[Resolution]) -> int:
        """Expire ``root`` if a detached bucket still holds it; return 1 if it was a tree (0: absent or orphan)."""
        for bucket in self._draining:
            entry = bucket.pop(root, None)
            if entry is not None:
                if entry.spout is None:
                    self.stats.orphaned += 1
                    return 0
                outcome = self._timeout_outcome(entry)
                resolutions.append(Resolution(entry.spout, root, outcome, max(0.0, now - entry.started)))
                return 1
        return 0

    def seconds_until_rotation(self) -> float:
        """Seconds until the next rotation is due (never negative)."""
        return max(0.0, self._next_rotation - self._clock())

    def pending_roots(self) -> list[int]:
        """Root ids of all entries (for tests and diagnostics; not the hot path)."""
        roots = list(self._pending)
        for bucket in self._draining:
            roots.extend(bucket)
        return roots

    # -- operating a running ledger: the lifetime cap, inspecting, failing from outside --

    def _micros(self, t: float) -> int:
        """Whole microseconds from the ledger's creation to clock time ``t`` (the native core's rounding)."""
        return _micros(t - self._epoch)

    def _outlived(self, entry: _Entry) -> bool:
        """Whether the entry reached the lifetime cap as of the last rotation."""
        return bool(self._cap_us) and self._rotated_at_us - self._micros(entry.started) >= self._cap_us

    def _timeout_outcome(self, entry: _Entry) -> Outcome:
        """TIMED_OUT, or LIFETIME_EXCEEDED for a tree that had reached the cap when it became due (counted)."""
        if entry.outlived:
            self.stats.outlived += 1
            return Outcome.LIFETIME_EXCEEDED
        return Outcome.TIMED_OUT

    def _detach_outlived(self) -> None:
        """At a rotation: every live entry that reached the cap becomes due, like an expired bucket."""
        outlived: dict[int, _Entry] = {}
        for bucket in self._pending.live_buckets():
            found = [root for root, entry in bucket.items() if self._outlived(entry)]
            for root in found:
                entry = outlived[root] = bucket.pop(root)
                entry.outlived = True
        if outlived:
            self._draining.append(outlived)

    def _info(self, root: int, entry: _Entry | None, due: bool, now_us: int) -> TreeInfo:
        if entry is None:
            return TreeInfo(root, TreeStatus.ABSENT, None, 0.0, False, 0, 0)
        if due:
            status = TreeStatus.EXPIRING
        else:
            status = TreeStatus.AWAITING_INIT if entry.spout is None else TreeStatus.PENDING
        seen = entry.dedup
        keys = 0 if seen is None else len(seen) if isinstance(seen, set) else 1
        age = (now_us - self._micros(entry.started)) / 1e6
        return TreeInfo(root, status, entry.spout, age, entry.failed, entry.resets, keys)

    def inspect(self, roots: Sequence[int]) -> list[TreeInfo]:
        """The state of each root now (read-only: nothing rotates or expires here)."""
        now_us = self._micros(self._clock())
        infos = []
        for root in roots:
            entry = self._pending.get(root)
            due = False
            if entry is None:
                for bucket in self._draining:
                    entry = bucket.get(root)
                    if entry is not None:
                        due = True
                        break
            infos.append(self._info(root, entry, due, now_us))
        return infos

    def _pending_entries(self) -> Iterable[tuple[int, _Entry]]:
        for bucket in self._pending.live_buckets():
            for root, entry in bucket.items():
                if entry.spout is not None:
                    yield root, entry

    def oldest(self, k: int) -> list[TreeInfo]:
        """The ``k`` oldest pending trees (by time since init; ties by root), oldest first."""
        now_us = self._micros(self._clock())
        found = heapq.nlargest(k, self._pending_entries(), key=lambda item: (-self._micros(item[1].started), -item[0]))
        return [self._info(root, entry, False, now_us) for root, entry in found]

    def age_histogram(self, bounds: Sequence[float]) -> tuple[list[int], float]:
        """Pending trees by age: a count per bound (ages ``<=`` it, above the previous), then above all; the age sum."""
        now_us = self._micros(self._clock())
        bounds_us = [_micros(b) for b in bounds]
        counts = [0] * (len(bounds_us) + 1)
        total = 0
        for _, entry in self._pending_entries():
            age = now_us - self._micros(entry.started)
            counts[bisect_left(bounds_us, age)] += 1
            total += age
        return counts, total / 1e6

    def _fail_now(self, root: int, entry: _Entry, now: float, resolutions: list[Resolution]) -> None:
        assert entry.spout is not None
        self._open_trees -= 1
        self.stats.failed += 1
        self.stats.force_failed += 1
        resolutions.append(Resolution(entry.spout, root, _FAILED, now - entry.started))

    def force_fail(self, roots: Sequence[int]) -> OutcomeColumns:
        """Fail the pending trees among ``roots`` now (FAILED to their spouts); a due one times out instead.

        Roots that are absent or still awaiting their init are left alone.
        """
        resolutions, _ = self._advance_some(0)  # rotate as due, as a batch would; collect nothing
        now = self._clock()
        for root in roots:
            for bucket in self._pending.live_buckets():
                entry = bucket.get(root)
                if entry is not None:
                    if entry.spout is not None:
                        del bucket[root]
                        self._fail_now(root, entry, now, resolutions)
                    break
            else:
                timed_out = self._expire_touched(root, now, resolutions)
                self._open_trees -= timed_out
                self.stats.timed_out += timed_out
        return OutcomeColumns.from_resolutions(resolutions)

    def force_fail_spout(self, spout: str) -> OutcomeColumns:
        """Fail every pending tree of ``spout`` now; its trees already due time out instead."""
        resolutions, _ = self._advance_some(0)
        now = self._clock()
        for bucket in self._pending.live_buckets():
            for root in [root for root, entry in bucket.items() if entry.spout == spout]:
                self._fail_now(root, bucket.pop(root), now, resolutions)
        for bucket in self._draining:
            for root in [root for root, entry in bucket.items() if entry.spout == spout]:
                timed_out = self._expire_touched(root, now, resolutions)
                self._open_trees -= timed_out
                self.stats.timed_out += timed_out
        return OutcomeColumns.from_resolutions(resolutions)

    # -- moving trees between ackers (layout changes, catch-up): see acker_service.handoff --

    def export_moving(self, shard_count: int, keep_index: int) -> MovedEntries:
        """Remove and return the live entries whose root is not ``keep_index``'s under ``shard_count`` shards (-1: all).

        Rotates as due first (collecting nothing); due entries stay and time out
        here, as they would have without the move.
        """
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        return self._export(lambda root: not owned(root, shard_count, keep_index))

    def moving_roots(self, shard_count: int, keep_index: int) -> tuple[np.ndarray, np.ndarray]:
        """The roots and ages (microseconds) of the live entries :meth:`export_moving` would take out; nothing removed."""
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        self._advance_some(0)
        now_us = self._micros(self._clock())
        roots, ages = [], []
        for bucket in self._pending.live_buckets():
            for root, entry in bucket.items():
                if not owned(root, shard_count, keep_index):
                    roots.append(root)
                    ages.append(max(0, now_us - self._micros(entry.started)))
        return np.asarray(roots, np.uint64), np.asarray(ages, np.uint64)

    def export_roots(self, roots: np.ndarray, last: bool = True) -> MovedEntries:
        """Remove and return the live entries among ``roots`` (one slice of a cut; absent and due ones are skipped)."""
        wanted = set(np.asarray(roots, np.uint64).tolist())
        return self._export(wanted.__contains__)

    def _export(self, leaving: Callable[[int], bool]) -> MovedEntries:
        """Remove and return the live entries whose root ``leaving`` names, after rotating as due."""
        self._advance_some(0)
        now_us = self._micros(self._clock())
        names: dict[str, int] = {}
        roots, values, spout_index, ages, gens, failed, resets, key_counts, keys = ([] for _ in range(9))
        trees = 0
        for generation, bucket in enumerate(self._pending.live_buckets()):
            for root in [r for r in bucket if leaving(r)]:
                entry = bucket.pop(root)
                roots.append(root)
                values.append(entry.val)
                if entry.spout is None:
                    spout_index.append(-1)
                else:
                    spout_index.append(names.setdefault(entry.spout, len(names)))
                    trees += 1
                ages.append(max(0, now_us - self._micros(entry.started)))
                gens.append(generation)
                failed.append(entry.failed)
                resets.append(entry.resets)
                seen = entry.dedup
                entry_keys = [] if seen is None else sorted(seen) if isinstance(seen, set) else [seen]
                key_counts.append(len(entry_keys))
                keys.extend(entry_keys)
        self._open_trees -= trees
        self.stats.moved_out += trees
        a = np.asarray
        return MovedEntries(
            a(roots, np.uint64),
            a(values, np.uint64),
            list(names),
            a(spout_index, np.int32),
            a(ages, np.uint64),
            a(gens, np.uint8),
            a(failed, np.bool_),
            a(resets, np.uint32),
            a(key_counts, np.uint32),
            a(keys, np.uint64),
        )

    def export_snapshot(self, shard_count: int, index: int) -> MovedEntries:
        """Copy the live entries whose root is ``index``'s under ``shard_count`` shards; every entry stays here.

        A restarted replica's catch-up (docs/acker-semantics.md, "Replicated
        trees"): the partner keeps serving the range, so nothing is removed and
        no counter moves. Rotates as due first (collecting nothing); due entries
        are not copied: they time out here.
        """
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        if not 0 <= index < shard_count:
            raise ValueError(f"index must be a shard of the {shard_count}, got {index}")
        self._advance_some(0)
        now_us = self._micros(self._clock())
        names: dict[str, int] = {}
        roots, values, spout_index, ages, gens, failed, resets, key_counts, keys = ([] for _ in range(9))
        for generation, bucket in enumerate(self._pending.live_buckets()):
            for root, entry in bucket.items():
                if not owned(root, shard_count, index):
                    continue
                roots.append(root)
                values.append(entry.val)
                spout_index.append(-1 if entry.spout is None else names.setdefault(entry.spout, len(names)))
                ages.append(max(0, now_us - self._micros(entry.started)))
                gens.append(generation)
                failed.append(entry.failed)
                resets.append(entry.resets)
                seen = entry.dedup
                entry_keys = [] if seen is None else sorted(seen) if isinstance(seen, set) else [seen]
                key_counts.append(len(entry_keys))
                keys.extend(entry_keys)
        a = np.asarray
        return MovedEntries(
            a(roots, np.uint64),
            a(values, np.uint64),
            list(names),
            a(spout_index, np.int32),
            a(ages, np.uint64),
            a(gens, np.uint8),
            a(failed, np.bool_),
            a(resets, np.uint32),
            a(key_counts, np.uint32),
            a(keys, np.uint64),
        )

    def import_entries(self, moved: MovedEntries) -> OutcomeColumns:
        """Merge moved entries in by XOR (failed OR, earliest start, keys united); the trees that merging ended.

        An entry this ledger also holds adds up with it (the two hold disjoint
        updates of one tree); a due one here expires first, as an operation on
        it would. A merged tree whose checksum reached 0 ends ACKED (else a
        failed one ends FAILED), Storm's order.
        """
        resolutions, _ = self._advance_some(0)
        now = self._clock()
        now_us = self._micros(now)
        buckets = self._pending.live_buckets()
        last = len(buckets) - 1
        stats = self.stats
        offsets = [0, *np.cumsum(moved.key_counts, dtype=np.int64).tolist()]
        all_keys = moved.keys.tolist()
        for i, (root, value, s, age, gen, failed, resets) in enumerate(
            zip(
                moved.roots.tolist(),
                moved.values.tolist(),
                moved.spout_index.tolist(),
                moved.ages_us.tolist(),
                moved.generations.tolist(),
                moved.failed.tolist(),
                moved.resets.tolist(),
            )
        ):
            spout = moved.spouts[s] if s >= 0 else None
            started = self._epoch + (now_us - age) / 1e6
            gen = min(gen, last)
            home_index = next((k for k, b in enumerate(buckets) if root in b), None)
            if home_index is None:
                if self._draining:
                    timed_out = self._expire_touched(root, now, resolutions)
                    self._open_trees -= timed_out
                    stats.timed_out += timed_out
                entry = _Entry(started)
                home_index = gen
                buckets[gen][root] = entry
            else:
                entry = buckets[home_index][root]
                if gen < home_index:
                    # The fresher of the two timeouts: the tree was touched then.
                    del buckets[home_index][root]
                    buckets[gen][root] = entry
                    home_index = gen
                if (entry.spout is None) == (spout is None):
                    entry.started = min(entry.started, started)
                elif spout is not None:
                    entry.started = started  # latency is measured from init
            entry.val ^= value
            entry.failed = entry.failed or failed
            entry.resets += resets
            entry.dedup = merge_keys(entry.dedup, all_keys[offsets[i] : offsets[i + 1]])
            if spout is not None:
                stats.moved_in += 1
                if entry.spout is None:
                    entry.spout = spout
                    self._open_trees += 1
            if entry.spout is not None and (entry.val == 0 or entry.failed):
                # Storm's order: a zero checksum wins over the failed flag.
                outcome = _ACKED if entry.val == 0 else _FAILED
                if outcome == _ACKED:
                    stats.acked += 1
                else:
                    stats.failed += 1
                del buckets[home_index][root]
                self._open_trees -= 1
                resolutions.append(Resolution(entry.spout, root, outcome, now - entry.started))
        return OutcomeColumns.from_resolutions(resolutions)


def _micros(seconds: float) -> int:
    """Seconds as whole microseconds, rounded half away from zero as Rust's ``f64::round``."""
    return int(math.copysign(math.floor(abs(seconds) * 1e6 + 0.5), seconds))


if TYPE_CHECKING:
    _: type[Ledger] = ReferenceLedger  # mypy: the engine implements the whole contract
