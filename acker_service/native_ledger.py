"""The native ledger: the Rust core (``acker_service._native``) behind the reference ledger's interface.

``NativeLedger`` takes the same constructor arguments as
:class:`~acker_service.reference_ledger.ReferenceLedger` and offers the same
``apply_batch`` / ``advance`` / ``stats`` / properties, so every ledger test runs
against both. The server's hot path uses :meth:`NativeLedger.apply_request`
instead: serialized ``ApplyRequest`` bytes in, outcome columns (numpy arrays)
out, decoded, validated and applied in Rust with the GIL released.

The clock stays on the Python side: the core is given "now" on every call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields

import numpy as np

from ._native import NativeCore
from .batch import Batch
from .outcome_columns import ColumnarResult, OutcomeColumns
from .reference_ledger import BatchResult, LedgerStats, Resolution
from .tree_info import TIMEOUT_MODES, TreeInfo, TreeStatus, check_timeout_rules

__all__ = ["NativeLedger", "ColumnarResult", "MAX_BUCKETS"]

Clock = Callable[[], float]

# Generations are kept modulo 64 in a 24-byte entry (see native/src/table.rs).
MAX_BUCKETS = 32
_STAT_FIELDS = [f.name for f in fields(LedgerStats)]
_NO_KEYS = np.zeros(0, dtype=np.uint64)
_NO_INDEX = np.zeros(0, dtype=np.uint32)
_UNLIMITED = 2**63 - 1  # "collect every due tree" for the core's usize limit


def _columns(raw) -> OutcomeColumns:
    return OutcomeColumns(*raw)


def _result(raw) -> ColumnarResult:
    applied, deduplicated, ignored, ended, resets = raw
    return ColumnarResult(applied, deduplicated, ignored, _columns(ended), _columns(resets))


class NativeLedger:
    """Pending tuple trees of one shard in the native core, expiring after ``message_timeout`` seconds.

    >>> ledger = NativeLedger(message_timeout=30.0, clock=lambda: 0.0)
    >>> ledger.apply_batch(Batch.of([1, 2], [5, 5], [9, 9], spouts=["s"])).resolutions
    [Resolution(spout='s', root=5, outcome=<Outcome.ACKED: 1>, latency_seconds=0.0)]
    """

    engine = "native"

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
        for name, value in zip(_STAT_FIELDS, self._core.stats()):
            setattr(self.stats, name, value)
        self.stats.outlived, self.stats.force_failed = self._core.admin_stats()

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
        """Slots of the native hash table (24 bytes each): for memory diagnostics."""
        return int(self._core.capacity)

    def apply_request(
        self, data: bytes, *, shard_index: int, shard_count: int, max_batch: int, max_expired: int | None = None
    ) -> ColumnarResult:
        """Decode, validate and apply serialized ``ApplyRequest`` bytes (the server's hot path).

        At most ``max_expired`` due trees are collected first (None: all); a due
        tree the batch touches expires before the batch applies to it.

        Raises :class:`~acker_service.batch.InvalidBatch` (also for bytes that do not
        decode), :class:`~acker_service.batch.BatchTooLarge` or
        :class:`~acker_service.batch.WrongShard`; a refused request changes nothing.
        """
        raw = self._core.apply_request(data, self._clock(), shard_index, shard_count, max_batch, max_expired)
        self._sync()
        return _result(raw)

    def apply_columns(self, batch: Batch, max_expired: int | None = None) -> ColumnarResult:
        """Apply a :class:`Batch` and return outcome columns (no Python object per outcome)."""
        spout_index = batch.spout_index
        if len(spout_index) and spout_index.dtype != np.uint32:
            # Negative indices cannot name a spout; map them past the end so validation names them.
            spout_index = np.where(spout_index < 0, np.iinfo(np.uint32).max, spout_index).astype(np.uint32)
        raw = self._core.apply_arrays(
            np.ascontiguousarray(batch.kinds, dtype=np.int32),
            np.ascontiguousarray(batch.roots, dtype=np.uint64),
            np.ascontiguousarray(batch.values, dtype=np.uint64),
            np.ascontiguousarray(batch.dedup_keys, dtype=np.uint64) if len(batch.dedup_keys) else _NO_KEYS,
            list(batch.spouts),
            np.ascontiguousarray(spout_index, dtype=np.uint32) if len(spout_index) else _NO_INDEX,
            self._clock(),
            max_expired,
        )
        self._sync()
        return _result(raw)

    def apply_batch(self, batch: Batch, max_expired: int | None = None) -> BatchResult:
        """Apply a batch, as :meth:`ReferenceLedger.apply_batch` does (resolutions as objects)."""
        result = self.apply_columns(batch, max_expired)
        return BatchResult(
            result.applied,
            result.deduplicated,
            result.ignored,
            result.ended.resolutions(),
            result.timeout_resets.resolutions(),
        )

    def advance_columns(self) -> OutcomeColumns:
        """Rotate as due; return the trees that timed out, as columns."""
        raw = self._core.advance(self._clock())
        self._sync()
        return _columns(raw)

    def advance(self) -> list[Resolution]:
        """Rotate as due; return the trees that timed out (orphans are dropped and counted)."""
        return self.advance_columns().resolutions()

    def advance_some_columns(self, max_expired: int | None) -> tuple[OutcomeColumns, bool]:
        """Rotate as due, then collect at most ``max_expired`` due trees (None: all), GIL released.

        Returns the trees that timed out, as columns, and whether more are due.
        """
        now = self._clock()
        self._core.advance_clock(now)
        raw, more = self._core.expire_some(now, _UNLIMITED if max_expired is None else max_expired)
        self._sync()
        return _columns(raw), more

    def advance_some(self, max_expired: int | None) -> tuple[list[Resolution], bool]:
        """As :meth:`ReferenceLedger.advance_some`: at most ``max_expired`` timed-out trees and whether more are due."""
        columns, more = self.advance_some_columns(max_expired)
        return columns.resolutions(), more

    def seconds_until_rotation(self) -> float:
        """Seconds until the next rotation is due (never negative)."""
        return float(self._core.seconds_until_rotation(self._clock()))

    def pending_roots(self) -> Iterable[int]:
        """Root ids of all entries (for tests and diagnostics; not the hot path)."""
        return self._core.roots().tolist()

    # -- operating a running ledger (issue 21; the core is native/src/ledger/admin.rs) --

    def inspect(self, roots: Iterable[int]) -> list[TreeInfo]:
        """The state of each root now (read-only: nothing rotates or expires here)."""
        array = np.fromiter(roots, dtype=np.uint64)
        return [_info(row) for row in self._core.inspect(array, self._clock())]

    def oldest(self, k: int) -> list[TreeInfo]:
        """The ``k`` oldest pending trees (by time since init; ties by root), oldest first."""
        return [_info(row) for row in self._core.oldest(k, self._clock())]

    def age_histogram(self, bounds: Sequence[float]) -> tuple[list[int], float]:
        """Pending trees by age: a count per bound (ages ``<=`` it, above the previous), then above all; the age sum."""
        counts, total_us = self._core.age_histogram([round(b * 1e6) for b in bounds], self._clock())
        return list(counts), total_us / 1e6

    def force_fail_columns(self, roots: Iterable[int]) -> OutcomeColumns:
        """Fail the pending trees among ``roots`` now (FAILED to their spouts); a due one times out instead."""
        raw = self._core.force_fail(np.fromiter(roots, dtype=np.uint64), self._clock())
        self._sync()
        return _columns(raw)

    def force_fail(self, roots: Iterable[int]) -> list[Resolution]:
        """:meth:`force_fail_columns`, as :meth:`ReferenceLedger.force_fail` returns it."""
        return self.force_fail_columns(roots).resolutions()

    def force_fail_spout_columns(self, spout: str) -> OutcomeColumns:
        """Fail every pending tree of ``spout`` now; its trees already due time out instead."""
        raw = self._core.force_fail_spout(spout, self._clock())
        self._sync()
        return _columns(raw)

    def force_fail_spout(self, spout: str) -> list[Resolution]:
        """:meth:`force_fail_spout_columns`, as :meth:`ReferenceLedger.force_fail_spout` returns it."""
        return self.force_fail_spout_columns(spout).resolutions()


def _info(row) -> TreeInfo:
    root, status, spout, age_us, failed, resets, dedup_keys = row
    return TreeInfo(root, TreeStatus(status), spout, age_us / 1e6, failed, resets, dedup_keys)
