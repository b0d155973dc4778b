"""The dead-letter table: records that failed on every allowed attempt, with the last reason and its cause.

Each row also says whether it was redriven (sent through the job again, see
:mod:`acker_spark.redrive`) and how that ended: ``redrive_status`` is NULL
(never redriven), ``redriving`` (claimed by the redrive ``redrive_id``, not
finished), ``acked`` or ``dead`` (failed again, with ``redrive_cause``). A
redrive claims its rows and records itself in ``redrives`` in one transaction,
and marks each chunk's outcomes in another, so a killed redrive leaves every
row either unclaimed, claimed by it, or finished.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acker_protocol.wire import Outcome

from .job_errors import error_type
from .sqlite import open_db

__all__ = ["CauseGroup", "DeadLetter", "DeadLetterStore", "RedriveRun", "Select", "cause_kind"]

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
_REDRIVE_COLUMNS = {
    "redrive_id": "TEXT",  # the redrive that claimed the row last
    "redrive_status": "TEXT",  # NULL, redriving, acked or dead
    "redriven_at": "REAL",  # when the redrive's outcome was recorded
    "redrive_cause": "TEXT",  # why the redriven delivery failed again
}
_ALL_COLUMNS = _COLUMNS[1:-1] + ", redrive_id, redrive_status, redrive_cause"

_REDRIVES_SCHEMA = """
CREATE TABLE IF NOT EXISTS redrives (
    redrive_id TEXT PRIMARY KEY,
    selection  TEXT NOT NULL,     -- the Select as JSON
    chunk      INTEGER NOT NULL,  -- records per chunk, fixed when the redrive starts (a resume keeps it)
    status     TEXT NOT NULL,     -- running or done
    started_at REAL NOT NULL,
    ended_at   REAL
) WITHOUT ROWID
"""

REDRIVING, ACKED, DEAD = "redriving", "acked", "dead"
"""The redrive statuses of a dead letter (NULL: never redriven)."""


def cause_kind(cause: str | None) -> str:
    """What a cause is grouped under: its exception type, the free text itself, or ``(no cause)``."""
    if not cause:
        return "(no cause)"
    return error_type(cause) or cause.split("\n", 1)[0][:80]


@dataclass(frozen=True)
class Select:
    """Which dead letters a redrive takes: of these cause kinds, or these keys, or (neither given) all.

    ``cause`` names kinds as :func:`cause_kind` gives them (``"ValueError"``,
    ``"(no cause)"``); a letter that died again counts under its new cause.
    ``cause`` and ``keys`` together select letters matching both. Letters
    already acked by a redrive, or claimed by an unfinished one, are never taken.
    """

    cause: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("cause", "keys"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            else:
                object.__setattr__(self, name, tuple(value))
            if not all(isinstance(v, str) and v for v in getattr(self, name)):
                raise ValueError(f"Select.{name} takes non-empty strings, got {value!r}")

    def as_json(self) -> str:
        """The selection as stored with a redrive (sorted, so equal selections compare equal)."""
        return json.dumps({"cause": sorted(self.cause), "keys": sorted(self.keys)})

    def describe(self) -> str:
        """The selection in words, for logs and errors."""
        parts = [f"cause {', '.join(self.cause)}"] if self.cause else []
        if self.keys:
            shown = ", ".join(self.keys[:5]) + (f" (+{len(self.keys) - 5})" if len(self.keys) > 5 else "")
            parts.append(f"keys {shown}")
        return " and ".join(parts) or "all"

    def matches(self, letter: DeadLetter) -> bool:
        """True when ``letter`` is of the selected kinds and keys."""
        return self._takes(letter.key, letter.last_cause, frozenset(self.keys))

    def _takes(self, key: str, last_cause: str | None, keys: frozenset[str]) -> bool:
        if keys and key not in keys:
            return False
        return not self.cause or cause_kind(last_cause) in self.cause


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered record as stored."""

    key: str
    record: Any
    reason: Outcome  # the last failure: FAILED, TIMED_OUT or LOST
    attempts: int
    created_at: float
    cause: str | None = None  # e.g. "ValueError: bad record (at /app/job.py:12 in store)"
    redrive_id: str | None = None  # the redrive that took it last, if any
    redrive_status: str | None = None  # None, "redriving", "acked" or "dead"
    redrive_cause: str | None = None  # why the redriven delivery failed, when it did

    @property
    def last_cause(self) -> str | None:
        """The newest cause known: the redriven delivery's when it died again, else the original one."""
        return self.redrive_cause if self.redrive_status == DEAD and self.redrive_cause else self.cause


@dataclass
class CauseGroup:
    """Dead letters of one cause kind: how many, how many per redrive status, and a few examples."""

    kind: str
    count: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "new" for never redriven
    examples: list[DeadLetter] = field(default_factory=list)


@dataclass(frozen=True)
class RedriveRun:
    """One redrive as stored: its id, selection, chunk size and status (``running`` or ``done``)."""

    redrive_id: str
    selection: str
    chunk: int
    status: str
    started_at: float
    ended_at: float | None


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
            for name, kind in _REDRIVE_COLUMNS.items():  # a table made before redrives
                if name not in columns:
                    conn.execute(f"ALTER TABLE dead_letters ADD COLUMN {name} {kind}")
            conn.execute(_REDRIVES_SCHEMA)

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
        return self._letters("", ())

    def _letters(self, where: str, params: Sequence[Any]) -> list[DeadLetter]:
        with open_db(self.path) as conn:
            rows = conn.execute(
                f"SELECT {_ALL_COLUMNS} FROM dead_letters {where} ORDER BY record_key", tuple(params)
            ).fetchall()
        return [
            DeadLetter(key, json.loads(record), Outcome[reason], attempts, at, cause, rid, status, rcause)
            for key, record, reason, attempts, at, cause, rid, status, rcause in rows
        ]

    # -- redrives -------------------------------------------------------------------------

    def groups(self, examples: int = 3) -> list[CauseGroup]:
        """The dead letters grouped by cause kind (newest cause), largest group first, with a few examples each."""
        groups: dict[str, CauseGroup] = {}
        for letter in self.all():
            kind = cause_kind(letter.last_cause)
            group = groups.setdefault(kind, CauseGroup(kind))
            group.count += 1
            status = letter.redrive_status or "new"
            group.statuses[status] = group.statuses.get(status, 0) + 1
            if len(group.examples) < examples:
                group.examples.append(letter)
        return sorted(groups.values(), key=lambda g: (-g.count, g.kind))

    def selected(self, select: Select) -> list[DeadLetter]:
        """The letters ``select`` takes now: never redriven, or dead again after a finished redrive."""
        return [
            letter
            for letter in self._letters("WHERE redrive_status IS NULL OR redrive_status = ?", (DEAD,))
            if select.matches(letter)
        ]

    def start_redrive(self, redrive_id: str, select: Select, chunk: int | None) -> int:
        """Record a redrive and claim the letters ``select`` takes for it, in one transaction; how many it claimed.

        ``chunk``: records per chunk (None: all of them in one). The selection is
        made by SQLite itself (cause kinds through :func:`cause_kind` as an SQL
        function), so no key travels through Python.
        """
        if chunk is not None and chunk < 1:
            raise ValueError(f"a redrive's chunk must be >= 1 record, got {chunk}")
        where = "(redrive_status IS NULL OR redrive_status = ?)"
        params: list[Any] = [redrive_id, REDRIVING, DEAD]
        if select.keys:
            where += " AND record_key IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(list(select.keys)))
        if select.cause:
            where += (
                " AND cause_kind(CASE WHEN redrive_status = ? AND redrive_cause IS NOT NULL THEN redrive_cause"
                " ELSE cause END) IN (SELECT value FROM json_each(?))"
            )
            params += [DEAD, json.dumps(list(select.cause))]
        with open_db(self.path) as conn:
            conn.create_function("cause_kind", 1, cause_kind, deterministic=True)
            claimed = conn.execute(
                "UPDATE dead_letters SET redrive_id = ?, redrive_status = ?, redriven_at = NULL, redrive_cause = NULL"
                f" WHERE {where}",
                params,
            ).rowcount
            conn.execute(
                "INSERT INTO redrives (redrive_id, selection, chunk, status, started_at) VALUES (?, ?, ?, 'running', ?)",
                (redrive_id, select.as_json(), chunk if chunk is not None else max(1, claimed), time.time()),
            )
            return claimed

    def unfinished_redrive(self) -> RedriveRun | None:
        """The redrive that was started and not finished (a killed one), if any."""
        with open_db(self.path) as conn:
            row = conn.execute(
                "SELECT redrive_id, selection, chunk, status, started_at, ended_at FROM redrives"
                " WHERE status = 'running' ORDER BY started_at LIMIT 1"
            ).fetchone()
        return RedriveRun(*row) if row is not None else None

    def redrive(self, redrive_id: str) -> RedriveRun:
        """One redrive as recorded (KeyError if there is none of that id)."""
        with open_db(self.path) as conn:
            row = conn.execute(
                "SELECT redrive_id, selection, chunk, status, started_at, ended_at FROM redrives WHERE redrive_id = ?",
                (redrive_id,),
            ).fetchone()
        if row is None:
            raise KeyError(f"no redrive {redrive_id!r} in {self.path}")
        return RedriveRun(*row)

    def redrives(self) -> list[RedriveRun]:
        """Every redrive recorded, oldest first."""
        with open_db(self.path) as conn:
            rows = conn.execute(
                "SELECT redrive_id, selection, chunk, status, started_at, ended_at FROM redrives ORDER BY started_at"
            ).fetchall()
        return [RedriveRun(*row) for row in rows]

    def claimed(self, redrive_id: str) -> list[DeadLetter]:
        """The letters a redrive claimed (in any status), ordered by key: the same list every time it is asked."""
        return self._letters("WHERE redrive_id = ?", (redrive_id,))

    def claimed_status(self, redrive_id: str) -> list[tuple[str, str]]:
        """``(key, status)`` of every letter a redrive claimed, ordered by key (the records are not read)."""
        with open_db(self.path) as conn:
            return conn.execute(
                "SELECT record_key, redrive_status FROM dead_letters WHERE redrive_id = ? ORDER BY record_key",
                (redrive_id,),
            ).fetchall()

    def claimed_records(self, redrive_id: str, first: str, last: str) -> tuple[list[str], list[str]]:
        """The keys and stored records (JSON text) a redrive claimed from key ``first`` to ``last``, ordered."""
        with open_db(self.path) as conn:
            rows = conn.execute(
                "SELECT record_key, record FROM dead_letters WHERE redrive_id = ? AND record_key BETWEEN ? AND ?"
                " ORDER BY record_key",
                (redrive_id, first, last),
            ).fetchall()
        return [key for key, _ in rows], [record for _, record in rows]

    def mark(self, redrive_id: str, first: str, last: str, dead: Mapping[str, str | None]) -> int:
        """Record how a redrive's deliveries from key ``first`` to ``last`` ended, in one transaction: the
        ``dead`` keys with their new cause, every other one acked. Only rows still claimed by this redrive
        change; how many did."""
        at = time.time()
        with open_db(self.path) as conn:
            changed = conn.executemany(
                "UPDATE dead_letters SET redrive_status = ?, redrive_cause = ?, redriven_at = ?"
                " WHERE redrive_id = ? AND record_key = ? AND redrive_status = ?",
                [(DEAD, cause, at, redrive_id, key, REDRIVING) for key, cause in dead.items()],
            ).rowcount
            changed += conn.execute(
                "UPDATE dead_letters SET redrive_status = ?, redriven_at = ?"
                " WHERE redrive_id = ? AND redrive_status = ? AND record_key BETWEEN ? AND ?",
                (ACKED, at, redrive_id, REDRIVING, first, last),
            ).rowcount
            return changed

    def outcomes(self, redrive_id: str) -> tuple[int, dict[str, int]]:
        """How a redrive ended: letters acked, and letters dead again by cause kind."""
        with open_db(self.path) as conn:
            acked = conn.execute(
                "SELECT COUNT(*) FROM dead_letters WHERE redrive_id = ? AND redrive_status = ?", (redrive_id, ACKED)
            ).fetchone()[0]
            dead = conn.execute(
                "SELECT redrive_cause FROM dead_letters WHERE redrive_id = ? AND redrive_status = ?",
                (redrive_id, DEAD),
            ).fetchall()
        causes: dict[str, int] = {}
        for (cause,) in dead:
            kind = cause_kind(cause)
            causes[kind] = causes.get(kind, 0) + 1
        return acked, causes

    def end_redrive(self, redrive_id: str) -> None:
        """Mark a redrive done (every letter it claimed has its outcome)."""
        with open_db(self.path) as conn:
            conn.execute(
                "UPDATE redrives SET status = 'done', ended_at = ? WHERE redrive_id = ?", (time.time(), redrive_id)
            )

    def abandon_redrive(self, redrive_id: str) -> int:
        """Give up an unfinished redrive: its unfinished letters become selectable again; how many.

        Only for a redrive whose deliveries will never be resumed (its checkpoint
        deleted): a letter it had sent but not recorded may then be processed twice.
        """
        with open_db(self.path) as conn:
            cursor = conn.execute(
                "UPDATE dead_letters SET redrive_id = NULL, redrive_status = NULL"
                " WHERE redrive_id = ? AND redrive_status = 'redriving'",
                (redrive_id,),
            )
            conn.execute(
                "UPDATE redrives SET status = 'abandoned', ended_at = ? WHERE redrive_id = ?",
                (time.time(), redrive_id),
            )
            return cursor.rowcount

    def keys(self) -> set[str]:
        """The keys of every dead-lettered record."""
        with open_db(self.path) as conn:
            return {key for (key,) in conn.execute("SELECT record_key FROM dead_letters")}

    def __len__(self) -> int:
        with open_db(self.path) as conn:
            return conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
