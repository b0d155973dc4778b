"""Redrive: dead letters sent through the job again as new deliveries, each at most once, at a chosen rate.

After the cause of some dead letters is fixed, :class:`Redrive` takes a
selection of them (:class:`~acker_spark.dead_letter.Select`: by cause kind, by
key, or all) and runs it through the job again, in chunks, each chunk a run of
its own under the redrive's folder (for :class:`SourcePipeline`, a checkpoint
per chunk). Where exactly-once per dead letter comes from:

1. The redrive records itself and claims its letters in one transaction
   (``redrive_status = redriving``, its ``redrive_id``): from then on no other
   redrive takes them, and a killed redrive's claim is still there.
2. A chunk is a fixed slice of the claimed letters (ordered by key, the chunk
   size stored with the redrive), run by a pipeline with a checkpoint of its
   own: the redriven deliveries are new trees tracked by the acker like any
   other, and a driver killed mid-chunk resumes that checkpoint, so no
   redriven record acked before the kill is processed again.
3. When a chunk's run returns (every record acked or dead), its outcomes are
   written in one transaction: ``acked``, or ``dead`` with the new cause.
   A kill before that write leaves the chunk's letters ``redriving``; the next
   redrive resumes the same chunk's checkpoint, whose run ends at once, and
   writes them then.

A second :meth:`Redrive.run` on the same store therefore finishes the killed
redrive (chunks already recorded are skipped) instead of starting a new one.

``rate`` caps the records sent per second: a chunk of ``rate * chunk_seconds``
records starts only when the records before it, at that rate, would have
taken the time since the redrive started (uncapped: one chunk). Within a chunk
the records go as fast as the job takes them: the cap holds chunk by chunk, so
a redrive of few chunks averages above it (30,000 letters at 2,000/s in chunks
of 20,000: 2,207/s). The clock and the sleep are injected, so tests observe
the pacing without waiting.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acker_client import new_id

from .dead_letter import ACKED, DEAD, DeadLetterStore, Select
from .run_report import RunError

__all__ = [
    "ChunkRunner",
    "Redrive",
    "RedriveChunk",
    "RedriveRefused",
    "RedriveReport",
    "RedriveUnfinished",
    "Select",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedriveChunk:
    """A chunk's letters: their keys, ordered, and their stored records as JSON text (parsed by the runner)."""

    keys: list[str]
    records: list[str]

    def values(self) -> list[Any]:
        """The records as Python values."""
        return [json.loads(record) for record in self.records]


ChunkRunner = Callable[[RedriveChunk, Path], Mapping[str, str | None]]
"""``run(chunk, folder)``: send the chunk's letters through the job as new deliveries, with ``folder`` for the
run's state (the same folder when a killed chunk is resumed); returns the keys that died again, with their
causes. Every other letter of the chunk was acked."""

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class RedriveRefused(RunError, TypeError):
    """The job was found wrong before the redrive sent a letter (see :mod:`acker_spark.executor_read.job_check`)."""


class RedriveUnfinished(RunError, RuntimeError):
    """A redrive of another selection was started and not finished: it must be finished (or abandoned) first."""


@dataclass
class RedriveReport:
    """What a redrive did: its id, the letters it claimed, how they ended, and how long it took."""

    redrive_id: str
    selection: str
    claimed: int = 0  # letters the redrive holds
    sent: int = 0  # letters this call redrove: sent through the job (chunks already recorded are not sent again)
    acked: int = 0  # of the claimed letters, acked (and, with an output, their rows committed)
    dead: int = 0  # of the claimed letters, dead again
    still_failing: int = 0  # of the claimed letters, without an outcome yet (a stopped chunk: run the redrive again)
    output: str = "none"  # where the redriven rows were committed
    resumed: bool = False  # this call finished a redrive a killed one had started
    seconds: float = 0.0
    causes: dict[str, int] = field(default_factory=dict)  # cause kinds of the letters that died again

    @property
    def records_per_s(self) -> float:
        """Letters sent per second of this call."""
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        """The report as plain data (for JSON)."""
        return {
            "redrive_id": self.redrive_id,
            "selection": self.selection,
            "claimed": self.claimed,
            "sent": self.sent,
            "redriven": self.sent,
            "acked": self.acked,
            "dead": self.dead,
            "still_failing": self.still_failing,
            "output": self.output,
            "resumed": self.resumed,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records_per_s, 1),
            "causes": self.causes,
        }


class Redrive:
    """One redrive of ``store``'s letters chosen by ``select``, run chunk by chunk by ``runner`` under ``folder``.

    ``select``: which letters (default ``Select()``, all); ``rate``: most letters sent per second (None: uncapped, one chunk);
    ``chunk_seconds``: how many seconds of letters, at ``rate``, one chunk
    holds; ``redrive_id``: the new redrive's name (default: generated).
    """

    def __init__(
        self,
        store: DeadLetterStore,
        runner: ChunkRunner,
        folder: str | Path,
        *,
        select: Select | None = None,
        rate: float | None = None,
        chunk_seconds: float = 10.0,
        redrive_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 records/s (or None for uncapped), got {rate!r}")
        if not chunk_seconds > 0:
            raise ValueError(f"chunk_seconds must be > 0, got {chunk_seconds!r}")
        if redrive_id is not None and not _ID.match(redrive_id):
            raise ValueError(f"a redrive id is 1-64 letters, digits, '_', '.' or '-', got {redrive_id!r}")
        select = Select() if select is None else select
        if not isinstance(select, Select):
            raise TypeError(f"select must be a Select(cause=..., keys=...), got {type(select).__name__}")
        self.store = store
        self.runner = runner
        self.folder = Path(folder)
        self.select = select
        self.rate = rate
        self.chunk_seconds = chunk_seconds
        self.redrive_id = redrive_id
        self.clock = clock
        self.sleep = sleep

    def run(self) -> RedriveReport:
        """Finish the store's unfinished redrive if there is one (it must have this selection), else start one."""
        started = self.clock()
        unfinished = self.store.unfinished_redrive()
        if unfinished is not None:
            if unfinished.selection != self.select.as_json():
                raise RedriveUnfinished(
                    f"redrive {unfinished.redrive_id} (selection {unfinished.selection}) was started and not "
                    f"finished: run it again with that selection to finish it (each letter at most once), or "
                    f"abandon it (DeadLetterStore.abandon_redrive) before redriving {self.select.describe()}"
                )
            redrive_id = unfinished.redrive_id
            log.info("resuming redrive %s (%s)", redrive_id, self.select.describe())
        else:
            redrive_id = self.redrive_id or f"r{new_id():016x}"
            chunk = max(1, math.ceil(self.rate * self.chunk_seconds)) if self.rate is not None else None
            count = self.store.start_redrive(redrive_id, self.select, chunk)
            log.info("redrive %s: %d dead letters (%s)", redrive_id, count, self.select.describe())
        report = RedriveReport(redrive_id, self.select.describe(), resumed=unfinished is not None)
        claimed = self.store.claimed_status(redrive_id)  # the same keys, in the same order, on every resume
        report.claimed = len(claimed)
        chunk = self.store.redrive(redrive_id).chunk  # fixed when the redrive started
        for number, start in enumerate(range(0, len(claimed), chunk)):
            part = claimed[start : start + chunk]
            if all(status in (ACKED, DEAD) for _, status in part):
                continue  # recorded by an earlier call
            self._pace(started, report.sent)
            first, last = part[0][0], part[-1][0]
            letters = RedriveChunk(*self.store.claimed_records(redrive_id, first, last))
            try:
                dead = dict(self.runner(letters, self.folder / redrive_id / f"chunk-{number:05d}"))
            except RedriveRefused as refused:
                if unfinished is not None or report.sent:
                    raise  # chunks were sent: the claim stays, the same redrive finishes them once fixed
                # Nothing was sent: the claim is released, as if the redrive had not started.
                released = self.store.abandon_redrive(redrive_id)
                raise type(refused)(
                    f"{refused}. The redrive was not started: its {released} letters are as they were"
                ) from refused
            unknown = set(dead).difference(letters.keys)
            if unknown:
                raise RuntimeError(f"the redrive's run reported keys it was not given: {sorted(unknown)[:5]}")
            self.store.mark(redrive_id, first, last, dead)
            report.sent += len(part)
        self.store.end_redrive(redrive_id)
        report.acked, report.causes = self.store.outcomes(redrive_id)
        report.dead = sum(report.causes.values())
        report.still_failing = report.claimed - report.acked - report.dead
        report.seconds = self.clock() - started
        log.info(
            "redrive %s: %d redriven, %d acked, %d dead again, %d still failing of %d claimed (%.1f s)",
            redrive_id,
            report.sent,
            report.acked,
            report.dead,
            report.still_failing,
            report.claimed,
            report.seconds,
        )
        return report

    def _pace(self, started: float, sent: int) -> None:
        """Wait until ``sent`` letters at ``rate`` would have taken the time since ``started``."""
        if self.rate is None:
            return
        wait = started + sent / self.rate - self.clock()
        if wait > 0:
            self.sleep(wait)
