"""Where committed output goes: files or a table through Spark's own writer, or a function of yours.

Each destination takes one commit (a DataFrame of the rows whose trees ACKED
since the last commit, one copy each) and makes it visible once, however often
the driver is killed while doing it:

- :class:`FileOutput` (``parquet``, ``json``, ``csv``, ``orc``, ``text``, with
  ``partition_by`` and writer options): Spark writes the commit into a hidden
  folder of the destination, ``.acker-staging/<run>-c<commit>/`` (Spark's
  readers skip names starting with ``.`` or ``_``); then each file is moved to
  its place with a name that carries the run and commit
  (``word=a/<run>-c00003-part-....parquet``). A move is atomic and a moved
  file is no longer in the staging folder, so finishing a commit after a crash
  moves only what is left. After the moves a marker
  ``_acker_commits/<run>-c<commit>.json`` lists the commit's files: a reader
  that must not see a half-moved commit reads the files the markers list.
- :class:`TableOutput`: a table of the session's catalog stored as files
  (``saveAsTable`` creates it, with ``partition_by``, on the first commit).
  Spark writes the commit into the hidden staging folder of the table's
  folder; a new snapshot folder is built from links to the table's files and
  the staged ones, and the table's location is switched to it in one catalog
  step (``ALTER TABLE ... SET LOCATION``): readers of the table see a commit
  whole or not at all (``folder_publish.py``). A partitioned table is created
  with its partitions found from its files (not listed in the catalog), which
  is what lets one step publish it; a table created elsewhere whose partitions
  the catalog lists is published file by file as a ``FileOutput``, then its
  partitions recovered.
- :class:`BatchOutput`: ``fn(commit_id, df)`` for any other sink (JDBC, a
  key-value store, ...). Like Spark's ``foreachBatch`` and its ``batchId``, the
  function must be idempotent per ``commit_id``: a driver killed during the
  call calls it again with the same id and the same rows.

``mode``: ``"append"`` (default) adds to what the destination holds;
``"overwrite"`` replaces what it held before the run's first commit (once,
even if that commit is finished after a crash); ``"error"`` refuses to start
a run whose destination already holds data from elsewhere.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .folder_publish import (
    MARKERS,
    MOVES,
    STAGING,
    VERSIONS,
    build_version,
    clear_foreign,
    data_files,
    foreign_files,
    prune_versions,
    publish_in_place,
    published_files,
    staging_folder,
    table_base,
    version_folder,
)

__all__ = ["BatchOutput", "FileOutput", "MARKERS", "MOVES", "STAGING", "Output", "TableOutput", "published_files"]

log = logging.getLogger(__name__)

_FORMATS = ("parquet", "json", "csv", "orc", "text")
_MODES = ("append", "overwrite", "error")
_PARTITIONS_IN_CATALOG = "spark.sql.hive.manageFilesourcePartitions"


def _check(format: str, mode: str, partition_by: Sequence[str]) -> tuple[str, ...]:
    if format not in _FORMATS:
        raise ValueError(f"format {format!r} is not one of {', '.join(_FORMATS)} (use BatchOutput for other sinks)")
    if mode not in _MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(_MODES)}")
    if isinstance(partition_by, str):
        return (partition_by,)
    return tuple(partition_by)


@dataclass(frozen=True, kw_only=True)
class _SparkWriter:
    """What both Spark-written destinations take: ``format``, ``partition_by``, ``mode`` and writer ``options``."""

    format: str = "parquet"
    partition_by: Sequence[str] = ()
    mode: str = "append"
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition_by", _check(self.format, self.mode, self.partition_by))

    def _save(self, spark: Any, df: Any, folder: Path) -> int:
        """Write ``df`` into ``folder`` with Spark's writer (replacing what an interrupted try left there); its rows."""
        writer = df.write.format(self.format).mode("overwrite").options(**self.options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(str(folder))
        if self.format == "parquet":  # the files' footers say: no Spark job, no read of the rows
            return sum(pq.read_metadata(f).num_rows for f in data_files(folder))
        return int(spark.read.format(self.format).options(**self.options).load(str(folder)).count())


@dataclass(frozen=True)
class FileOutput(_SparkWriter):
    """Files at ``path`` written by Spark's writer: ``format``, ``partition_by``, ``mode`` and writer ``options``."""

    path: str

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "path", str(Path(self.path).absolute()))

    def describe(self) -> str:
        """One line for logs and the checkpoint: what this destination is."""
        return f"{self.format} files at {self.path}"

    def check_start(self, spark: Any, run: str) -> None:
        """Before a run's first commit: refuse ``mode="error"`` when the folder holds data of another run."""
        if self.mode == "error" and foreign_files(Path(self.path), run):
            raise FileExistsError(
                f"the output folder {self.path} already holds data and mode='error': choose mode='append' or"
                " 'overwrite', or another folder"
            )

    def write(self, spark: Any, df: Any, run: str, commit: int) -> int:
        """Write commit ``commit``'s rows into its staging folder (replacing what an interrupted try left); rows."""
        return self._save(spark, df, staging_folder(Path(self.path), run, commit))

    def publish(self, spark: Any, run: str, commit: int, *, first: bool) -> list[str]:
        """Move the staged files into place (the first commit of an overwrite run clears the folder first)."""
        root = Path(self.path)
        if first and self.mode == "overwrite":
            clear_foreign(root, run)
        return publish_in_place(root, run, commit)


@dataclass(frozen=True)
class TableOutput(_SparkWriter):
    """A catalog table stored as files, created with ``saveAsTable`` on the first commit if it does not exist."""

    name: str

    def describe(self) -> str:
        """One line for logs and the checkpoint: what this destination is."""
        return f"table {self.name} ({self.format})"

    def check_start(self, spark: Any, run: str) -> None:
        """Before a run's first commit: refuse ``mode="error"`` when the table exists with data of another run."""
        if self.mode == "error" and spark.catalog.tableExists(self.name):
            location = _describe(spark, self.name).get("Location")
            if location is not None and foreign_files(_local(location), run):
                raise FileExistsError(
                    f"table {self.name} already holds data and mode='error': choose mode='append' or 'overwrite'"
                )

    def write(self, spark: Any, df: Any, run: str, commit: int) -> int:
        """Create the table if needed, then write the commit's rows into a staging folder of its folder; rows."""
        return self._save(spark, df, staging_folder(table_base(self._ensure(spark, df)), run, commit))

    def publish(self, spark: Any, run: str, commit: int, *, first: bool) -> list[str]:
        """Switch the table to a snapshot holding the commit, in one catalog step; the commit's files.

        Run again after a crash it finishes the same commit: a snapshot built
        whole is used as it is, one the table already points at is only
        cleaned up after.
        """
        info = _describe(spark, self.name)
        location = _local(info.get("Location"), self.name)
        if self.partition_by and info.get("Partition Provider") == "Catalog":
            return self._publish_in_place(spark, location, run, commit, first)
        base = table_base(location)
        staging = staging_folder(base, run, commit)
        target = version_folder(base, run, commit)
        if location != target:
            if not target.is_dir():
                keep = not (first and self.mode == "overwrite")
                build_version(location, staging, target, run, commit, keep=keep)
            # The one step readers can see: before it the table is the last commit, after it this one.
            spark.sql(f"ALTER TABLE {self.name} SET LOCATION '{target}'")
        spark.catalog.refreshTable(self.name)
        shutil.rmtree(staging, ignore_errors=True)
        prune_versions(base, keep={target, location})
        return _marker_files(target, run, commit)

    def _publish_in_place(self, spark: Any, location: Path, run: str, commit: int, first: bool) -> list[str]:
        """A table whose partitions the catalog lists: move the files in as for a folder, then recover partitions."""
        log.info(
            "table %s lists its partitions in the catalog: commit %d is published file by file (readers may see"
            " part of it while the files move), then its partitions are recovered",
            self.name,
            commit,
        )
        if first and self.mode == "overwrite":
            clear_foreign(location, run)
        staged = staging_folder(table_base(location), run, commit)
        in_place = staging_folder(location, run, commit)
        if staged != in_place and staged.is_dir():
            in_place.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(in_place)
        files = publish_in_place(location, run, commit)
        spark.sql(f"ALTER TABLE {self.name} RECOVER PARTITIONS")
        spark.catalog.refreshTable(self.name)
        return files

    def _ensure(self, spark: Any, df: Any) -> Path:
        """The table's location, creating the (empty) table with ``df``'s schema if it does not exist."""
        if not spark.catalog.tableExists(self.name):
            empty = spark.createDataFrame([], df.schema)
            writer = empty.write.format(self.format).options(**self.options)
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            with _partitions_from_files(spark):
                try:
                    writer.saveAsTable(self.name)
                except Exception as err:  # noqa: BLE001 - Spark's error class differs between classic and Connect
                    if not _clear_dropped_snapshots(err):
                        raise
                    writer.saveAsTable(self.name)
        return _local(_describe(spark, self.name).get("Location"), self.name)


@dataclass(frozen=True)
class BatchOutput:
    """``fn(commit_id, df)`` for any sink: called once per commit, again with the same id after a crash."""

    fn: Callable[[str, Any], object]

    def describe(self) -> str:
        """One line for logs and the checkpoint: what this destination is."""
        return f"function {getattr(self.fn, '__name__', type(self.fn).__name__)}"

    def check_start(self, spark: Any, run: str) -> None:
        """Nothing to check: the function owns its sink."""

    def write(self, spark: Any, df: Any, run: str, commit: int) -> int:
        """Call the function with the commit's id (``<run>:<commit>``) and rows (cached: it may read them often)."""
        df = df.cache()
        try:
            rows = int(df.count())
            self.fn(f"{run}:{commit}", df)
        finally:
            df.unpersist()
        return rows

    def publish(self, spark: Any, run: str, commit: int, *, first: bool) -> list[str]:
        """Nothing to publish: the function's call was the commit."""
        return []


Output = FileOutput | TableOutput | BatchOutput
"""A destination for a pipeline's committed output."""


@contextmanager
def _partitions_from_files(spark: Any) -> Iterator[None]:
    """While a table is created: its partitions are found from its files, not listed in the catalog.

    Such a table's location is all a reader resolves, so switching it to a new
    snapshot publishes every partition at once; the session's setting is put
    back after.
    """
    before = spark.conf.get(_PARTITIONS_IN_CATALOG, None)
    spark.conf.set(_PARTITIONS_IN_CATALOG, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_PARTITIONS_IN_CATALOG)
        else:
            spark.conf.set(_PARTITIONS_IN_CATALOG, before)


def _describe(spark: Any, table: str) -> dict[str, str]:
    """``DESCRIBE TABLE EXTENDED``'s detailed rows as a mapping (``Location``, ``Partition Provider``, ...)."""
    return {str(row[0]): str(row[1]) for row in spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect() if row[1]}


def _local(location: str | None, table: str = "") -> Path:
    """A table location as a local path; tables without one are refused (they need a ``BatchOutput``)."""
    if not location:
        raise RuntimeError(f"table {table} has no file location: use BatchOutput for this table")
    return Path(location[len("file:") :] if location.startswith("file:") else location)


def _marker_files(root: Path, run: str, commit: int) -> list[str]:
    """The files commit ``commit``'s marker in ``root`` lists."""
    marker = root / MARKERS / f"{run}-c{commit:05d}.json"
    return list(json.loads(marker.read_text())["files"]) if marker.exists() else []


def _clear_dropped_snapshots(error: Exception) -> bool:
    """After ``DROP TABLE`` of a table published in snapshots, its folder keeps only hidden snapshot folders.

    Spark dropped the snapshot the table pointed at, not the folder the table
    was created in, and refuses to create a table of the same name there. A
    folder holding no visible data file is what a dropped table of ours left:
    it is removed (True, create again); any other folder is left to the user.
    """
    found = re.search(r"LOCATION_ALREADY_EXISTS.*?location '([^']+)' already exists", str(error), re.S)
    if found is None:
        return False
    folder = _local(found.group(1))
    if not (folder / VERSIONS).is_dir() or data_files(folder):
        return False
    log.info("removing %s: the snapshots of a dropped table of the same name", folder)
    shutil.rmtree(folder)
    return True
