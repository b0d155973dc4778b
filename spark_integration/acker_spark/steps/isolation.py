"""Which rows of an Arrow batch make a bolt's function raise, found at about the cost of those rows.

An :class:`~acker_spark.steps.arrow_bolt.ArrowBolt` whose function raises for a
batch cannot tell which row raised, and what the call did for the other rows is
rolled back, so the batch is run again in pieces until each row that raises is
alone (it is failed, with the exception as its cause) and every other row ran
once in a call that returned. How the pieces are cut sets the price:

- **A batch is run in slices sized to the failures seen.** Each bolt keeps, in
  its Python worker, how many rows it ran and how many raised alone
  (:class:`FailureRate`, decaying so it follows the data), updated after every
  slice. Until a row raised, a batch is one call, as without isolation, except
  for the bolt's first ``WARMUP_ROWS`` rows in a worker, run in slices growing
  from ``FIRST_SLICE`` rows (a few calls, once), so that a first raising row
  wastes a slice instead of a whole batch. Once rows raised, the rest is run in
  slices of about ``WASTED_FRACTION / rate`` rows, so that about one slice in
  ten holds a raising row: the rows handed to the function again stay near
  ``WASTED_FRACTION`` of the batch, instead of the whole batch being run at
  least twice whenever one of its rows raises.
- **A slice that raises is halved**, recursively, down to single rows; when
  the first half returned, the second is known to hold the raising row and is
  halved at once, without the call that could only raise again (the function
  is deterministic per row). One raising row in a slice of 100 costs about 150
  rows in 11 calls; cutting it into sqrt(m) pieces of sqrt(m) rows costs
  about 110 rows in 17 calls. Calls are what a function with a fixed cost per
  call (a compiled pattern, a connection) pays for, and the rows stay within
  the share the slicing aims at: at one raising row per slice in ten, 1.15x.

Isolation stays exact: every row is either in a call that returned (once) or
failed alone with its own exception. A function that can tell which rows are
bad should say so itself (``collector.fail(rows, reason=...)``, then return):
its batch then runs once, whatever the rate.

An exception that is not a poison type (:data:`~acker_spark.job_errors.POISON_ERRORS`)
raised by the first rows alone while none ran (``BATCH_WIDE`` of them, or all
of a smaller batch) is taken for a failure of the task, not of its records (a
service down, an injected crash): the task fails, so Spark retries it, instead
of every record being failed one by one. A :class:`~acker_spark.steps.time_limit.RecordTimeLimit`
counts only after ``BATCH_WIDE`` rows whatever the batch's size: a slow record
replayed alone is failed alone, not its task.

Each batch in which rows raised logs one warning line (how many rows, their
exception types, the first cause); each row's full cause is its dead letter's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import pyarrow as pa

from ..job_errors import POISON_ERRORS, job_error
from .time_limit import RecordTimeLimit

__all__ = [
    "BATCH_WIDE",
    "FIRST_SLICE",
    "WARMUP_ROWS",
    "WASTED_FRACTION",
    "BatchIsolation",
    "FailureRate",
    "NotIsolated",
    "failure_rate",
    "run_isolated",
]

log = logging.getLogger("acker_spark.executor")  # the name operators already filter on

BATCH_WIDE = 8
"""Rows raising a non-poison exception alone, none having run, that fail the task instead of themselves."""

WASTED_FRACTION = 0.1
"""The share of a batch's rows a slicing aims to hand the function twice (slices of this / rate rows)."""

WARMUP_ROWS = 10_000
"""Rows a bolt runs in growing slices in each worker before a batch without failures seen is one call."""

FIRST_SLICE = 500
"""The first slice of a bolt in a worker; each next warm-up slice is as large as all the rows run before it."""

_WINDOW = 100_000
"""Rows after which a :class:`FailureRate` halves its counts, so it follows a change in the data."""

RunRows = Callable[[int, int], list[pa.RecordBatch]]
"""``run(start, stop)``: the function over rows ``[start, stop)``; their output, or the function's exception."""

FailRow = Callable[[int, Exception], list[pa.RecordBatch]]
"""``fail(row, err)``: fail one row that raised alone, with ``err`` as its cause."""


class NotIsolated(Exception):
    """Raised by a ``run`` for a mistake of the function itself (e.g. it returned a value): never isolated."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class FailureRate:
    """How many rows a bolt ran and how many of them raised alone, in this Python worker: the slice size."""

    def __init__(self) -> None:
        self.rows = 0.0
        self.raised = 0.0

    @property
    def rate(self) -> float:
        """Rows that raised alone per row run (0.0 before any)."""
        return self.raised / self.rows if self.rows else 0.0

    def record(self, rows: int, raised: int) -> None:
        """Count one batch: ``rows`` run, ``raised`` of them failed alone."""
        self.rows += rows
        self.raised += raised
        if self.rows > _WINDOW:  # halve both: the rate keeps its value but forgets old batches gradually
            self.rows /= 2
            self.raised /= 2

    def slice_rows(self, rows: int) -> int:
        """The next slice's size with ``rows`` left: ``WASTED_FRACTION / rate``; until a row raised, all of them
        (growing slices from ``FIRST_SLICE`` for the first ``WARMUP_ROWS``)."""
        if self.raised <= 0.0:
            if self.rows < WARMUP_ROWS:
                return max(1, min(rows, max(FIRST_SLICE, int(self.rows))))
            return max(rows, 1)
        return max(1, min(rows, int(WASTED_FRACTION / self.rate)))


_rates: dict[int, FailureRate] = {}  # per bolt uid; a Python worker runs many tasks of the same bolts


def failure_rate(uid: int) -> FailureRate:
    """The :class:`FailureRate` of the bolt with ``uid`` in this process (created on first use)."""
    rate = _rates.get(uid)
    if rate is None:
        rate = _rates[uid] = FailureRate()
    return rate


class BatchIsolation:
    """One input batch's isolation so far: rows that ran, rows that raised alone, the first exception, calls made."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.succeeded = 0
        self.raised = 0
        self.calls = 0
        self.handed = 0  # rows handed to the function, over every call
        self.first: Exception | None = None
        self.first_cause = ""  # the first row failed alone: its cause, for the batch's log line
        self.types: Counter[str] = Counter()

    def batch_wide(self, err: Exception) -> bool:
        """True when the rows that raised alone so far say the whole task is failing."""
        if type(err).__name__ in POISON_ERRORS or self.succeeded:
            return False
        if isinstance(err, RecordTimeLimit):
            # A slow record is alone in a small batch (a replay round's): failing the task would charge the
            # task's other records and retry the hang. Eight rows that all time out still mean a hung service.
            return self.raised >= BATCH_WIDE
        return self.raised >= min(self.rows, BATCH_WIDE)


def run_isolated(rows: int, run: RunRows, fail: FailRow, rate: FailureRate, name: str) -> list[pa.RecordBatch]:
    """Run a batch of ``rows`` through ``run`` in slices sized by ``rate``; fail each row that raises alone.

    Returns the batch's output (one batch when it took several calls, so that
    slicing hands no small batches downstream). Raises the first exception when
    it is taken for the task's (see :class:`BatchIsolation`), and any
    :class:`NotIsolated` as its error. ``name`` names the bolt in the log line.
    """
    isolation = BatchIsolation(rows)
    out: list[pa.RecordBatch] = []
    start = 0
    while start < rows:
        # Sized again after every slice: the first raising rows of a batch resize the rest of it.
        stop = start + rate.slice_rows(rows - start)
        raised = isolation.raised
        out += _run_piece(start, stop, run, fail, isolation)
        rate.record(stop - start, isolation.raised - raised)
        start = stop
    if isolation.raised:
        _log_summary(name, isolation)
    if isolation.calls > 1 and len(out) > 1:
        out = [pa.concat_batches(out)]
    return out


def _run_counted(isolation: BatchIsolation, run: RunRows, start: int, stop: int) -> list[pa.RecordBatch]:
    """``run(start, stop)``, counted in ``isolation`` (calls and rows handed) whether it returns or raises."""
    isolation.calls += 1
    isolation.handed += stop - start
    return run(start, stop)


def _run_piece(start: int, stop: int, run: RunRows, fail: FailRow, isolation: BatchIsolation) -> list[pa.RecordBatch]:
    """Rows ``[start, stop)``: one call; if it raises, halves of them, down to single rows."""
    try:
        out = _run_counted(isolation, run, start, stop)
    except NotIsolated as mistake:
        raise mistake.error from None
    except Exception as err:
        if stop - start == 1:
            isolation.raised += 1
            if isolation.batch_wide(err):
                raise (isolation.first or err) from None  # the task fails; Spark retries it
            isolation.first = isolation.first or err
            isolation.types[type(err).__name__] += 1
            isolation.first_cause = isolation.first_cause or str(job_error(err))
            return fail(start, err)
        isolation.first = isolation.first or err
        return _cut(start, stop, run, fail, isolation)
    isolation.succeeded += stop - start
    return out


def _cut(start: int, stop: int, run: RunRows, fail: FailRow, isolation: BatchIsolation) -> list[pa.RecordBatch]:
    """Rows ``[start, stop)``, known to hold a raising row: run in halves.

    When the first half returned, the second holds the raising row: it is
    halved at once, without the call that would only raise again (the
    function is deterministic per row). A single row is always called: its
    exception is its cause.
    """
    piece = -(-(stop - start) // 2)
    raised = isolation.raised
    pieces: list[pa.RecordBatch] = []
    for at in range(start, stop, piece):
        end = min(stop, at + piece)
        if end == stop and end - at > 1 and isolation.raised == raised:
            pieces += _cut(at, end, run, fail, isolation)
        else:
            pieces += _run_piece(at, end, run, fail, isolation)
    return pieces


def _log_summary(name: str, isolation: BatchIsolation) -> None:
    """One line for the batch: how many rows raised, their types, the first cause (each cause is in its dead letter)."""
    types = ", ".join(f"{kind} x{count}" for kind, count in isolation.types.most_common())
    log.warning(
        "bolt %s: %d of %d rows of a batch raised and were failed alone (%s; %d calls, %d rows handed to the"
        " function); each cause is in its dead letter; the first: %s",
        name,
        isolation.raised,
        isolation.rows,
        types,
        isolation.calls,
        isolation.handed,
        isolation.first_cause,
    )
