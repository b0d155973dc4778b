"""The native ledger: the Rust core (``acker_service._native``) behind the :class:`~acker_service.ledger.Ledger` contract.

Serialized ``ApplyRequest`` bytes go into the core as they arrive from gRPC;
they are decoded, validated and applied in Rust with the GIL released, and the
outcomes come back as numpy arrays that took over the Rust vectors. No Python
object is made per operation or per outcome.

The clock stays on the Python side: the core is given "now" on every call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ._native import NativeCore
from .handoff import MovedEntries
from .ledger import LedgerStats, Limits
from .outcome_columns import ColumnarResult, OutcomeColumns
from .tree_info import TIMEOUT_MODES, TreeInfo, TreeStatus, check_timeout_rules

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = ["NativeLedger"]

Clock = Callable[[], float]


def _columns(raw) -> OutcomeColumns:
    return OutcomeColumns(*raw)


class NativeLedger:
    """Pending tuple trees of one shard in the native core, expiring after ``message_timeout`` seconds.

    >>> import numpy as np
    >>> from acker_protocol.packed import encode_apply_request
    >>> from acker_service.ledger import UNLIMITED
    >>> ledger = NativeLedger(message_timeout=30.0, clock=lambda: 0.0)
    >>> request = encode_apply_request(np.array([1, 2]), np.array([5, 5]), np.array([9, 9]), spouts=["s"])
    >>> ledger.apply(request, UNLIMITED).ended.resolutions()
    [Resolution(spout='s', root=5, outcome=<Outcome.ACKED: 1>, latency_seconds=0.0)]
    """

    engine: ClassVar[str] = "native"

    def __init__(
        self,
        message_timeout: float,
        buckets: int = 3,
        clock: Clock = time.monotonic,
        *,
        timeout_mode: str = "fixed",
        max_tree_lifetime: float = 0.0,
    ) -> None:
        if not message_timeout > 0:
            raise ValueError(f"message_timeout must be positive, got {message_timeout}")
        if buckets < 2:
            raise ValueError(f"a RotatingMap needs at least 2 buckets, got {buckets}")
        self.message_timeout = float(message_timeout)
        self._clock = clock
        # The seed keeps clients from aiming many roots at one slot of the hash table.
        self._core = NativeCore(self.message_timeout, int(buckets), clock(), secrets.randbits(64))
        # One object for the life of the ledger: the metrics collector keeps a reference
        # and reads its plain ints from another thread; _sync refreshes them in place.
        self.stats = LedgerStats()
        check_timeout_rules(timeout_mode, max_tree_lifetime, self.message_timeout / (buckets - 1))
        self._core.set_timeout_rules(timeout_mode == TIMEOUT_MODES[1], float(max_tree_lifetime))
        self.timeout_mode = timeout_mode
        self.max_tree_lifetime = float(max_tree_lifetime)

    def _sync(self) -> None:
        # The core names its counters (LedgerStats' fields), so no field order is shared across the binding.
        self.stats.__dict__.update(self._core.stats())

    @property
    def buckets(self) -> int:
        """Number of rotation buckets."""
        return int(self._core.buckets)

    @property
    def rotation_period(self) -> float:
        """Seconds between rotations, ``T / (b - 1)``."""
        return float(self._core.rotation_period)

    @property
    def pending_trees(self) -> int:
        """Trees whose init was applied and that have no outcome yet."""
        return int(self._core.pending_trees)

    @property
    def orphan_entries(self) -> int:
        """Entries created by acks or fails whose init has not (yet) arrived."""
        return int(self._core.orphan_entries)

    @property
    def table_slots(self) -> int:
        """Slots of the native hash table (24 bytes each): for memory diagnostics, not in the contract."""
        return int(self._core.capacity)

    def apply(self, request: bytes, limits: Limits, max_expired: int | None = None) -> ColumnarResult:
        """Decode, validate and apply serialized ``ApplyRequest`` bytes in Rust (the contract's ``apply``).

        Raises :class:`~acker_service.batch.InvalidBatch` (also for bytes that do not
        decode), :class:`~acker_service.batch.BatchTooLarge` or
        :class:`~acker_service.batch.WrongShard`; a refused request changes nothing.
        """
        applied, deduplicated, ignored, ended, resets = self._core.apply_request(
            request,
            self._clock(),
            limits.shard_index,
            limits.shard_count,
            limits.max_batch,
            max_expired,
            limits.replicas,
        )
        self._sync()
        return ColumnarResult(applied, deduplicated, ignored, _columns(ended), _columns(resets))

    def advance(self, max_expired: int | None = None) -> tuple[OutcomeColumns, bool]:
        """Rotate as due, then collect at most ``max_expired`` due trees (None: all), GIL released."""
        raw, more = self._core.advance(self._clock(), max_expired)
        self._sync()
        return _columns(raw), more

    def seconds_until_rotation(self) -> float:
        """Seconds until the next rotation is due (never negative)."""
        return float(self._core.seconds_until_rotation(self._clock()))

    def pending_roots(self) -> list[int]:
        """Root ids of all entries (for tests and diagnostics; not the hot path)."""
        return self._core.roots().tolist()

    # -- operating a running ledger: inspect, force-fail (the core is native/src/ledger/admin.rs) --

    def inspect(self, roots: Sequence[int]) -> list[TreeInfo]:
        """The state of each root now (read-only: nothing rotates or expires here)."""
        array = np.asarray(roots, dtype=np.uint64)
        return [_info(row) for row in self._core.inspect(array, self._clock())]

    def oldest(self, k: int) -> list[TreeInfo]:
        """The ``k`` oldest pending trees (by time since init; ties by root), oldest first."""
        return [_info(row) for row in self._core.oldest(k, self._clock())]

    def age_histogram(self, bounds: Sequence[float]) -> tuple[list[int], float]:
        """Pending trees by age: a count per bound (ages ``<=`` it, above the previous), then above all; the age sum."""
        counts, total_us = self._core.age_histogram([round(b * 1e6) for b in bounds], self._clock())
        return list(counts), total_us / 1e6

    def force_fail(self, roots: Sequence[int]) -> OutcomeColumns:
        """Fail the pending trees among ``roots`` now (FAILED to their spouts); a due one times out instead."""
        raw = self._core.force_fail(np.asarray(roots, dtype=np.uint64), self._clock())
        self._sync()
        return _columns(raw)

    def force_fail_spout(self, spout: str) -> OutcomeColumns:
        """Fail every pending tree of ``spout`` now; its trees already due time out instead."""
        raw = self._core.force_fail_spout(spout, self._clock())
        self._sync()
        return _columns(raw)

    # -- moving trees between ackers: export, import (the core is native/src/ledger/handoff.rs) --

    def export_moving(self, shard_count: int, keep_index: int) -> MovedEntries:
        """Remove and return the live entries whose root is not ``keep_index``'s under ``shard_count`` shards (-1: all)."""
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        raw = self._core.export_moving(int(shard_count), int(keep_index), self._clock())
        self._sync()
        return MovedEntries(*raw)

    def moving_roots(self, shard_count: int, keep_index: int) -> tuple[np.ndarray, np.ndarray]:
        """The roots and ages (microseconds) of the live entries :meth:`export_moving` would take out; nothing removed."""
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        roots, ages = self._core.moving_roots(int(shard_count), int(keep_index), self._clock())
        self._sync()
        return roots, ages

    def export_roots(self, roots: np.ndarray, last: bool = True) -> MovedEntries:
        """Remove and return the live entries among ``roots`` (one slice of a cut; absent and due ones are skipped)."""
        raw = self._core.export_roots(np.ascontiguousarray(roots, np.uint64), self._clock(), bool(last))
        self._sync()
        return MovedEntries(*raw)

    def export_snapshot(self, shard_count: int, index: int) -> MovedEntries:
        """Copy the live entries whose root is ``index``'s under ``shard_count`` shards; every entry stays here."""
        if shard_count < 1:
            raise ValueError(f"shard_count must be at least 1, got {shard_count}")
        if not 0 <= index < shard_count:
            raise ValueError(f"index must be a shard of the {shard_count}, got {index}")
        raw = self._core.export_snapshot(int(shard_count), int(index), self._clock())
        self._sync()
        return MovedEntries(*raw)

    def import_entries(self, moved: MovedEntries) -> OutcomeColumns:
        """Merge moved entries in by XOR (failed OR, earliest start, keys united); the trees that merging ended."""
        m = moved
        raw = self._core.import_entries(
            m.roots,
            m.values,
            list(m.spouts),
            m.spout_index,
            m.ages_us,
            m.generations,
            m.failed,
            m.resets,
            m.key_counts,
            m.keys,
            self._clock(),
        )
        self._sync()
        return _columns(raw)


def _info(row) -> TreeInfo:
    root, status, spout, age_us, failed, resets, dedup_keys = row
    return TreeInfo(root, TreeStatus(status), spout, age_us / 1e6, failed, resets, dedup_keys)


if TYPE_CHECKING:
    _: type[Ledger] = NativeLedger  # mypy: the engine implements the whole contract
