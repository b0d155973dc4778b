"""In-memory sources for the SourcePipeline: copied once into the checkpoint as Parquet, then read by Spark.

A replay must re-read a record by its identity, and a restarted driver must
find the same records again; a Python iterable (``records_from(...)``,
``generated_sentences(...)``, a list of ``Record`` or ``(key, value)`` tuples)
gives neither: a generator is consumed by its first read. So the driver reads
such a source **once**, streaming it in chunks, into Parquet files under the
checkpoint directory (``source/part-*.parquet``: columns ``key`` and
``value``), and from then on the pipeline reads that copy with
``spark.read.parquet`` on the executors, identified by the ``key`` column,
like any other keyed source. The driver keeps no payload: only while writing
does it hold one chunk, and an 8-byte hash per key to refuse duplicate keys
before any job runs. A driver restarted on the same checkpoint reads the copy
and never the iterable again.

A :class:`~acker_spark.sources.TextDirectorySource` in UTF-8 needs no copy:
it becomes ``spark.read.text`` over its files (lines without a non-blank
character left out, as the iterable skips them), identified by file and
position like any text source.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..sources import TextDirectorySource
from ..tracking.identity import UnstableIdentity, hash_key_column

__all__ = [
    "COPY_DIR",
    "KEY",
    "VALUE",
    "DuplicateIdentity",
    "fsync_path",
    "is_dataframe",
    "text_frame",
    "write_records",
]

COPY_DIR = "source"
"""The copy's folder in the checkpoint directory."""
KEY, VALUE = "key", "value"
CHUNK_ROWS = 8_192
"""Records per Parquet row group: what the driver holds at once while it copies (times the number of files)."""


class DuplicateIdentity(UnstableIdentity):
    """Two records of the source share an identity (a key column that is not unique)."""


def is_dataframe(source: Any) -> bool:
    """True for a Spark DataFrame, classic or Connect (duck-typed: both have ``mapInArrow`` and ``schema``)."""
    return hasattr(source, "mapInArrow") and hasattr(source, "schema") and hasattr(source, "columns")


def text_frame(spark: Any, source: TextDirectorySource) -> Any:
    """``spark.read.text`` over the source's files, keeping the lines it would yield (a non-blank character)."""
    files = [str(path.absolute()) for path in source.files()]
    if not files:
        raise ValueError(f"text source {source.directory} has no files matching {source.pattern!r}")
    # A SQL expression, not pyspark.sql.functions: the same on classic Spark and Spark Connect.
    return spark.read.text(files).where(r"value RLIKE '\\S'")


def is_utf8(encoding: str) -> bool:
    """True if ``encoding`` names UTF-8 (the only encoding Spark's text reader decodes)."""
    return encoding.lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig")


def write_records(records: Iterable[Any], folder: Path, files: int, *, chunk_rows: int = CHUNK_ROWS) -> int:
    """Copy ``records`` (``Record`` or ``(key, value)`` items) into ``files`` Parquet files in ``folder``; the count.

    Record ``i`` goes to file ``i % files``, so Spark reads the copy in
    ``files`` parallel tasks however few records there are. Written into a
    temporary folder, ``fsync``ed, then renamed: ``folder`` exists only
    complete. Keys must be unique (:class:`DuplicateIdentity` otherwise) and
    values of one Arrow type.
    """
    if isinstance(records, (str, bytes, Path)):
        raise TypeError(
            f"an in-memory source is an iterable of Record or (key, value) items, not {type(records).__name__} "
            f"{records!r}: for files pass a DataFrame (spark.read.text(path)) or TextDirectorySource(path)"
        )
    files = max(1, files)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writers: list[pq.ParquetWriter | None] = [None] * files
    hashes: list[np.ndarray] = []
    items = iter(records)
    try:
        total = _copy(items, tmp, files, chunk_rows, writers, hashes)
    finally:
        for writer in writers:
            if writer is not None:
                writer.close()
    try:
        _check_unique(hashes)
    except DuplicateIdentity:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name in os.listdir(tmp):
        fsync_path(tmp / name)
    shutil.rmtree(folder, ignore_errors=True)  # a copy a driver wrote before dying, with no manifest naming it
    os.replace(tmp, folder)
    fsync_path(folder.parent)
    return total


def _copy(items: Any, tmp: Path, files: int, chunk_rows: int, writers: list[Any], hashes: list[np.ndarray]) -> int:
    """Draw chunks from ``items`` and deal their rows round-robin to the files; the count."""
    schema: pa.Schema | None = None
    total = 0
    try:
        while True:
            chunk = list(itertools.islice(items, chunk_rows * files))
            if not chunk:
                break
            keys, values = _unpack(chunk, total)
            key_array = pa.array(keys, pa.string())
            value_array = _values(values, None if schema is None else schema.field(VALUE).type, keys)
            if schema is None:
                schema = pa.schema([pa.field(KEY, pa.string(), nullable=False), pa.field(VALUE, value_array.type)])
            table = pa.Table.from_arrays([key_array, value_array], schema=schema)
            for part in range(files):
                rows = table.take(np.arange(part, len(chunk), files))
                if not rows.num_rows:
                    continue
                writer = writers[part]
                if writer is None:
                    writer = writers[part] = pq.ParquetWriter(str(tmp / f"part-{part:05d}.parquet"), schema)
                writer.write_table(rows)
            hashes.append(hash_key_column(key_array, KEY))
            total += len(chunk)
        if schema is None:  # nothing to copy: one empty file, so Spark has a schema to read
            schema = pa.schema([pa.field(KEY, pa.string(), nullable=False), pa.field(VALUE, pa.string())])
            writers[0] = pq.ParquetWriter(str(tmp / "part-00000.parquet"), schema)
    except BaseException:
        for writer in writers:
            if writer is not None:
                writer.close()
        writers[:] = [None] * len(writers)
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
        raise
    return total


def _unpack(chunk: list[Any], offset: int) -> tuple[list[str], list[Any]]:
    keys, values = [], []
    for index, item in enumerate(chunk, start=offset):
        try:
            key, value = item
        except (TypeError, ValueError):
            raise TypeError(
                f"in-memory source item {index} is {type(item).__name__} {item!r:.80}, not a Record or a "
                "(key, value) pair: wrap plain values with records_from(values)"
            ) from None
        if key is None:
            raise UnstableIdentity(
                f"in-memory source item {index} has no key: a record without a key cannot be replayed"
            )
        keys.append(str(key))
        values.append(value)
    return keys, values


def _values(values: list[Any], kind: pa.DataType | None, keys: list[str]) -> pa.Array:
    """The chunk's values as one Arrow array, of the first chunk's type after the first."""
    try:
        array = pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
        first = f" (the first records' values are {kind})" if kind is not None else ""
        raise TypeError(
            f"the in-memory source's values must all have one Arrow type{first}; the chunk starting at record "
            f"{keys[0]!r} does not convert: {err}"
        ) from err
    if pa.types.is_null(array.type):
        raise TypeError(
            f"the in-memory source's first values are all None (from record {keys[0]!r}): no type to store them as"
        )
    return array


def _check_unique(hashes: list[np.ndarray]) -> None:
    if not hashes:
        return
    every = np.concatenate(hashes)
    hashes.clear()  # one copy of the hashes at a time: 8 bytes per record
    every.sort()
    duplicates = int((every[1:] == every[:-1]).sum())
    if duplicates:
        raise DuplicateIdentity(
            f"{duplicates} records of the in-memory source repeat another record's key: keys identify records "
            "for replays, sinks and dead letters and must be unique (records_from(values) numbers them)"
        )


def fsync_path(path: Path) -> None:
    """Flush a file or a folder (after a rename in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
