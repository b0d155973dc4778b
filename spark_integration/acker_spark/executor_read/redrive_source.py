"""A redrive chunk for the SourcePipeline: the dead letters' payloads as a Parquet source, run with a checkpoint.

A SourcePipeline's dead letter stores the record's row (its source columns) as
JSON. :class:`SourceChunks` writes a chunk's rows once into Parquet under the
chunk's folder (a temporary folder, then renamed: it exists only complete) and
runs a pipeline built like the user's, with a checkpoint and a dead-letter
table of the chunk's own, over ``spark.read.parquet`` of it, identified by a
key column. A chunk resumed after a kill finds both again and continues that
run. The job gets the rows' own columns; when none of them holds the dead
letter's key, a ``_dead_letter_key`` column is added to identify them.
A dead letter whose payload is not a row (a plain value, as the removed
driver-fed ``GuaranteedPipeline`` wrote them) becomes ``key``/``value``
columns, the shape of an in-memory source.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ..budget import BudgetExceeded, FailureBudget
from ..dead_letter import DeadLetterStore, Select
from ..redrive import Redrive, RedriveChunk, RedriveRefused, RedriveReport
from ..session import default_parallelism
from .job_check import JobWritesItself, OutputForgotten, OutputNotReturned
from .memory_source import fsync_path

__all__ = ["DEAD_LETTER_KEY", "SourceChunks", "payload_table", "redrive_letters"]

DEAD_LETTER_KEY = "_dead_letter_key"
"""The column added to identify redriven rows when no column of theirs holds the dead letter's key."""

INPUT, CHECKPOINT, DEAD = "input", "checkpoint", "dead_letters.sqlite"
KEY_FILE = "_key_column"  # beside the Parquet files (Spark's reader skips names starting with "_")


def payload_table(chunk: RedriveChunk, key: str | None) -> tuple[pa.Table, str]:
    """The chunk's rows as an Arrow table and the column identifying them: ``key`` if given, else one holding every
    letter's key (``key`` first), else an added ``_dead_letter_key``."""
    keys = pa.array(chunk.keys, pa.string())
    table = _rows(chunk)
    if key is not None:
        if key not in table.column_names or not _holds(table.column(key), keys):
            raise ValueError(
                f"key={key!r} does not hold the dead letters' keys (e.g. {chunk.keys[0]!r}): name the column the "
                "run that dead-lettered them was keyed by (or leave key out)"
            )
        return table, key
    names = sorted(table.column_names, key=lambda name: name != "key")
    for name in names:
        if _holds(table.column(name), keys):
            return table, name
    return table.append_column(DEAD_LETTER_KEY, keys), DEAD_LETTER_KEY


def _rows(chunk: RedriveChunk) -> pa.Table:
    """Rows stored as JSON objects, parsed by Arrow's JSON reader; other values as ``key``/``value`` rows."""
    if all(record.startswith("{") for record in chunk.records):
        try:
            # One object per line (json.dumps writes no raw newline); the reader keeps the lines' order.
            return pa_json.read_json(io.BytesIO("\n".join(chunk.records).encode()))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # types Arrow's inference cannot settle: the Python path below says which
    values = chunk.values()
    rows = [v if isinstance(v, dict) else {"key": k, "value": v} for k, v in zip(chunk.keys, values)]
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TypeError(f"the dead letters' rows (from {chunk.keys[0]!r}) do not make one table: {err}") from err


def _holds(column: pa.ChunkedArray, keys: pa.Array) -> bool:
    """True when ``column``, as strings, equals ``keys`` row by row."""
    try:
        as_text = pc.cast(column, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return bool(pc.all(pc.fill_null(pc.equal(as_text, keys), False)).as_py())


def write_rows(table: pa.Table, column: str, folder: Path, files: int) -> None:
    """``table`` into ``files`` Parquet files in ``folder``, and the key ``column``'s name beside them; written into
    a temporary folder and renamed, so ``folder`` exists only complete."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / KEY_FILE).write_text(column)
    fsync_path(tmp / KEY_FILE)
    files = max(1, min(files, table.num_rows))
    step = -(-table.num_rows // files) if table.num_rows else 1
    for part in range(files):
        path = tmp / f"part-{part:05d}.parquet"
        pq.write_table(table.slice(part * step, step), str(path))
        fsync_path(path)
    os.replace(tmp, folder)
    fsync_path(folder.parent)


class SourceChunks:
    """Runs one redrive chunk: ``make_pipeline(checkpoint, dead_letters)`` over the chunk's rows, ``job`` as given.

    ``schema`` (a Spark DDL string or StructType) casts the rows' columns back
    to the source's types (JSON keeps numbers, strings, lists and maps only);
    ``files`` is how many Parquet files (Spark tasks) a chunk is split into.
    """

    def __init__(
        self,
        spark: Any,
        make_pipeline: Callable[[Path, DeadLetterStore], Any],
        job: Callable[[Any], object],
        *,
        key: str | None = None,
        schema: Any = None,
        files: int = 4,
    ) -> None:
        self.spark = spark
        self.make_pipeline = make_pipeline
        self.job = job
        self.key = key
        self.schema = schema
        self.files = files
        self.stats: list[Any] = []  # each chunk's SourceStats, in order

    def __call__(self, chunk: RedriveChunk, folder: Path) -> Mapping[str, str | None]:
        """Run the chunk (resuming its checkpoint if it has one); the keys that died again, with their causes."""
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / INPUT
        if not source.exists():  # a resumed chunk reads the rows its first run wrote
            table, column = payload_table(chunk, self.key)
            write_rows(table, column, source, self.files)
        column = (source / KEY_FILE).read_text()
        df = self.spark.read.parquet(str(source))
        if self.schema is not None:
            df = _cast(df, self.schema)
        dead = DeadLetterStore(folder / DEAD)
        pipeline = self.make_pipeline(folder / CHECKPOINT, dead)
        try:
            stats = pipeline.run(df, self.job, key=column)
        except (OutputForgotten, JobWritesItself, OutputNotReturned) as mistake:
            # Found by the job check, before the chunk's first record was read: nothing was sent.
            raise RedriveRefused(f"{type(mistake).__name__}: {mistake}") from mistake
        self.stats.append(stats)
        dead_again = {letter.key: letter.cause for letter in dead.all()}
        # The run returned, so every record it read is acked (with an output: committed) or dead. A letter it
        # did not read must not be counted acked: the chunk stays claimed instead.
        if stats.acked + len(dead_again) != len(chunk.keys):
            raise RuntimeError(
                f"the redrive chunk in {folder} holds {len(chunk.keys)} letters but its run ended with "
                f"{stats.acked} acked and {len(dead_again)} dead: its letters stay 'redriving' (nothing is marked)"
            )
        return dead_again


def redrive_letters(
    spark: Any,
    sibling: Callable[[Path, DeadLetterStore, FailureBudget | None], Any],
    base: Path,
    dead_letters: DeadLetterStore,
    job: Callable[[Any], object],
    *,
    clock: Callable[[], float],
    select: Select | None = None,
    rate: float | None = None,
    key: str | None = None,
    schema: Any = None,
    chunk_seconds: float = 10.0,
    redrive_id: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    budget: FailureBudget | None = None,
) -> RedriveReport:
    """A SourcePipeline's redrive: the selected dead letters through ``job`` again, each at most once.

    ``sibling(checkpoint, letters, budget)`` makes a chunk's pipeline, configured like the caller's.

    ``select``: :class:`~acker_spark.dead_letter.Select` by cause kind
    and/or keys (default ``Select()``: every letter not yet acked by a redrive).
    ``rate``: most records sent per second (default uncapped), in chunks
    of ``rate * chunk_seconds`` records. The records are the letters'
    stored rows, read as a Parquet source keyed by ``key`` (default: the
    column holding the letters' keys, else an added ``_dead_letter_key``),
    cast to ``schema`` (a DDL string or StructType) when given; each chunk
    is a run of a pipeline configured like the caller's, with a checkpoint of
    its own under ``base`` (the pipeline's ``folder``, default:
    ``<checkpoint>/redrives``), and an output in ``append`` mode. Each letter ends ``acked`` or ``dead`` (with
    its new cause) in ``dead_letters``. Called again after a kill, it
    finishes the killed redrive (see :mod:`acker_spark.redrive`).
    ``clock`` and ``sleep`` pace the chunks (the pipeline passes its clock unless given one).

    Each chunk's run first checks the job (:mod:`~acker_spark.executor_read.job_check`):
    a job that returns a DataFrame while the pipeline has no output, or
    writes for itself, raises :class:`~acker_spark.redrive.RedriveRefused`
    before a letter is sent, and the letters stay as they were. A letter
    ends ``acked`` only once its chunk's run returned: every delivery
    ACKED and, with an output, its rows committed. ``budget``: the
    redrive's own failure budget (default None: the letters selected are
    already known to fail, so every one ends acked or dead again); a
    redrive it stops keeps its claim, and the error says how to go on.
    """
    chunks = SourceChunks(
        spark,
        lambda checkpoint, letters: sibling(checkpoint, letters, budget),
        job,
        key=key,
        schema=schema,
        files=default_parallelism(spark),
    )
    redrive = Redrive(
        dead_letters,
        chunks,
        base,
        select=select,
        rate=rate,
        chunk_seconds=chunk_seconds,
        redrive_id=redrive_id,
        clock=clock,
        sleep=sleep,
    )
    try:
        return redrive.run()
    except BudgetExceeded as stopped:
        unfinished = dead_letters.unfinished_redrive()
        which = unfinished.redrive_id if unfinished is not None else "the redrive"
        stopped.args = (
            f"{stopped.args[0]} The redrive's own budget stopped it ({budget.describe() if budget else 'none'}):"
            f" its letters stay claimed by {which}, their chunk's checkpoint keeps its progress. Run the same "
            f"redrive again with a larger budget or none (acker-ctl: --budget none) to finish it, or give it up "
            f"with acker-ctl dead-letters abandon {which}.",
            *stopped.args[1:],
        )
        raise


def _cast(df: Any, schema: Any) -> Any:
    """``df``'s columns cast to the types ``schema`` gives them (others as they are)."""
    from pyspark.sql.types import StructType

    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    if not isinstance(struct, StructType):
        raise ValueError(f"schema={schema!r} is not a list of columns (e.g. 'amount double, day date')")
    types = {f.name: f.dataType.simpleString() for f in struct.fields}
    return df.selectExpr(*(f"CAST(`{c}` AS {types[c]}) AS `{c}`" if c in types else f"`{c}`" for c in df.columns))
