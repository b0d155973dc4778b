"""Tree outcomes as columns (numpy arrays), the form the hot path hands from ledger to hub.

Both ledger engines return their outcomes this way (the ``Ledger`` contract,
:mod:`acker_service.ledger`); the native one without a Python object per tree.
:class:`Resolution` is the one-object-per-outcome form, for the reference
engine's inner loop and for tests, converted at their edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from acker_protocol.wire import Outcome

__all__ = ["OutcomeColumns", "ColumnarResult", "Resolution"]


class Resolution(NamedTuple):
    """One tree's single outcome, to be delivered to its spout."""

    spout: str
    root: int
    outcome: Outcome
    latency_seconds: float


class OutcomeColumns(NamedTuple):
    """Outcome ``i`` is (``spouts[spout_index[i]]``, ``roots[i]``, ``outcomes[i]``, ``latency_micros[i]``)."""

    spouts: list[str]
    spout_index: np.ndarray  # unsigned ints, one per outcome
    roots: np.ndarray  # uint64
    outcomes: np.ndarray  # uint8, Outcome values
    latency_micros: np.ndarray  # uint64, init to outcome

    @classmethod
    def empty(cls) -> OutcomeColumns:
        """No outcomes."""
        return cls([], np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(0, np.uint8), np.zeros(0, np.uint64))

    @classmethod
    def from_resolutions(cls, resolutions: Sequence[Resolution]) -> OutcomeColumns:
        """Columns of a list of resolutions (the reference ledger's output)."""
        if not resolutions:
            return cls.empty()
        spouts, roots, outcomes, latencies = zip(*resolutions)
        names = list(dict.fromkeys(spouts))
        position = {name: i for i, name in enumerate(names)}
        return cls(
            names,
            np.fromiter((position[s] for s in spouts), dtype=np.uint16, count=len(spouts)),
            np.asarray(roots, dtype=np.uint64),
            np.asarray(outcomes, dtype=np.uint8),
            # Clamped at 0 like the hub does; rounded to the wire's microseconds.
            np.rint(np.maximum(np.asarray(latencies, dtype=np.float64), 0.0) * 1e6).astype(np.uint64),
        )

    def __len__(self) -> int:  # type: ignore[override]  # the number of outcomes, not of columns
        return len(self.roots)

    def latency_seconds(self) -> np.ndarray:
        """Init-to-outcome times in seconds (float64)."""
        return self.latency_micros.astype(np.float64) / 1e6

    def resolutions(self) -> list[Resolution]:
        """One :class:`Resolution` per outcome (tests and diagnostics; not the hot path)."""
        spouts = self.spouts
        return [
            Resolution(spouts[s], root, Outcome(o), lat / 1e6)
            for s, root, o, lat in zip(
                self.spout_index.tolist(), self.roots.tolist(), self.outcomes.tolist(), self.latency_micros.tolist()
            )
        ]

    def by_spout(self) -> list[tuple[str, np.ndarray | None]]:
        """(spout, positions of its outcomes) per spout; positions None when one spout has them all."""
        if len(self.spouts) == 1:
            return [(self.spouts[0], None)]
        return [(name, np.flatnonzero(self.spout_index == i)) for i, name in enumerate(self.spouts)]


@dataclass
class ColumnarResult:
    """What one batch did, with outcomes as columns: ``ended`` trees, ``timeout_resets`` notices."""

    applied: int
    deduplicated: int
    ignored: int
    ended: OutcomeColumns
    timeout_resets: OutcomeColumns
    # During a layout change: operations held for trees still moving here (applied once they arrived).
    held: int = 0

    @property
    def operations(self) -> int:
        """Operations applied now (each is applied, deduplicated or ignored; held ones count when they apply)."""
        return self.applied + self.deduplicated + self.ignored
