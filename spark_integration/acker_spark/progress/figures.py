"""A run's progress figures: what the driver last settled plus what arrived since, with a rate and an ETA.

Pure bookkeeping (no thread, no clock of its own): the pipeline publishes a
:class:`Baseline` from its driver thread whenever its book is consistent
(between rounds, and as a round's Spark job starts), and a reporter thread
adds :class:`Live` counts it can read while the job runs (the outcomes the
feed received, the rows the job's readers logged) to make
:class:`ProgressFigures`. That is how progress moves *during* a Spark job,
while the driver thread is blocked in it. The figures are also what the
pipeline writes to its checkpoint as ``progress.json`` (:func:`write_progress`),
which ``acker-ctl progress --checkpoint DIR`` reads from another terminal.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROGRESS_FILE", "Baseline", "Live", "ProgressFigures", "ProgressMeter", "write_progress"]

PROGRESS_FILE = "progress.json"
"""The file in the checkpoint directory that holds the latest figures (replaced atomically)."""


@dataclass(frozen=True)
class Baseline:
    """What the driver thread knew at its last consistent point (record counts from its book).

    ``acked_taken``/``failed_taken``: the feed's outcomes already settled into
    these counts. ``first_read``: the running job reads records for the first
    time (its rows are new records, not replays). ``records``: how many the
    source holds, when known (an in-memory source's copy, or once it was read whole).
    """

    read: int = 0
    acked: int = 0
    pending: int = 0
    replaying: int = 0
    dead: int = 0
    records: int | None = None
    round: int = 0
    in_job: bool = False
    first_read: bool = True
    acked_taken: int = 0
    failed_taken: int = 0


@dataclass(frozen=True)
class Live:
    """What can be read while a job runs: rows its tasks started, outcomes the feed received (totals)."""

    started: int = 0
    acked_arrived: int = 0
    failed_arrived: int = 0


@dataclass(frozen=True)
class ProgressFigures:
    """One look at a run: the counts, the rate (records ended per second) and the ETA, as written to progress.json."""

    name: str
    state: str  # "running", "finished" or "stopped"
    read: int
    acked: int
    pending: int
    replaying: int
    dead: int
    records: int | None
    round: int
    in_job: bool
    rate: float  # records acked or dead-lettered per second, over the last window
    eta_seconds: float | None
    elapsed_seconds: float
    updated_at: float  # wall-clock time (seconds since the epoch): another process tells a stale file by it
    stale_after: float  # seconds after updated_at past which a "running" file means the driver is gone

    def as_json(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return asdict(self)

    def compact(self) -> str:
        """The figures in at most about 60 characters, for the bar beside them on an 80-column terminal."""
        of = f"/{_short(self.records)}" if self.records is not None else ""
        eta = f" ETA {_duration(self.eta_seconds)}" if self.eta_seconds is not None else ""
        return (
            f"read {_short(self.read)}{of} ok {_short(self.acked)} pend {_short(self.pending)}"
            f" retry {_short(self.replaying)} dead {_short(self.dead)} {_short(round(self.rate))}/s{eta}"
        )

    def line(self) -> str:
        """The figures as one line of text (the log line and the bar's text)."""
        of = f" of {self.records:,}" if self.records is not None else ""
        eta = f", ETA {self.eta_seconds:.0f} s" if self.eta_seconds is not None else ""
        job = f"round {self.round} running" if self.in_job else f"after round {self.round}"
        return (
            f"{self.read:,}{of} read, {self.acked:,} acked, {self.pending:,} pending, {self.replaying:,} replaying,"
            f" {self.dead:,} dead; {self.rate:,.0f} records/s{eta} ({job})"
        )


def _short(count: int) -> str:
    """A count in at most 5 characters: 950, 12.3k, 123k, 4.5M."""
    if count < 1_000:
        return str(count)
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if count >= size:
            value = count / size
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return str(count)


def _duration(seconds: float) -> str:
    """Seconds as ``45s``, ``12m05s`` or ``3h20m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class ProgressMeter:
    """Turns a baseline and live counts into figures; keeps the samples the rate is measured over.

    ``clock`` is monotonic seconds (the run's injected clock), ``window`` how
    many seconds back the rate looks.
    """

    def __init__(
        self,
        name: str,
        clock: Callable[[], float],
        *,
        window: float = 30.0,
        stale_after: float = 10.0,
        eta_after: float = 5.0,
    ) -> None:
        self.name = name
        self.clock = clock
        self.window = window
        # No ETA until the rate is measured over this many seconds: a resumed run's first seconds (a replay
        # round's backoff, then a burst) would swing it by hours.
        self.eta_after = eta_after
        self.stale_after = stale_after
        self.started = clock()
        self._samples: deque[tuple[float, int]] = deque()

    def figures(self, base: Baseline, live: Live, wall: float, state: str = "running") -> ProgressFigures:
        """The figures now: ``base`` plus what ``live`` adds since it (a running job's rows and outcomes)."""
        started = live.started if base.in_job else 0
        acked = max(0, live.acked_arrived - base.acked_taken)
        failed = max(0, live.failed_arrived - base.failed_taken)
        new_records = started if base.first_read else 0
        replays = 0 if base.first_read else started
        read = base.read + new_records
        figures_acked = base.acked + acked
        pending = max(0, base.pending + started - acked - failed)
        replaying = max(0, base.replaying + failed - replays)
        now = self.clock()
        ended = figures_acked + base.dead
        rate = self._rate(now, ended)
        records = base.records
        eta = None
        if records is not None and rate > 0 and now - self._samples[0][0] >= self.eta_after:
            eta = max(0.0, (records - ended) / rate)
        return ProgressFigures(
            name=self.name,
            state=state,
            read=read,
            acked=figures_acked,
            pending=pending,
            replaying=replaying,
            dead=base.dead,
            records=records,
            round=base.round,
            in_job=base.in_job,
            rate=rate,
            eta_seconds=eta,
            elapsed_seconds=now - self.started,
            updated_at=wall,
            stale_after=self.stale_after,
        )

    def _rate(self, now: float, ended: int) -> float:
        """Records ended per second over the window (0 until two samples are apart)."""
        self._samples.append((now, ended))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window:
            self._samples.popleft()
        first_time, first_ended = self._samples[0]
        if now <= first_time:
            return 0.0
        return max(0.0, (ended - first_ended) / (now - first_time))


def write_progress(checkpoint: str | Path, figures: ProgressFigures) -> None:
    """Replace ``progress.json`` in the checkpoint with ``figures`` (write, then rename: never a torn file).

    No fsync: the file is a view for operators, rewritten every few seconds,
    and a crash that loses the last one loses nothing of the run.
    """
    path = Path(checkpoint) / PROGRESS_FILE
    tmp = path.with_name(f".{PROGRESS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(figures.as_json()))
    os.replace(tmp, path)
