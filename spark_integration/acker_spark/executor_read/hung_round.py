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
  hung) and none ended (a task still acking is not hung either),
- and, while some of the round's trees are still pending, their tasks are seen
  alive and connected: a lease renewal (``TIMEOUT_RESET``) of a pending tree of
  each shard that has some reached the ackers during that quiet time. A round
  whose executors cannot reach the ackers (a network cut, a paused acker) is
  quiet too, but its renewals do not arrive: it waits, since its tasks ride the
  outage out and resend their operations. Only once it
  was quiet for ``silent_after`` seconds (the ackers' backstop: by then a cut has
  outlasted the message timeout, or the task runs without leases) is it
  cancelled all the same, and the log says which it was.

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
from acker_client.columns import distinct, member_of
from acker_protocol.wire import Outcome

from ..causes import CauseReader
from ..job_errors import error_type
from ..tracking.emission_log import read_round, round_dir

__all__ = ["TIME_LIMIT_ERRORS", "HungRound", "HungRoundCheck"]

TIME_LIMIT_ERRORS = frozenset({"RecordTimeLimit", "TimeLimitExceeded"})
"""Cause types that say a record was failed by a per-record time limit, not by the job's own code."""

_FAILED = int(Outcome.FAILED)
_RESET = int(Outcome.TIMEOUT_RESET)


@dataclass(frozen=True)
class HungRound:
    """The verdict: ``started`` trees, ``failed`` of them failed from outside, none started or ended for a while."""

    round_no: int
    started: int
    failed: int
    silent: bool = False  # its pending trees' tasks were not heard from either (unreachable, or without leases)

    def __str__(self) -> str:
        text = (
            f"round {self.round_no} started {self.started} trees, {self.failed} of them failed by acker-ctl fail or"
            " a time limit, and none started or ended since, but its job still runs: a task hangs; cancelling it"
        )
        if self.silent:
            text += (
                " (no lease renewal reached the ackers for as long as the backstop either: the executors may be"
                " cut from the ackers for longer than the message timeout, or run without leases; its records are"
                " replayed)"
            )
        return text


class HungRoundCheck:
    """Watches round ``round_no`` of ``checkpoint``; give :meth:`observe` to the outcome feed's taps."""

    def __init__(
        self,
        checkpoint: str | Path,
        round_no: int,
        clock: Callable[[], float],
        grace: float = 2.0,
        time_limit_errors: frozenset[str] = TIME_LIMIT_ERRORS,
        silent_after: float | None = None,
        shard_count: int = 1,
    ) -> None:
        self.checkpoint = checkpoint
        self.round_no = round_no
        self.folder = round_dir(checkpoint, round_no)
        self.clock = clock
        self.grace = grace
        # A quiet round with pending trees and no renewal heard is cancelled only after this long (None: never).
        self.silent_after = silent_after
        # Renewals are looked for per shard (root % shard_count): one paused acker's trees are not
        # renewed while the others' are, and that round waits for the acker, it does not hang.
        self.shard_count = max(1, shard_count)
        self.time_limit_errors = time_limit_errors
        self.causes = CauseReader(checkpoint)
        self._lock = threading.Lock()
        self._failed: list[np.ndarray] = []
        self._ended: list[np.ndarray] = []  # every root that ended (to tell whether trees are still pending)
        self._renewed: dict[int, float] = {}  # shard -> when a lease renewal (TIMEOUT_RESET) of its trees arrived
        self._sizes: tuple[tuple[str, int], ...] = ()
        self._started = np.zeros(0, dtype=np.uint64)
        self._stale = False  # an emission file grew since the roots were last read
        self._changed = clock()

    def observe(self, roots: np.ndarray, outcomes: np.ndarray) -> None:
        """The outcome feed's tap: note that trees still end (which FAILED), or that leases are renewed."""
        resets = outcomes == _RESET
        with self._lock:
            if resets.any():
                now = self.clock()  # a task holding trees is alive and reaches these shards
                for shard in np.unique(roots[resets] % np.uint64(self.shard_count)).tolist():
                    self._renewed[int(shard)] = now
                if resets.all():
                    return
                roots, outcomes = roots[~resets], outcomes[~resets]
            failed = roots[outcomes == _FAILED]
            if len(failed):
                self._failed.append(failed)
            self._ended.append(roots)
            self._changed = self.clock()  # trees still end: the job is not hung

    def __call__(self) -> HungRound | None:
        """The verdict if the round hangs after some of its trees were failed from outside, else None.

        Called ten times a second while the round's job runs: until a tree
        failed and the round was quiet for the grace, it only lists the
        emission files' sizes (a task still reading is not hung). The roots
        are read (the whole round's log, sorted) only then, and again only
        after a file grew: a healthy round costs no work per record here.
        """
        self._note_growth()
        with self._lock:
            now = self.clock()
            quiet_since = self._changed
            if not self._failed or now - quiet_since < self.grace:
                return None
            failed = distinct(np.concatenate(self._failed))
            self._failed = [failed]
            ended = distinct(np.concatenate(self._ended)) if self._ended else failed[:0]
            self._ended = [ended]
            renewed = {s for s, at in self._renewed.items() if at >= quiet_since}
        started = self._started_roots()
        if not len(started):
            return None
        pending = started[~member_of(started, ended)]
        silent = False
        waiting_on = set(np.unique(pending % np.uint64(self.shard_count)).tolist()) - renewed
        if waiting_on:
            # Trees pending and none of their tasks heard from: cut from the ackers (riding it out), or leases off.
            if self.silent_after is None or now - quiet_since < max(self.grace, self.silent_after):
                return None
            silent = True
        causes = self.causes.refresh()
        outside = [
            r
            for r in failed[np.isin(failed, started)].tolist()
            if r not in causes or error_type(causes[r]) in self.time_limit_errors
        ]
        if not outside:
            return None
        return HungRound(self.round_no, len(started), len(outside), silent)

    def _note_growth(self) -> None:
        """If an emission file appeared or grew since the last look: trees are still started, the round is not quiet."""
        names = sorted(os.listdir(self.folder)) if self.folder.is_dir() else []
        sizes = tuple((name, (self.folder / name).stat().st_size) for name in names)
        if sizes != self._sizes:
            self._sizes = sizes
            self._stale = True
            with self._lock:
                self._changed = self.clock()

    def _started_roots(self) -> np.ndarray:
        """The roots the round started so far (read again only when an emission file grew)."""
        if self._stale:
            self._stale = False
            self._started = read_round(self.checkpoint, self.round_no).roots
        return self._started
