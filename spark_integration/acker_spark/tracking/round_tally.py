"""What a running round has read and failed for good so far, from the files its tasks write while the job runs.

The driver's book learns a round's roots only after its job (the emission
log is read then), but the failure budget must be checked as outcomes arrive.
While the job runs, a :class:`RoundTally` counts:

- the records the round read: the rows of its emission files (for each
  partition the attempt that read most: a re-run reads the same records);
  only a round that reads the source for the first time reads new records;
- the deliveries that failed for good: a cause the executors wrote (they
  write it before the fail is sent, also in tasks later killed) for a root the
  book did not know when the round started, that the policy dead-letters at
  once, or any failure of a delivery on its last attempt (a replay round's
  roots are derived from the identities and attempts it selects).

Read-only on the checkpoint: it runs on the round watch's thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..budget import CauseTally
from ..causes import CauseReader
from ..replay_policy import ReplayPolicy
from .checkpoint import read_complete_batches
from .emission_log import RoundFilter, round_dir
from .identity import derive_roots

__all__ = ["RoundTally"]


class RoundTally:
    """The running round ``round_no``'s records read and deliveries failed for good, as its tasks wrote them.

    ``known`` are the roots the book held when the round started (sorted):
    their causes are older news. ``rows`` is the round's filter, ``salt`` the
    run's id salt.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        round_no: int,
        rows: RoundFilter,
        salt: int,
        policy: ReplayPolicy,
        known: np.ndarray,
    ) -> None:
        self.folder = round_dir(checkpoint, round_no)
        self.first_read = rows.mode != "select"
        self.policy = policy
        self.known = known
        if self.first_read:
            self.last = np.zeros(0, dtype=np.uint64)
            self.all_last = policy.max_attempts <= 1  # one attempt: every failure is final
        else:
            final = rows.attempts >= policy.max_attempts
            self.last = np.sort(derive_roots(salt, rows.idents[final], rows.attempts[final]))
            self.all_last = False
        self.causes = CauseReader(checkpoint)
        self.kinds = CauseTally()  # the causes of this round's deliveries failed for good, by kind
        self.dead = 0
        self._rows: dict[str, tuple[int, int]] = {}  # emission file -> (size, rows)

    def read(self) -> int:
        """New records the round has read so far (0 for a replay round)."""
        if not self.first_read or not self.folder.is_dir():
            return 0
        best: dict[str, int] = {}
        for name in os.listdir(self.folder):
            if not name.endswith(".arrow"):
                continue
            path = self.folder / name
            size = path.stat().st_size
            cached = self._rows.get(name)
            if cached is None or cached[0] != size:
                cached = (size, sum(b.num_rows for b in read_complete_batches(path)))
                self._rows[name] = cached
            partition = name.split("-", 1)[0]
            best[partition] = max(best.get(partition, 0), cached[1])
        return sum(best.values())

    def failed_for_good(self) -> int:
        """Deliveries of this round that failed for good so far (their causes read since the last call added)."""
        fresh = self.causes.refresh() and self.causes.fresh
        if not fresh:
            return self.dead
        roots = np.fromiter(fresh.keys(), dtype=np.uint64, count=len(fresh))
        new = ~_contains(self.known, roots)
        last = _contains(self.last, roots) | self.all_last
        for root, is_new, is_last, cause in zip(roots.tolist(), new, last, fresh.values()):
            if is_new and (is_last or not self.policy.retries(cause)):
                self.dead += 1
                self.kinds.add(f"root {root:016x}", cause)
        return self.dead


def _contains(sorted_roots: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Per root: True if it is in ``sorted_roots``."""
    if not len(sorted_roots):
        return np.zeros(len(roots), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_roots, roots), len(sorted_roots) - 1)
    return sorted_roots[pos] == roots
