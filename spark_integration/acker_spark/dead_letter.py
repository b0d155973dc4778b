"""The dead-letter table: records that failed on every allowed attempt, with the last reason and its cause."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acker_protocol.wire import Outcome

from .sqlite import open_db

__all__ = ["DeadLetter", "DeadLetterStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
    record_key TEXT PRIMARY KEY,
    record     TEXT NOT NULL,      -- the record's value as JSON (repr() for what JSON cannot hold)
    reason     TEXT NOT NULL,      -- the last failure: FAILED, TIMED_OUT or LOST
    attempts   INTEGER NOT NULL,   -- deliveries made, the last one included
    created_at REAL NOT NULL,      -- seconds since the epoch
    cause      TEXT                -- why, when known: the exception that convicted the record
) WITHOUT ROWID
"""

_COLUMNS = "(record_key, record, reason, attempts, created_at, cause)"


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered record as stored."""

    key: str
    record: Any
    reason: Outcome  # the last failure: FAILED, TIMED_OUT or LOST
    attempts: int
    created_at: float
    cause: str | None = None  # e.g. "ValueError: bad record (at /app/job.py:12 in store)"


class DeadLetterStore:
    """A ``dead_letters`` table in an SQLite file; each call opens and closes its own connection.

    Short connections keep the store safe to use from any thread and leave no
    handle open between calls. Adding a key again replaces the row.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open_db(self.path) as conn:
            conn.execute(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(dead_letters)")}
            if "cause" not in columns:  # a table made before causes were kept
                conn.execute("ALTER TABLE dead_letters ADD COLUMN cause TEXT")

    def add(self, key: str, record: Any, reason: Outcome, attempts: int, cause: str | None = None) -> None:
        """Store one record with its last failure reason, the number of deliveries made and the cause if known."""
        self.add_letters([DeadLetter(key, record, reason, attempts, time.time(), cause)])

    def add_letters(self, letters: Iterable[DeadLetter]) -> int:
        """Store these dead letters in one transaction (a key already stored is replaced); how many."""
        rows = [
            (
                d.key,
                json.dumps(d.record, default=repr, ensure_ascii=False),
                d.reason.name,
                d.attempts,
                d.created_at,
                d.cause,
            )
            for d in letters
        ]
        if rows:
            with open_db(self.path) as conn:
                conn.executemany(f"INSERT OR REPLACE INTO dead_letters {_COLUMNS} VALUES (?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def add_many(self, letters: Iterable[tuple[Any, ...]]) -> int:
        """Store ``(key, record, reason, attempts)`` rows, each with an optional fifth item, its cause, as
        :meth:`add` does, in one transaction; how many."""
        at = time.time()
        return self.add_letters(
            DeadLetter(row[0], row[1], row[2], row[3], at, row[4] if len(row) > 4 else None) for row in letters
        )

    def all(self) -> list[DeadLetter]:
        """Every dead letter, ordered by key."""
        with open_db(self.path) as conn:
            rows = conn.execute(f"SELECT {_COLUMNS[1:-1]} FROM dead_letters ORDER BY record_key").fetchall()
        return [
            DeadLetter(key, json.loads(record), Outcome[reason], attempts, at, cause)
            for key, record, reason, attempts, at, cause in rows
        ]

    def keys(self) -> set[str]:
        """The keys of every dead-lettered record."""
        with open_db(self.path) as conn:
            return {key for (key,) in conn.execute("SELECT record_key FROM dead_letters")}

    def __len__(self) -> int:
        with open_db(self.path) as conn:
            return conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
