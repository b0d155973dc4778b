"""SQLite connections set up for several Spark worker processes writing one file at once."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["connect", "open_db", "upsert"]

# Local executors are separate processes writing the same file: WAL lets readers
# and one writer proceed together, and the busy timeout makes a second writer wait
# for the lock instead of failing its task with "database is locked".
_BUSY_TIMEOUT_MS = 60_000


def connect(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` in WAL mode with a generous busy timeout (the caller closes it)."""
    conn = sqlite3.connect(str(path), timeout=_BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL is durable across application crashes in WAL mode; FULL only adds
        # protection against power loss at a large cost per commit.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def open_db(path: str | Path) -> Iterator[sqlite3.Connection]:
    """``connect`` as a context manager that commits on success, rolls back on error and closes."""
    conn = connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def upsert(conn: sqlite3.Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Insert rows, replacing any with the same primary key: writing a row twice changes nothing.

    ``table`` and ``columns`` are code, never user data: they are spliced into the SQL.
    Returns the number of rows written.
    """
    placeholders = ", ".join("?" for _ in columns)
    sql = f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({placeholders})"
    cursor = conn.executemany(sql, rows)
    return cursor.rowcount
