"""Pending entries on the move between ackers (a reshard or a drain), as columns.

A layout change gives some roots a new owner. The old owner removes their
entries with ``export_moving`` and the new owner takes them in with
``import_entries``; both ledger engines speak this one form, so an entry
exported by either engine imports into either. Pure data: no gRPC, no clock
(ages are relative to the exporting ledger's clock, so two ackers' clocks need
not agree).

Why these columns: an entry is the whole state the acker-semantics rules need
to go on as if the tree had never moved (docs/acker-semantics.md, "Moving
trees"): the XOR checksum, the spout (None while the init has not arrived), the
failed flag, the time since the tree started (latency and the lifetime cap),
how many rotations since it was last put (its place in the timeout window),
the RESET_TIMEOUT count, and the dedup keys already applied (a re-sent batch
must still be dropped at the new owner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["MovedEntries", "owned", "merge_keys"]


def _empty(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class MovedEntries:
    """Entry ``i`` is ``roots[i]`` with checksum ``values[i]`` and so on; its keys are the next ``key_counts[i]`` of ``keys``.

    ``spout_index[i]`` indexes ``spouts``; -1 means the init has not arrived
    (an entry made by an ack that overtook its init).
    """

    roots: np.ndarray = field(default_factory=lambda: _empty(np.uint64))
    values: np.ndarray = field(default_factory=lambda: _empty(np.uint64))
    spouts: list[str] = field(default_factory=list)
    spout_index: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    ages_us: np.ndarray = field(default_factory=lambda: _empty(np.uint64))
    generations: np.ndarray = field(default_factory=lambda: _empty(np.uint8))
    failed: np.ndarray = field(default_factory=lambda: _empty(np.bool_))
    resets: np.ndarray = field(default_factory=lambda: _empty(np.uint32))
    key_counts: np.ndarray = field(default_factory=lambda: _empty(np.uint32))
    keys: np.ndarray = field(default_factory=lambda: _empty(np.uint64))

    def __post_init__(self) -> None:
        self.roots = np.asarray(self.roots, dtype=np.uint64)
        self.values = np.asarray(self.values, dtype=np.uint64)
        self.spout_index = np.asarray(self.spout_index, dtype=np.int32)
        self.ages_us = np.asarray(self.ages_us, dtype=np.uint64)
        self.generations = np.asarray(self.generations, dtype=np.uint8)
        self.failed = np.asarray(self.failed, dtype=np.bool_)
        self.resets = np.asarray(self.resets, dtype=np.uint32)
        self.key_counts = np.asarray(self.key_counts, dtype=np.uint32)
        self.keys = np.asarray(self.keys, dtype=np.uint64)
        n = len(self.roots)
        columns = (
            self.values,
            self.spout_index,
            self.ages_us,
            self.generations,
            self.failed,
            self.resets,
            self.key_counts,
        )
        if any(len(c) != n for c in columns):
            raise ValueError(f"moved entries: every column needs {n} values, one per root")
        if int(self.key_counts.sum()) != len(self.keys):
            raise ValueError(
                f"moved entries: key_counts add up to {int(self.key_counts.sum())}, but {len(self.keys)} keys came"
            )
        if n and (int(self.spout_index.max()) >= len(self.spouts) or int(self.spout_index.min()) < -1):
            raise ValueError(
                f"moved entries: a spout index is outside the {len(self.spouts)} spout names (-1: no init yet)"
            )
        if n and not self.roots.all():
            raise ValueError("moved entries: root id 0 is never a tree")

    def __len__(self) -> int:
        return len(self.roots)

    @property
    def trees(self) -> int:
        """Entries whose init has arrived (pending trees, as opposed to orphans)."""
        return int((self.spout_index >= 0).sum())

    def rows(self) -> list[tuple[int, int, str | None, int, int, bool, int, tuple[int, ...]]]:
        """One tuple per entry, sorted by root: (root, value, spout, age µs, generation, failed, resets, sorted keys). For tests."""
        offsets = np.concatenate(([0], np.cumsum(self.key_counts, dtype=np.int64)))
        out = []
        for i in range(len(self.roots)):
            s = int(self.spout_index[i])
            keys = tuple(sorted(int(k) for k in self.keys[offsets[i] : offsets[i + 1]]))
            out.append(
                (
                    int(self.roots[i]),
                    int(self.values[i]),
                    self.spouts[s] if s >= 0 else None,
                    int(self.ages_us[i]),
                    int(self.generations[i]),
                    bool(self.failed[i]),
                    int(self.resets[i]),
                    keys,
                )
            )
        return sorted(out)

    @classmethod
    def concat(cls, parts: list[MovedEntries]) -> MovedEntries:
        """One set of entries from several (the spout names renumbered); roots must not repeat across parts."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls()
        names: dict[str, int] = {}
        indices = []
        for p in parts:
            remap = np.array([names.setdefault(s, len(names)) for s in p.spouts] + [-1], dtype=np.int32)
            indices.append(remap[p.spout_index])  # -1 picks the trailing -1
        return cls(
            np.concatenate([p.roots for p in parts]),
            np.concatenate([p.values for p in parts]),
            list(names),
            np.concatenate(indices),
            np.concatenate([p.ages_us for p in parts]),
            np.concatenate([p.generations for p in parts]),
            np.concatenate([p.failed for p in parts]),
            np.concatenate([p.resets for p in parts]),
            np.concatenate([p.key_counts for p in parts]),
            np.concatenate([p.keys for p in parts]),
        )

    def slice(self, lo: int, hi: int) -> MovedEntries:
        """Entries ``lo`` up to ``hi`` (to cut one new owner's part into messages without a pass per message)."""
        offsets = np.concatenate(([0], np.cumsum(self.key_counts, dtype=np.int64)))
        hi = min(hi, len(self))
        return MovedEntries(
            self.roots[lo:hi],
            self.values[lo:hi],
            list(self.spouts),
            self.spout_index[lo:hi],
            self.ages_us[lo:hi],
            self.generations[lo:hi],
            self.failed[lo:hi],
            self.resets[lo:hi],
            self.key_counts[lo:hi],
            self.keys[offsets[lo] : offsets[hi]],
        )

    def take(self, order: np.ndarray) -> MovedEntries:
        """The entries in the order of the indices ``order`` (each index at most once), their keys following them."""
        order = np.asarray(order, dtype=np.int64)
        counts = self.key_counts.astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else np.zeros(0, np.int64)
        picked = counts[order]
        # Key positions: each taken entry's run of keys, runs in the new order.
        run_starts = np.repeat(starts[order], picked)
        within = np.arange(int(picked.sum())) - np.repeat(np.cumsum(picked) - picked, picked)
        return MovedEntries(
            self.roots[order],
            self.values[order],
            list(self.spouts),
            self.spout_index[order],
            self.ages_us[order],
            self.generations[order],
            self.failed[order],
            self.resets[order],
            self.key_counts[order],
            self.keys[run_starts + within],
        )

    def select(self, mask: np.ndarray) -> MovedEntries:
        """The entries where ``mask`` is true (to split one export between several new owners)."""
        mask = np.asarray(mask, dtype=np.bool_)
        key_mask = np.repeat(mask, self.key_counts.astype(np.int64))
        return MovedEntries(
            self.roots[mask],
            self.values[mask],
            list(self.spouts),
            self.spout_index[mask],
            self.ages_us[mask],
            self.generations[mask],
            self.failed[mask],
            self.resets[mask],
            self.key_counts[mask],
            self.keys[key_mask],
        )


def owned(root: int, shard_count: int, shard_index: int) -> bool:
    """Whether ``root`` belongs to ``shard_index`` under ``shard_count`` shards (the design's rule: root mod count)."""
    return shard_index >= 0 and root % shard_count == shard_index


def merge_keys(mine: int | set[int] | None, theirs: list[int]) -> int | set[int] | None:
    """The union of a reference-ledger entry's dedup keys and moved ones (the entry's compact form kept)."""
    if not theirs:
        return mine
    union: set[int] = set(theirs)
    if isinstance(mine, set):
        union |= mine
    elif mine is not None:
        union.add(mine)
    return next(iter(union)) if len(union) == 1 else union
