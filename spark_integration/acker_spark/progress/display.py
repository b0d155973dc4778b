"""Shows a run's progress while it runs: a rich progress bar on a terminal, a log line otherwise, and progress.json.

:class:`ProgressReporter` runs a small daemon thread that every ``interval``
seconds asks for the run's :class:`~acker_spark.progress.figures.Baseline` and
:class:`~acker_spark.progress.figures.Live` counts, makes the figures, writes them
to the checkpoint every ``file_interval`` seconds, and shows them: a bar
(``mode="bar"``) or an INFO line every ``log_interval`` seconds while a Spark
job runs (``mode="log"``; between jobs the pipeline's own progress line
speaks). It is a thread because a round's Spark job runs synchronously in the
driver thread: without it nothing would move until the job ended. Tests call
:meth:`ProgressReporter.tick` with their own clocks instead of starting it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from .figures import Baseline, Live, ProgressFigures, ProgressMeter, write_progress

__all__ = ["ProgressMode", "ProgressReporter", "resolve_mode"]

ProgressMode = Literal["auto", "bar", "log"] | None


def resolve_mode(progress: ProgressMode, stream: Any = None) -> Literal["bar", "log"] | None:
    """``"auto"``: a bar when ``stream`` (default stderr) is a terminal, else log lines; None shows nothing."""
    if progress not in ("auto", "bar", "log", None):
        raise ValueError(f'progress must be "auto", "bar", "log" or None, got {progress!r}')
    if progress != "auto":
        return progress
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "log"


class ProgressReporter:
    """Makes, writes and shows a run's figures every ``interval`` seconds on its own thread (see the module)."""

    def __init__(
        self,
        meter: ProgressMeter,
        baseline: Callable[[], Baseline],
        live: Callable[[Baseline], Live],
        *,
        checkpoint: str | Path | None,
        mode: Literal["bar", "log"] | None,
        logger: logging.Logger,
        interval: float = 0.5,
        file_interval: float = 2.0,
        log_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        console: Any = None,
        waiting: Callable[[float], str] | None = None,
    ) -> None:
        self.meter = meter
        self.baseline = baseline
        self.live = live
        self.checkpoint = checkpoint
        self.mode = mode
        self.logger = logger
        self.interval = interval
        self.file_interval = file_interval
        self.log_interval = log_interval
        self.clock = clock
        self.wall = wall
        self.console = console  # the bar's rich Console (None: one on stderr)
        # What the run waits on now (a shard down), added to the log line; empty when nothing.
        self.waiting = waiting
        self.last: ProgressFigures | None = None
        self._written_at: float | None = None
        self._logged_at: float | None = None
        self._bar: Any = None
        self._task: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # tick() from the thread and from stop()

    def start(self) -> ProgressReporter:
        """Open the bar (``mode="bar"``) and start the thread."""
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            # A short bar and the compact figures: one line within 80 columns (the full line goes to the logs).
            self._bar = Progress(
                BarColumn(bar_width=12),
                TextColumn("{task.fields[figures]}"),
                console=self.console if self.console is not None else Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task("records", total=None, figures="starting")
            self._bar.start()
        self._thread = threading.Thread(target=self._loop, name="acker-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a view of the run must never end it
                self.logger.debug("progress: could not make or write the figures", exc_info=True)

    def tick(self, state: str = "running") -> ProgressFigures:
        """Make the figures now; write the file if due (always when not running); show them."""
        with self._lock:
            base = self.baseline()
            figures = self.meter.figures(base, self.live(base), self.wall(), state)
            self.last = figures
            now = self.clock()
            if self.checkpoint is not None and (
                state != "running" or self._written_at is None or now - self._written_at >= self.file_interval
            ):
                write_progress(self.checkpoint, figures)
                self._written_at = now
            self._show(figures, now)
            return figures

    def _show(self, figures: ProgressFigures, now: float) -> None:
        if self._bar is not None:
            ended = figures.acked + figures.dead
            self._bar.update(self._task, total=figures.records, completed=ended, figures=figures.compact())
            return
        if self.mode != "log" or not figures.in_job:
            return  # between jobs the pipeline's own progress line speaks
        if self._logged_at is None:
            self._logged_at = now  # a short job logs nothing
            return
        if now - self._logged_at >= self.log_interval:
            self._logged_at = now
            waiting = self.waiting(now) if self.waiting is not None else ""
            self.logger.info("run progress: %s%s", figures.line(), f"; {waiting}" if waiting else "")

    def stop(self, state: str = "finished") -> ProgressFigures | None:
        """Stop the thread, write the last figures with ``state`` (``finished``/``stopped``), close the bar."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        figures = None
        try:
            figures = self.tick(state)
        finally:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
        return figures
