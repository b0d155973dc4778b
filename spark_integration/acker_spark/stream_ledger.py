"""The streaming source's progress table: one row per delivery and its outcome, readable from any process.

The stream reader's spout lives in a process Spark starts for it, not in the
user's driver; it records every delivery's outcome here (next to the
``dead_letters`` table) so that the driver, a monitor or a test can see which
records are settled. The way back: the driver's ``foreachBatch`` function calls
:func:`record_commit_errors`, which stores what the bolts' executors could not
deliver (``commit_errors`` per bolt, ``undelivered_roots``); the spout then
records those trees' timeouts as ``ACKS_UNDELIVERED``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from acker_protocol.wire import Outcome

from .sqlite import open_db

__all__ = ["StreamDelivery", "StreamLedger", "record_commit_errors"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_deliveries (
    run        TEXT NOT NULL,     -- the reader that emitted it (a restarted query reads its source again)
    record_key TEXT NOT NULL,
    attempt    INTEGER NOT NULL,  -- 1 = first delivery
    outcome    TEXT NOT NULL,     -- ACKED, FAILED, TIMED_OUT, LOST or ACKS_UNDELIVERED
    final      INTEGER NOT NULL,  -- 1 when the record is settled by it (acked or dead-lettered)
    at         REAL NOT NULL,     -- seconds since the epoch
    PRIMARY KEY (run, record_key, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commit_errors (
    bolt       TEXT PRIMARY KEY,  -- the Bolt's name
    errors     INTEGER NOT NULL,  -- task commits whose acks could not be delivered (this driver's total)
    causes     TEXT NOT NULL,     -- the unreachable shards, one per line
    at         REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS undelivered_roots (
    root       TEXT PRIMARY KEY   -- a tree whose acks were dropped, as 16 hex digits (ids are unsigned 64-bit)
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
            conn.executescript(_SCHEMA)

    def record(self, run: str, key: str, attempt: int, outcome: Outcome, *, final: bool, at: float) -> None:
        """Store one delivery's outcome (a second outcome for the same delivery of a run is an error)."""
        with open_db(self.path) as conn:
            conn.execute(
                "INSERT INTO stream_deliveries VALUES (?, ?, ?, ?, ?, ?)",
                (run, key, attempt, outcome.name, int(final), at),
            )

    def record_many(
        self,
        run: str,
        outcomes: Iterable[tuple[str, int, Outcome, bool]],
        *,
        at: float,
        roots: Sequence[Iterable[int]] | None = None,
    ) -> list[Outcome]:
        """Store ``(key, attempt, outcome, final)`` rows of one run as :meth:`record` does, in one transaction.

        With ``roots`` (row i's tree roots), a TIMED_OUT or LOST row whose tree had
        its acks dropped by an executor is stored as ACKS_UNDELIVERED, checked in
        the same transaction. Returns the outcomes as stored, row by row.
        """
        batch = list(outcomes)
        if not batch:
            return []
        with open_db(self.path) as conn:
            stored = [outcome for _, _, outcome, _ in batch]
            if roots is not None:
                stored = [
                    Outcome.ACKS_UNDELIVERED
                    if outcome in (Outcome.TIMED_OUT, Outcome.LOST) and _any_undelivered(conn, tree_roots)
                    else outcome
                    for outcome, tree_roots in zip(stored, roots)
                ]
            conn.executemany(
                "INSERT INTO stream_deliveries VALUES (?, ?, ?, ?, ?, ?)",
                [(run, key, attempt, o.name, int(final), at) for (key, attempt, _, final), o in zip(batch, stored)],
            )
        return stored

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

    def add_commit_errors(self, errors: dict[str, tuple[int, Iterable[str]]], roots: Iterable[int]) -> None:
        """Store each bolt's commit-error total and causes, and the roots whose acks were dropped."""
        now = time.time()
        with open_db(self.path) as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO commit_errors VALUES (?, ?, ?, ?)",
                [(bolt, n, "\n".join(causes), now) for bolt, (n, causes) in errors.items()],
            )
            conn.executemany("INSERT OR IGNORE INTO undelivered_roots VALUES (?)", [(f"{r:016x}",) for r in roots])

    def commit_errors(self) -> dict[str, int]:
        """Task commits whose acks could not be delivered, by bolt name (as the driver last recorded them)."""
        with open_db(self.path) as conn:
            return dict(conn.execute("SELECT bolt, errors FROM commit_errors ORDER BY bolt").fetchall())

    def undelivered(self, roots: Iterable[int]) -> bool:
        """True if any of ``roots`` had its acks dropped by an executor."""
        with open_db(self.path) as conn:
            return _any_undelivered(conn, roots)


def _any_undelivered(conn: sqlite3.Connection, roots: Iterable[int]) -> bool:
    keys = [f"{r:016x}" for r in roots]
    if not keys:
        return False
    marks = ", ".join("?" for _ in keys)
    query = f"SELECT 1 FROM undelivered_roots WHERE root IN ({marks}) LIMIT 1"
    return conn.execute(query, keys).fetchone() is not None


def record_commit_errors(database: str | Path) -> dict[str, int]:
    """Driver side, in a ``foreachBatch`` function after its actions: store the bolts' commit errors.

    The stream's spout (in Spark's planning process) reads them back: the trees
    whose acks an executor could not deliver then end as ``ACKS_UNDELIVERED``
    (progress table and dead letters) instead of ``TIMED_OUT``. Returns the
    commit errors per bolt name, so the function can raise or warn.
    """
    from .executor import commit_errors

    reports = commit_errors()
    if reports:
        roots = frozenset().union(*(r.roots for r in reports.values()))
        StreamLedger(database).add_commit_errors({n: (r.errors, r.causes) for n, r in reports.items()}, roots)
    return {name: report.errors for name, report in reports.items()}
