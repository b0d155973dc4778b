"""The driver's table of started deliveries: parallel numpy arrays sorted by root, settled in bulk.

One entry per root the executors started (read from the emission log): its
identity hash, attempt, the round that started it and its state. Outcomes are
matched with ``searchsorted``; only a pending entry takes an outcome, so a
second tree with an already settled root (an init re-executed after its tree
completed) changes nothing. No Python object per record: a few bytes per
entry (docs/benchmarks.md has the measured size and the timings behind the
choices below).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .emission_log import Emissions
from .identity import derive_roots

__all__ = ["PENDING", "ACKED", "FAILED", "REPLAYED", "DEAD", "RecordTable", "Settled"]

PENDING, ACKED, FAILED = 0, 1, 2
REPLAYED, DEAD = 3, 4  # a failed delivery that was delivered again / whose record was dead-lettered


@dataclass(frozen=True)
class Settled:
    """Entries that just ended: acked positions, and failed ones with their wire outcome."""

    acked: np.ndarray  # entry positions
    failed: np.ndarray  # entry positions
    reasons: np.ndarray  # int8 outcome per failed entry


class RecordTable:
    """Started deliveries by root: identity, attempt, round and state."""

    def __init__(self) -> None:
        self.roots = np.zeros(0, dtype=np.uint64)
        self.idents = np.zeros(0, dtype=np.uint64)
        self.attempts = np.zeros(0, dtype=np.uint16)
        self.rounds = np.zeros(0, dtype=np.uint16)
        self.state = np.zeros(0, dtype=np.uint8)
        self.reason = np.zeros(0, dtype=np.int8)
        self.due = np.zeros(0, dtype=np.float64)  # a failed entry's replay time (the pipeline's clock)

    def __len__(self) -> int:
        return len(self.roots)

    def add(self, emissions: Emissions, round_no: int) -> int:
        """Add a round's roots not already known (a re-run round re-reads some); return how many were new."""
        roots = emissions.roots
        if not len(self.roots) and _strictly_increasing(roots):
            # The first round, read by read_round: already sorted, each root once. Taking the
            # columns as they are skips a merge sort and seven gathers.
            return self._take(emissions, round_no)
        if len(self.roots):
            known = self._find(roots) >= 0
            keep = ~known
        else:
            keep = np.ones(len(roots), dtype=bool)
        count = int(keep.sum())
        if not count:
            return 0
        roots = np.concatenate((self.roots, roots[keep]))
        order = np.argsort(roots, kind="stable")  # two sorted runs: the stable sort merges them in linear time
        self.roots = roots[order]
        self.idents = np.concatenate((self.idents, emissions.idents[keep]))[order]
        self.attempts = np.concatenate((self.attempts, emissions.attempts[keep]))[order]
        self.rounds = np.concatenate((self.rounds, np.full(count, round_no, dtype=np.uint16)))[order]
        self.state = np.concatenate((self.state, np.zeros(count, dtype=np.uint8)))[order]
        self.reason = np.concatenate((self.reason, np.zeros(count, dtype=np.int8)))[order]
        self.due = np.concatenate((self.due, np.zeros(count, dtype=np.float64)))[order]
        return count

    def _take(self, emissions: Emissions, round_no: int) -> int:
        """Become ``emissions`` (sorted, unique roots) as the table's only round."""
        count = len(emissions.roots)
        self.roots = np.asarray(emissions.roots, dtype=np.uint64)
        self.idents = np.asarray(emissions.idents, dtype=np.uint64)
        self.attempts = np.asarray(emissions.attempts, dtype=np.uint16)
        self.rounds = np.full(count, round_no, dtype=np.uint16)
        self.state = np.zeros(count, dtype=np.uint8)
        self.reason = np.zeros(count, dtype=np.int8)
        self.due = np.zeros(count, dtype=np.float64)
        return count

    def _find(self, roots: np.ndarray) -> np.ndarray:
        """Each root's entry position, or -1 if unknown."""
        if not len(self.roots):
            return np.full(len(roots), -1, dtype=np.int64)
        pos = np.searchsorted(self.roots, roots)
        pos[pos == len(self.roots)] = 0
        return np.where(self.roots[pos] == roots, pos, -1)

    def settle(self, roots: np.ndarray, outcomes: np.ndarray, acked_code: int) -> tuple[Settled, np.ndarray]:
        """Apply outcomes in order (the first for a pending entry counts); return what ended and the unknown roots."""
        # Sorted by root (stably when a root repeats, so its outcomes stay in arrival order):
        # searchsorted then walks the table forwards instead of missing the cache on every lookup,
        # and a root's first outcome is the first of its run.
        if len(outcomes) and (outcomes == outcomes[0]).all():
            # One code for the whole batch (the usual case: all ACKED): which outcome of a repeated
            # root comes first does not matter, so the roots alone are sorted, cheaper than the
            # permutation argsort computes.
            by_root = np.sort(roots)
            first = np.ones(len(roots), dtype=bool)
            first[1:] = by_root[1:] != by_root[:-1]
            roots = by_root if first.all() else by_root[first]
            outcomes = np.full(len(roots), outcomes[0], dtype=outcomes.dtype)
        else:
            roots, outcomes = _first_by_root(roots, outcomes)
        pos = self._find(roots)
        known = pos >= 0
        # The usual batch: every root known and pending. Each mask is applied only when it drops
        # something (applying one copies every column, as a compaction does).
        if known.all():
            unknown = roots[:0]
        else:
            unknown = roots[~known]
            pos, outcomes = pos[known], outcomes[known]
        pending = self.state[pos] == PENDING
        if not pending.all():
            pos, outcomes = pos[pending], outcomes[pending]
        ok = outcomes == acked_code
        self.state[pos[ok]] = ACKED
        self.state[pos[~ok]] = FAILED
        self.reason[pos] = outcomes
        return Settled(pos[ok], pos[~ok], outcomes[~ok]), unknown

    def mark_replayed(self, salt: int, idents: np.ndarray, attempts: np.ndarray) -> None:
        """A delivery with attempt n > 1 supersedes its attempt n - 1: that entry, if FAILED, becomes REPLAYED."""
        again = attempts > 1
        if not again.any():
            return
        previous = derive_roots(salt, idents[again], attempts[again] - 1)
        pos = self._find(previous)
        pos = pos[pos >= 0]
        self.state[pos[self.state[pos] == FAILED]] = REPLAYED

    def take_late(self, deadlines: dict[int, float], now: float) -> np.ndarray:
        """The roots still pending of the rounds whose backstop deadline is past; those rounds leave ``deadlines``."""
        late = [r for r, deadline in deadlines.items() if deadline <= now]
        if not late:
            return self.roots[:0]
        for round_no in late:
            del deadlines[round_no]
        return self.roots[self.pending(np.asarray(late, dtype=np.uint16))]

    def pending(self, rounds: np.ndarray | None = None) -> np.ndarray:
        """Positions of pending entries (of the given rounds only, if given)."""
        mask = self.state == PENDING
        if rounds is not None:
            mask &= np.isin(self.rounds, rounds)
        return np.flatnonzero(mask)

    def count(self, state: int) -> int:
        """How many entries are in ``state``."""
        return int((self.state == state).sum())

    def in_state(self, roots: np.ndarray, state: int) -> np.ndarray:
        """The entry positions of those of ``roots`` that are known and in ``state``."""
        pos = self._find(roots)
        pos = pos[pos >= 0]
        return pos[self.state[pos] == state]

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the entries where ``mask`` is True (drop settled entries of a long-running stream)."""
        self.roots, self.idents, self.attempts = self.roots[mask], self.idents[mask], self.attempts[mask]
        self.rounds, self.state, self.reason, self.due = (
            self.rounds[mask],
            self.state[mask],
            self.reason[mask],
            self.due[mask],
        )


def _strictly_increasing(values: np.ndarray) -> bool:
    """True if ``values`` is sorted with no repeat (an empty or one-element array is)."""
    return bool((values[1:] > values[:-1]).all())


def _first_by_root(roots: np.ndarray, outcomes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Roots sorted, each once, with its first outcome in arrival order."""
    order = np.argsort(roots)
    by_root = roots[order]
    first = np.ones(len(roots), dtype=bool)
    first[1:] = by_root[1:] != by_root[:-1]
    if first.all():
        return by_root, outcomes[order]
    # A root twice: only the stable sort keeps its outcomes in arrival order.
    order = np.argsort(roots, kind="stable")
    by_root = roots[order]
    first[1:] = by_root[1:] != by_root[:-1]
    return by_root[first], outcomes[order][first]
