"""The hung-round rule: a round's job that runs on, quiet, after some of its trees were failed from outside.

A record can hang its task (a call that never returns). Failing its tree
(``acker-ctl fail``, or a per-record time limit) ends the tree, but the Spark
job waits for the hung task for as long as it hangs. :class:`HungRoundCheck`,
one of the round watch's checks, says when such a round must be cancelled:

- at least one tree the round's tasks started (its emission log so far)
  FAILED from outside the job: no executor wrote a cause for it (a
  force-fail at the acker), or its cause is a time limit's
  (``time_limit_errors``),
- and for ``grace`` seconds no tree was started (a task still reading is not
  hung) and none ended (a task still acking is not hung either).

Trees of the round may still be pending: the rows a hung task read behind its
hung record are leased by that task's bolts (``acker_spark.task_roots``), so
they neither time out nor end until the task does.

The driver then cancels the round's job; the failed records are replayed or
dead-lettered by the policy as after any failed job, and the records the round
did not read are read by the next one. The clock is injected.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from acker_protocol.wire import Outcome

from ..causes import CauseReader
from ..job_errors import error_type
from .emission_log import read_round, round_dir

__all__ = ["TIME_LIMIT_ERRORS", "HungRound", "HungRoundCheck"]

TIME_LIMIT_ERRORS = frozenset({"RecordTimeLimit", "TimeLimitExceeded"})
"""Cause types that say a record was failed by a per-record time limit, not by the job's own code."""

_FAILED = int(Outcome.FAILED)


@dataclass(frozen=True)
class HungRound:
    """The verdict: ``started`` trees, ``failed`` of them failed from outside, none started or ended for a while."""

    round_no: int
    started: int
    failed: int

    def __str__(self) -> str:
        return (
            f"round {self.round_no} started {self.started} trees, {self.failed} of them failed by acker-ctl fail or"
            " a time limit, and none started or ended since, but its job still runs: a task hangs; cancelling it"
        )


class HungRoundCheck:
    """Watches round ``round_no`` of ``checkpoint``; give :meth:`observe` to the outcome feed's taps."""

    def __init__(
        self,
        checkpoint: str | Path,
        round_no: int,
        clock: Callable[[], float],
        grace: float = 2.0,
        time_limit_errors: frozenset[str] = TIME_LIMIT_ERRORS,
    ) -> None:
        self.checkpoint = checkpoint
        self.round_no = round_no
        self.folder = round_dir(checkpoint, round_no)
        self.clock = clock
        self.grace = grace
        self.time_limit_errors = time_limit_errors
        self.causes = CauseReader(checkpoint)
        self._lock = threading.Lock()
        self._failed: list[np.ndarray] = []
        self._sizes: tuple[tuple[str, int], ...] = ()
        self._started = np.zeros(0, dtype=np.uint64)
        self._changed = clock()

    def observe(self, roots: np.ndarray, outcomes: np.ndarray) -> None:
        """The outcome feed's tap: note that trees still end, and remember which of them FAILED."""
        with self._lock:
            self._failed.append(roots[outcomes == _FAILED])
            self._changed = self.clock()  # trees still end: the job is not hung

    def __call__(self) -> HungRound | None:
        """The verdict if the round hangs after some of its trees were failed from outside, else None."""
        started = self._started_roots()
        with self._lock:
            if not len(started) or self.clock() - self._changed < self.grace:
                return None
            failed = np.unique(np.concatenate(self._failed)) if self._failed else started[:0]
            self._failed = [failed]
        causes = self.causes.refresh()
        outside = [
            r
            for r in failed[np.isin(failed, started)].tolist()
            if r not in causes or error_type(causes[r]) in self.time_limit_errors
        ]
        if not outside:
            return None
        return HungRound(self.round_no, len(started), len(outside))

    def _started_roots(self) -> np.ndarray:
        """The roots the round started so far (read again only when an emission file grew)."""
        names = sorted(os.listdir(self.folder)) if self.folder.is_dir() else []
        sizes = tuple((name, (self.folder / name).stat().st_size) for name in names)
        if sizes != self._sizes:
            self._sizes = sizes
            self._started = read_round(self.checkpoint, self.round_no).roots
            with self._lock:
                self._changed = self.clock()
        return self._started
