"""A per-call time limit for a bolt's function: SIGALRM raises :class:`RecordTimeLimit` inside a call that hangs.

PySpark runs a ``mapInArrow`` function in the Python worker's main thread (the
worker process is single-threaded for the user's code; checked by
tests/spark/test_time_limit.py), and POSIX delivers ``SIGALRM`` to the main
thread, where Python runs its handler between bytecodes and interrupts
blocking calls such as ``time.sleep`` or a socket read. So a timer armed
around the call raises inside whatever the function is stuck in, and the
bolt's isolation (halves of the batch, then one row) finds the slow record and
fails it alone with ``RecordTimeLimit: ...`` as its cause. ``RecordTimeLimit``
is a ``TimeoutError``: a slow record is retried as a timeout, not
dead-lettered as poison.

What it cannot interrupt: C code that holds the interpreter without checking
for signals (a long numpy operation), which ends first. Outside a main thread
(a function called from a thread of the user's), ``signal`` cannot be used:
the call runs without a limit and a warning says so once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["RecordTimeLimit", "call_time_limit"]

log = logging.getLogger("acker_spark.executor")

_warned = False
_SLACK = 1e-3  # seconds: a timer is not exact; an outer deadline this close to ours is ours


class RecordTimeLimit(TimeoutError):
    """A call of a bolt's function ran past the bolt's ``time_limit`` (raised inside it by a timer)."""


@contextmanager
def call_time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`RecordTimeLimit` inside the ``with`` body if it runs longer than ``seconds`` (None: no limit)."""
    global _warned
    if seconds is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        if not _warned:
            _warned = True
            log.warning("%s: time_limit needs the process's main thread (SIGALRM); running without a limit", what)
        yield
        return

    # A timer someone else armed (pytest-timeout, the user's own) keeps its deadline: it fires through
    # our handler if it comes first, and is armed again for what is left of it afterwards.
    start = time.monotonic()
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_deadline = start + outer_left if outer_left > 0 else None
    ours = start + seconds

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if outer_deadline is not None and outer_deadline <= now < ours - _SLACK:
            signal.setitimer(signal.ITIMER_REAL, ours - now)  # ours again, after the outer one's turn
            if callable(previous):
                previous(signum, frame)
            return
        # The place is in the cause already: its traceback ends where the call was stuck (_drop_handler_frame).
        raise RecordTimeLimit(f"{what} ran past its time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left > 0 else seconds)
    try:
        yield
    except RecordTimeLimit as err:
        _drop_handler_frame(err)
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_deadline is not None:
            left = outer_deadline - time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, max(left, _SLACK), outer_interval)


def _drop_handler_frame(err: BaseException) -> None:
    """The cause names where the call was stuck (the last frame before the handler), not the handler itself."""
    tb = err.__traceback__
    if tb is None or tb.tb_next is None:
        return
    while tb.tb_next is not None and tb.tb_next.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_next is not None and tb.tb_next.tb_frame.f_code.co_name == "on_alarm":
        tb.tb_next = None
