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
  (``saveAsTable`` creates it, with ``partition_by``, on the first commit);
  commits are published into its location as for files, then the table is
  refreshed (and its partitions recovered).
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
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

__all__ = ["BatchOutput", "FileOutput", "Output", "TableOutput", "published_files"]

_FORMATS = ("parquet", "json", "csv", "orc", "text")
_MODES = ("append", "overwrite", "error")
STAGING = ".acker-staging"
MARKERS = "_acker_commits"


def _check(format: str, mode: str, partition_by: Sequence[str]) -> tuple[str, ...]:
    if format not in _FORMATS:
        raise ValueError(f"format {format!r} is not one of {', '.join(_FORMATS)} (use BatchOutput for other sinks)")
    if mode not in _MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(_MODES)}")
    if isinstance(partition_by, str):
        return (partition_by,)
    return tuple(partition_by)


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


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
            return sum(pq.read_metadata(f).num_rows for f in _data_files(folder))
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
        if self.mode == "error" and _foreign_files(Path(self.path), run):
            raise FileExistsError(
                f"the output folder {self.path} already holds data and mode='error': choose mode='append' or"
                " 'overwrite', or another folder"
            )

    def write(self, spark: Any, df: Any, run: str, commit: int) -> int:
        """Write commit ``commit``'s rows into its staging folder (replacing what an interrupted try left); rows."""
        return self._save(spark, df, _staging(Path(self.path), run, commit))

    def publish(self, spark: Any, run: str, commit: int, *, first: bool) -> list[str]:
        """Move the staged files into place (the first commit of an overwrite run clears the folder first)."""
        root = Path(self.path)
        if first and self.mode == "overwrite":
            _clear_foreign(root, run)
        return _publish(root, run, commit)


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
            location = _location(spark, self.name)
            if location is not None and _foreign_files(location, run):
                raise FileExistsError(
                    f"table {self.name} already holds data and mode='error': choose mode='append' or 'overwrite'"
                )

    def write(self, spark: Any, df: Any, run: str, commit: int) -> int:
        """Create the table if needed, then write the commit's rows into a staging folder of its location; rows."""
        return self._save(spark, df, _staging(self._ensure(spark, df), run, commit))

    def publish(self, spark: Any, run: str, commit: int, *, first: bool) -> list[str]:
        """Move the staged files into the table's location, then refresh the table (and recover partitions)."""
        location = _location(spark, self.name)
        if location is None:
            raise RuntimeError(f"table {self.name} has no file location: use BatchOutput for this table")
        if first and self.mode == "overwrite":
            _clear_foreign(location, run)
        files = _publish(location, run, commit)
        if self.partition_by:
            try:
                spark.sql(f"ALTER TABLE {self.name} RECOVER PARTITIONS")
            except Exception:  # noqa: BLE001 - a catalog that lists partitions from the files needs none
                pass
        spark.catalog.refreshTable(self.name)
        return files

    def _ensure(self, spark: Any, df: Any) -> Path:
        """The table's location, creating the (empty) table with ``df``'s schema if it does not exist."""
        if not spark.catalog.tableExists(self.name):
            empty = spark.createDataFrame([], df.schema)
            writer = empty.write.format(self.format).options(**self.options)
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            writer.saveAsTable(self.name)
        location = _location(spark, self.name)
        if location is None:
            raise RuntimeError(f"table {self.name} has no file location: use BatchOutput for this table")
        return location


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


def published_files(path: str | Path) -> list[Path]:
    """The data files of complete commits at ``path`` (from their markers), for readers that must not see a partial one."""
    root = Path(path)
    files: list[Path] = []
    markers = root / MARKERS
    for marker in sorted(markers.glob("*.json")) if markers.is_dir() else []:
        files.extend(root / name for name in json.loads(marker.read_text())["files"])
    return files


def _staging(root: Path, run: str, commit: int) -> Path:
    return root / STAGING / f"{run}-c{commit:05d}"


def _location(spark: Any, table: str) -> Path | None:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    for row in rows:
        if row[0] == "Location" and row[1]:
            location = str(row[1])
            return Path(location[len("file:") :] if location.startswith("file:") else location)
    return None


def _data_files(folder: Path) -> list[Path]:
    """Visible data files under ``folder`` (Spark's own ``_SUCCESS``, ``.crc`` and hidden folders left out)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not _hidden(d)]
        found.extend(Path(dirpath) / f for f in filenames if not _hidden(f))
    return sorted(found)


def _foreign_files(root: Path, run: str) -> bool:
    """True if ``root`` holds data files that are not this run's."""
    return root.is_dir() and any(not f.name.startswith(f"{run}-") for f in _data_files(root))


def _clear_foreign(root: Path, run: str) -> None:
    """Delete every data file (and empty folder) that is not this run's: mode ``overwrite``, before its first commit."""
    for path in _data_files(root) if root.is_dir() else []:
        if not path.name.startswith(f"{run}-"):
            path.unlink()
    for dirpath, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        folder = Path(dirpath)
        if folder != root and not any(_hidden(p) for p in folder.relative_to(root).parts) and not any(folder.iterdir()):
            folder.rmdir()


def _publish(root: Path, run: str, commit: int) -> list[str]:
    """Move commit ``commit``'s staged files into place; write its marker; return the files (relative to ``root``)."""
    staging = _staging(root, run, commit)
    prefix = f"{run}-c{commit:05d}-"
    for path in _data_files(staging) if staging.is_dir() else []:
        relative = path.relative_to(staging)
        target = root / relative.parent / f"{prefix}{relative.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    shutil.rmtree(staging, ignore_errors=True)
    files = sorted(str(p.relative_to(root)) for p in _data_files(root) if p.name.startswith(prefix))
    marker = root / MARKERS / f"{run}-c{commit:05d}.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(json.dumps({"run": run, "commit": commit, "files": files}))
    os.replace(tmp, marker)
    return files
