"""The streaming source's progress table: one row per delivery and its outcome, readable from any process.

The stream reader's spout lives in a process Spark starts for it, not in the
user's driver; it records every delivery's outcome here (next to the
``dead_letters`` table) so that the driver, a monitor or a test can see which
records are settled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from acker_protocol.wire import Outcome

from .sqlite import open_db

__all__ = ["StreamDelivery", "StreamLedger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_deliveries (
    run        TEXT NOT NULL,     -- the reader that emitted it (a restarted query reads its source again)
    record_key TEXT NOT NULL,
    attempt    INTEGER NOT NULL,  -- 1 = first delivery
    outcome    TEXT NOT NULL,     -- ACKED, FAILED, TIMED_OUT or LOST
    final      INTEGER NOT NULL,  -- 1 when the record is settled by it (acked or dead-lettered)
    at         REAL NOT NULL,     -- seconds since the epoch
    PRIMARY KEY (run, record_key, attempt)
) WITHOUT ROWID
"""


@dataclass(frozen=True)
class StreamDelivery:
    """One delivery of a record and how it ended."""

    run: str
    key: str
    attempt: int
    outcome: Outcome
    final: bool


class StreamLedger:
    """The ``stream_deliveries`` table of an SQLite file; each call uses its own short connection."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open_db(self.path) as conn:
            conn.execute(_SCHEMA)

    def record(self, run: str, key: str, attempt: int, outcome: Outcome, *, final: bool, at: float) -> None:
        """Store one delivery's outcome (a second outcome for the same delivery of a run is an error)."""
        with open_db(self.path) as conn:
            conn.execute(
                "INSERT INTO stream_deliveries VALUES (?, ?, ?, ?, ?, ?)",
                (run, key, attempt, outcome.name, int(final), at),
            )

    def record_many(self, run: str, outcomes: Iterable[tuple[str, int, Outcome, bool]], *, at: float) -> int:
        """Store ``(key, attempt, outcome, final)`` rows of one run as :meth:`record` does, in one transaction."""
        rows = [(run, key, attempt, outcome.name, int(final), at) for key, attempt, outcome, final in outcomes]
        if rows:
            with open_db(self.path) as conn:
                conn.executemany("INSERT INTO stream_deliveries VALUES (?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def deliveries(self) -> list[StreamDelivery]:
        """Every recorded delivery, ordered by time of outcome."""
        with open_db(self.path) as conn:
            rows = conn.execute(
                "SELECT run, record_key, attempt, outcome, final FROM stream_deliveries ORDER BY at, record_key"
            ).fetchall()
        return [
            StreamDelivery(run, key, attempt, Outcome[outcome], bool(final))
            for run, key, attempt, outcome, final in rows
        ]

    def settled_keys(self) -> set[str]:
        """The keys of the records that were acked or dead-lettered."""
        with open_db(self.path) as conn:
            return {key for (key,) in conn.execute("SELECT record_key FROM stream_deliveries WHERE final = 1")}
