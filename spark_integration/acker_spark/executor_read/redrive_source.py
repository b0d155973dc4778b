"""A redrive chunk for the SourcePipeline: the dead letters' payloads as a Parquet source, run with a checkpoint.

A SourcePipeline's dead letter stores the record's row (its source columns) as
JSON. :class:`SourceChunks` writes a chunk's rows once into Parquet under the
chunk's folder (a temporary folder, then renamed: it exists only complete) and
runs a pipeline built like the user's, with a checkpoint and a dead-letter
table of the chunk's own, over ``spark.read.parquet`` of it, identified by a
key column. A chunk resumed after a kill finds both again and continues that
run. The job gets the rows' own columns; when none of them holds the dead
letter's key, a ``_dead_letter_key`` column is added to identify them.
A dead letter whose payload is not a row (a GuaranteedPipeline's value) becomes
``key``/``value`` columns, the shape of an in-memory source.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..dead_letter import DeadLetter, DeadLetterStore

__all__ = ["DEAD_LETTER_KEY", "SourceChunks", "payload_rows"]

DEAD_LETTER_KEY = "_dead_letter_key"
"""The column added to identify redriven rows when no column of theirs holds the dead letter's key."""

INPUT, CHECKPOINT, DEAD = "input", "checkpoint", "dead_letters.sqlite"


def payload_rows(letters: list[DeadLetter], key: str | None) -> tuple[list[dict[str, Any]], str]:
    """The letters' rows and the column identifying them: ``key`` if given, else one holding every letter's key."""
    rows = [
        dict(letter.record) if isinstance(letter.record, dict) else {"key": letter.key, "value": letter.record}
        for letter in letters
    ]
    if key is not None:
        wrong = [letter.key for letter, row in zip(letters, rows) if str(row.get(key)) != letter.key]
        if wrong:
            raise ValueError(
                f"key={key!r} does not hold the key of dead letters {wrong[:5]}: name the column the run that "
                "dead-lettered them was keyed by (or leave key out)"
            )
        return rows, key
    if rows:
        names = ["key", *(name for name in rows[0] if name != "key")]
        for name in names:
            if all(name in row and str(row[name]) == letter.key for letter, row in zip(letters, rows)):
                return rows, name
    for letter, row in zip(letters, rows):
        row[DEAD_LETTER_KEY] = letter.key
    return rows, DEAD_LETTER_KEY


def write_rows(rows: list[dict[str, Any]], folder: Path, files: int) -> None:
    """``rows`` into ``files`` Parquet files in ``folder``, written into a temporary folder and renamed."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    files = max(1, min(files, len(rows)))
    step = -(-len(rows) // files) if rows else 1
    for part in range(files):
        path = tmp / f"part-{part:05d}.parquet"
        pq.write_table(table.slice(part * step, step), str(path))
        _fsync(path)
    os.replace(tmp, folder)
    _fsync(folder.parent)


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

    def __call__(self, letters: list[DeadLetter], folder: Path) -> Mapping[str, str | None]:
        """Run the chunk (resuming its checkpoint if it has one); the keys that died again, with their causes."""
        folder.mkdir(parents=True, exist_ok=True)
        rows, column = payload_rows(letters, self.key)
        source = folder / INPUT
        if not source.exists():  # a resumed chunk reads the rows its first run wrote
            write_rows(rows, source, self.files)
        df = self.spark.read.parquet(str(source))
        if self.schema is not None:
            df = _cast(df, self.schema)
        dead = DeadLetterStore(folder / DEAD)
        pipeline = self.make_pipeline(folder / CHECKPOINT, dead)
        self.stats.append(pipeline.run(df, self.job, key=column))
        return {letter.key: letter.cause for letter in dead.all()}


def _cast(df: Any, schema: Any) -> Any:
    """``df``'s columns cast to the types ``schema`` gives them (others as they are)."""
    from pyspark.sql.types import StructType

    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    types = {f.name: f.dataType.simpleString() for f in struct.fields}
    return df.selectExpr(*(f"CAST(`{c}` AS {types[c]}) AS `{c}`" if c in types else f"`{c}`" for c in df.columns))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
