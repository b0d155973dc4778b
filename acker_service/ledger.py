"""The ``Ledger`` contract: the one entrance every ledger engine offers the server, columnar only.

Both engines (:class:`~acker_service.native_ledger.NativeLedger`, the Rust core,
and :class:`~acker_service.reference_ledger.ReferenceLedger`, the executable
spec in Python) implement exactly this protocol and nothing else is called on
them by the server, the benchmarks or the tests, so the differential test that
shows the two equal covers everything the server relies on.

The contract is columnar: serialized ``ApplyRequest`` bytes in (the form they
arrive in from gRPC), outcome columns (:class:`OutcomeColumns`) out. An engine
converts to its own inner form at its own edge. The ledger is pure: no I/O and
no clock of its own (each engine is given a clock and reads it per call).

To add a rule or an operation: add a method here, then to both engines (the
``Ledger`` check at the end of each engine module, and mypy, flag the one you
forgot), and drive it in ``tests/ledger/test_differential.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from .handoff import MovedEntries
from .outcome_columns import ColumnarResult, OutcomeColumns
from .tree_info import TreeInfo

__all__ = ["Ledger", "Limits", "LedgerStats", "UNLIMITED"]


@dataclass(frozen=True)
class Limits:
    """What an acker accepts in one request: its shard (the ownership check) and the batch bound.

    ``shard_count`` 1 owns every root. The check itself lives with validation
    (``batch.py`` / ``native/src/validate.rs``); this only carries its inputs.
    """

    shard_index: int = 0
    shard_count: int = 1
    max_batch: int = 2**31 - 1
    # 2: the shard also accepts the roots it follows (the previous shard's), see docs/acker-semantics.md.
    replicas: int = 1


# No limits: one shard owning everything and no batch bound (tests and benchmarks).
UNLIMITED = Limits()


@dataclass
class LedgerStats:
    """Monotonic counters of everything the ledger did (the metrics read these)."""

    inits: int = 0
    acks: int = 0
    fails: int = 0
    resets: int = 0
    acked: int = 0
    failed: int = 0
    timed_out: int = 0
    orphaned: int = 0
    duplicate_inits: int = 0
    deduplicated: int = 0
    outlived: int = 0  # trees ended LIFETIME_EXCEEDED (also in timed_out)
    force_failed: int = 0  # trees ended FAILED by force_fail (also in failed)
    # Trees handed to another acker by a layout change, and taken from one: conservation
    # per ledger is inits + moved_in == acked + failed + timed_out + pending + moved_out.
    moved_out: int = 0
    moved_in: int = 0


@runtime_checkable
class Ledger(Protocol):
    """The pending trees of one shard, expiring ``message_timeout`` seconds after their last touch.

    ``timeout_mode`` (``fixed`` or ``progress``: every applied ack restarts the
    timeout) and ``max_tree_lifetime`` (0: no cap; a tree that reaches it ends
    LIFETIME_EXCEEDED) are set when the engine is made (see
    :mod:`acker_service.tree_info`). ``stats`` is one object for the life of the
    ledger: the metrics collector keeps a reference and reads its plain ints
    from another thread.
    """

    engine: ClassVar[str]
    message_timeout: float
    timeout_mode: str
    max_tree_lifetime: float
    stats: LedgerStats

    @property
    def buckets(self) -> int:
        """Number of rotation buckets."""
        ...

    @property
    def rotation_period(self) -> float:
        """Seconds between rotations, ``message_timeout / (buckets - 1)``."""
        ...

    @property
    def pending_trees(self) -> int:
        """Trees whose init was applied and that have no outcome yet."""
        ...

    @property
    def orphan_entries(self) -> int:
        """Entries created by acks or fails whose init has not (yet) arrived."""
        ...

    def apply(self, request: bytes, limits: Limits, max_expired: int | None = None) -> ColumnarResult:
        """Decode, validate whole and apply serialized ``ApplyRequest`` bytes.

        Trees that are due collect first, at most ``max_expired`` of them (None:
        all); a due tree the batch touches expires before the batch applies to
        it, so slicing the expiry never changes what a client sees. Raises a
        :class:`~acker_service.batch.BatchError` (also for bytes that do not
        decode) and then changes nothing.
        """
        ...

    def advance(self, max_expired: int | None = None) -> tuple[OutcomeColumns, bool]:
        """Rotate as the clock says is due, then collect at most ``max_expired`` due entries (None: all).

        Returns the trees that timed out and whether more are due. Entries
        without a spout (acks whose init never came) are dropped and counted as
        orphaned.
        """
        ...

    def seconds_until_rotation(self) -> float:
        """Seconds until the next rotation is due (never negative)."""
        ...

    def pending_roots(self) -> list[int]:
        """Root ids of all entries (diagnostics and tests; not the hot path)."""
        ...

    # -- operating a running ledger: read-only views and failing from outside --

    def inspect(self, roots: Sequence[int]) -> list[TreeInfo]:
        """The state of each root now (read-only: nothing rotates or expires here)."""
        ...

    def oldest(self, k: int) -> list[TreeInfo]:
        """The ``k`` oldest pending trees (by time since init; ties by root), oldest first (read-only)."""
        ...

    def age_histogram(self, bounds: Sequence[float]) -> tuple[list[int], float]:
        """Pending trees by age: a count per bound (ages ``<=`` it, above the previous), then above all; the age sum."""
        ...

    def force_fail(self, roots: Sequence[int]) -> OutcomeColumns:
        """End the pending trees among ``roots`` FAILED now; return their outcomes.

        Rotates as due first (collecting nothing else); a due root among them
        times out instead, and roots absent or still awaiting their init are
        left alone.
        """
        ...

    def export_moving(self, shard_count: int, keep_index: int) -> MovedEntries:
        """Remove and return the live entries whose root is not ``keep_index``'s under ``shard_count`` shards (-1: all).

        Due entries stay: they time out here, as they would have without the move.
        """
        ...

    def moving_roots(self, shard_count: int, keep_index: int) -> tuple[np.ndarray, np.ndarray]:
        """The roots and ages (microseconds since the tree started) :meth:`export_moving` would take out; nothing removed.

        A cut lists what leaves in one step, refuses those roots from then on, and
        takes the entries out in slices (:meth:`export_roots`), youngest first.
        """
        ...

    def export_roots(self, roots: np.ndarray, last: bool = True) -> MovedEntries:
        """Remove and return the live entries among ``roots`` (absent and due ones are skipped: due ones time out here).

        ``last``: the cut's last slice, after which the table may give back memory.
        """
        ...

    def export_snapshot(self, shard_count: int, index: int) -> MovedEntries:
        """Copy (never remove) the live entries whose root is ``index``'s under ``shard_count`` shards.

        For a restarted replica's catch-up; due entries are not copied (they time out here).
        """
        ...

    def import_entries(self, moved: MovedEntries) -> OutcomeColumns:
        """Merge moved entries in by XOR (failed OR, earliest start, keys united); the trees that merging ended."""
        ...

    def force_fail_spout(self, spout: str) -> OutcomeColumns:
        """End every pending tree of ``spout`` FAILED now (its due trees time out instead); their outcomes."""
        ...
