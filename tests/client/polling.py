"""Polling for conditions that background threads (flushers, outcome streams) make true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str = "the condition", timeout: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms; fail naming ``what`` after ``timeout`` seconds (a bound, not a speed check)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(0.01)
