"""The round watch: checks that run while a round's Spark job runs, and cancel the job when one says so.

A round's job runs synchronously in the driver thread, so nothing the driver
does between rounds can stop a job that should stop now: a job whose records
fail past the run's failure budget, or one whose only unfinished trees were
failed by a time limit or ``acker-ctl fail``. A :class:`RoundWatch` runs its
checks every ``interval`` seconds on a thread of its own while the job runs.
A check is any callable returning None (carry on) or a verdict (any object
saying why the round must stop); the first verdict cancels the round's job
(:class:`~acker_spark.executor_read.job_group.JobGroup`) and is kept for the driver, which
decides what to do once the job has returned (raise, replay...).

The clock is injected, and :meth:`RoundWatch.tick` runs the checks once
without the thread, so the rules are tested without Spark or sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

__all__ = ["Check", "RoundWatch"]

log = logging.getLogger(__name__)

Check = Callable[[], Any]
"""A check: None to let the round's job run on, or a verdict (why it must stop)."""


class RoundWatch:
    """Runs ``checks`` every ``interval`` seconds while a job runs; calls ``cancel`` once, on the first verdict.

    ``with RoundWatch(...) as watch: job()`` starts the thread and stops it
    when the job returns. ``verdict`` is the verdict that cancelled the job
    (None if none did) and ``decided_at`` the clock's time when it came.
    """

    def __init__(
        self,
        checks: Sequence[Check],
        cancel: Callable[[], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
    ) -> None:
        self.checks = list(checks)
        self.cancel = cancel
        self.clock = clock
        self.interval = interval
        self.verdict: Any = None
        self.decided_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> Any:
        """Run every check once (until one gives a verdict); cancel the job on the first verdict; return it."""
        if self.verdict is not None:
            return self.verdict
        for check in self.checks:
            verdict = check()
            if verdict is not None:
                self.verdict, self.decided_at = verdict, self.clock()
                log.warning("cancelling the round's Spark job: %s", verdict)
                self.cancel()
                return verdict
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.tick() is not None:
                    return
            except Exception:  # noqa: BLE001 - a broken check must not end the watch silently
                log.exception("a round check failed; the round's job runs on unwatched")
                return

    def __enter__(self) -> RoundWatch:
        if self.checks:
            self._thread = threading.Thread(target=self._loop, name="acker-round-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
