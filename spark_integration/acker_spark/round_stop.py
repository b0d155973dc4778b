"""The driver's request that the running round's tasks stop: a marker file in the checkpoint, read per batch.

Cancelling a Spark job group kills its tasks, but a task's Python worker goes
on with the batches it holds until Spark gets to kill it (about half a second
on a busy machine: thousands of records). When the driver stops a round (the
failure budget passed) it also writes ``stop`` into the checkpoint; the
source reader and the ``ArrowBolt`` of a task running under that checkpoint
look for it before each batch (at most every ``every`` seconds: one ``stat``)
and end the task with :class:`RoundStopped`, so at most the batch in hand is
processed after the request. The driver removes the marker before the next
round starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["STOP_FILE", "RoundStopped", "StopCheck", "clear_stop", "request_stop"]

STOP_FILE = "stop"


class RoundStopped(RuntimeError):
    """The driver asked the round's tasks to stop (the task ends; the driver replays what it left unfinished)."""


def request_stop(checkpoint: str | Path, reason: str) -> None:
    """Ask every task of the running round to stop before its next batch."""
    path = Path(checkpoint) / STOP_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(reason)
    os.replace(tmp, path)


def clear_stop(checkpoint: str | Path) -> None:
    """Let the next round's tasks run (before its job starts)."""
    (Path(checkpoint) / STOP_FILE).unlink(missing_ok=True)


class StopCheck:
    """Per task: :meth:`__call__` raises :class:`RoundStopped` once the driver asked (checked every ``every`` s)."""

    def __init__(self, checkpoint: str | Path | None, every: float = 0.05) -> None:
        self.path = Path(checkpoint) / STOP_FILE if checkpoint else None
        self.every = every
        self._next = 0.0

    def __call__(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        if self.path.exists():
            raise RoundStopped(f"the pipeline stopped this round: {self.path.read_text(errors='replace')}")
