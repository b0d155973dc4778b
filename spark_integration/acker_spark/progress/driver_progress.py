"""A driver's progress while it runs: the baseline it publishes, the reporter thread, its log line between jobs.

The driver thread holds the book, so only it can say what a run's counts are
at a consistent point: :meth:`DriverProgress.publish` turns its stats into the
:class:`~acker_spark.progress.figures.Baseline` the reporter thread
(:class:`~acker_spark.progress.display.ProgressReporter`: the bar, the log
line while a job runs, ``progress.json``) adds live counts to. Between jobs,
:class:`ProgressLine` logs one INFO line per interval with the counts and the
shards the driver waits on; :meth:`DriverProgress.report` hands the stats to
the user's ``on_progress``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from .display import ProgressReporter
from .figures import Baseline, Live, ProgressMeter

__all__ = ["DriverProgress", "ProgressLine", "waiting_on"]


class _Watch(Protocol):
    """The shards a driver waits on (a :class:`~acker_spark.executor_read.shard_watch.ShardWatch`)."""

    def down(self) -> list[Any]:
        """The shards unreachable now, each with ``shard``, ``address``, ``since`` and ``cause``."""
        ...


class _Feed(Protocol):
    """The outcome feed's totals: ``(acked, failed)`` received, and taken into the book."""

    def counts(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(arrived, taken)``, each ``(acked, failed)``."""
        ...


class _RoundRows(Protocol):
    """The rows a running round's readers logged so far."""

    def count(self, round_no: int) -> int:
        """Rows the round ``round_no`` logged."""
        ...


def waiting_on(watch: _Watch, now: float) -> str:
    """The shards a driver waits on, for a progress line: empty when every shard answers."""
    return "; ".join(
        f"waiting on shard {d.shard} at {d.address}, unreachable for {now - d.since:.0f} s: {d.cause}"
        for d in watch.down()
    )


class ProgressLine:
    """While a driver waits: one INFO line per ``interval`` seconds with its counts and the shards it waits on.

    The first :meth:`tick` only starts the interval, so a run that waits
    briefly logs nothing. ``stats()`` (any object with ``acked``,
    ``dead_lettered``, ``pending`` and ``awaiting_replay``) is called only
    when a line is due.
    """

    def __init__(self, logger: logging.Logger, watch: _Watch, interval: float, clock: Callable[[], float]) -> None:
        self.logger = logger
        self.watch = watch
        self.interval = interval
        self.clock = clock
        self._logged_at: float | None = None

    def tick(self, stats: Callable[[], Any]) -> None:
        """Log the progress line if ``interval`` seconds passed since the last one (or since the first tick)."""
        now = self.clock()
        if self._logged_at is None:
            self._logged_at = now
            return
        if now - self._logged_at < self.interval:
            return
        self._logged_at = now
        counts = stats()
        waiting = waiting_on(self.watch, now)
        self.logger.info(
            "progress: %d acked, %d dead-lettered, %d pending, %d awaiting replay%s",
            counts.acked,
            counts.dead_lettered,
            counts.pending,
            counts.awaiting_replay,
            f"; {waiting}" if waiting else "",
        )


class DriverProgress:
    """A driver's view of its run: publishes baselines, runs the reporter, logs between jobs (see the module).

    ``mode`` is the resolved progress mode (``"bar"``, ``"log"`` or None);
    ``on_progress`` the user's callback, called between rounds.
    """

    def __init__(
        self,
        logger: logging.Logger,
        watch: _Watch,
        *,
        mode: Literal["bar", "log"] | None,
        file_interval: float,
        log_interval: float,
        clock: Callable[[], float],
        on_progress: Callable[[Any], None] | None = None,
    ) -> None:
        self.logger = logger
        self.watch = watch
        self.mode = mode
        self.file_interval = file_interval
        self.log_interval = log_interval
        self.clock = clock
        self.on_progress = on_progress
        self._line = ProgressLine(logger, watch, log_interval, clock)
        self._baseline = Baseline()  # replaced whole by the driver thread, read by the reporter's
        self._published_at: float | None = None
        self._reporter: ProgressReporter | None = None
        self._feed: _Feed | None = None
        self._rows: _RoundRows | None = None

    @property
    def interval(self) -> float:
        """How often the reporter looks (0 when none runs): publishing more often than that shows nothing new."""
        return self._reporter.interval if self._reporter is not None else 0.0

    def due(self, every: float) -> bool:
        """True unless a baseline was published less than ``every`` seconds ago (then the caller skips filling one)."""
        now = self.clock()
        if every and self._published_at is not None and now - self._published_at < every:
            return False
        self._published_at = now
        return True

    def publish(
        self,
        stats: Any,
        taken: tuple[int, int],
        *,
        records: int | None,
        round_no: int,
        in_job: bool,
        first_read: bool,
    ) -> None:
        """Driver thread, where the book is consistent: the baseline the reporter adds live counts to.

        ``stats`` are the run's filled stats, ``taken`` the feed's ``(acked,
        failed)`` outcomes already settled into them, ``records`` how many the
        source holds when known.
        """
        self._baseline = Baseline(
            read=stats.emitted,
            acked=stats.acked,
            pending=stats.pending,
            replaying=stats.awaiting_replay,
            dead=stats.dead_lettered,
            records=records,
            round=round_no,
            in_job=in_job,
            first_read=first_read,
            acked_taken=taken[0],
            failed_taken=taken[1],
        )

    def start(self, name: str, checkpoint: Path, feed: _Feed, rows: _RoundRows) -> None:
        """Start the reporter thread (bar, log lines, progress.json) of run ``name``, once a baseline is published."""
        self._feed, self._rows = feed, rows
        meter = ProgressMeter(name, self.clock, stale_after=max(10.0, 5 * self.file_interval))
        self._reporter = ProgressReporter(
            meter,
            lambda: self._baseline,
            self._live,
            checkpoint=checkpoint,
            mode=self.mode,
            logger=self.logger,
            file_interval=self.file_interval,
            log_interval=self.log_interval,
            clock=self.clock,
            # A shard down mid-job holds the job until it answers or the bound passes: the line says why.
            waiting=lambda now: waiting_on(self.watch, now),
        ).start()

    def stop(self, state: str, last: Callable[[], None]) -> None:
        """Publish the last baseline (``last()``) and write it with ``state`` (``finished`` or ``stopped``).

        A failure here must not hide the run's own error: it is logged only.
        """
        if self._reporter is None:
            return
        try:
            last()
            self._reporter.stop(state)
        except Exception:  # noqa: BLE001 - the view of the run, not the run
            self.logger.warning("could not write the run's last progress figures", exc_info=True)
        self._reporter = None

    def _live(self, base: Baseline) -> Live:
        """Reporter thread: the outcomes the feed received, and the running round's rows logged so far."""
        assert self._feed is not None, "started with its feed"
        arrived, _ = self._feed.counts()
        started = self._rows.count(base.round) if base.in_job and self._rows is not None else 0
        return Live(started, *arrived)

    def log_line(self, stats: Callable[[], Any]) -> None:
        """While the driver waits: one INFO line per ``log_interval`` with the counts and any shard it waits on."""
        if self.mode == "bar" and not self.watch.down():
            return  # the bar shows the counts; a shard it waits on still gets its line
        self._line.tick(stats)

    def report(self, stats: Callable[[], Any]) -> None:
        """Between rounds: hand the run's filled stats to ``on_progress``, if there is one."""
        if self.on_progress is not None:
            self.on_progress(stats())
