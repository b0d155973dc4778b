"""Before a run reads a record: the job run once on an empty frame, to catch the mistakes that lose or repeat output.

Two mistakes cost a night's output when they are found late:

* a job that returns its output DataFrame to a pipeline built without
  ``output=`` runs no action: nothing is read, nothing is written, and the run
  used to end as if it were done;
* a job that writes its output itself (``df.write.parquet(...)``,
  ``saveAsTable``, ``writeTo(...).append()``) writes once per delivery, so a
  replay or a rerun writes the same rows again, and the rows a bolt emitted
  before the writer are never acked.

:func:`check_job` calls ``job`` once, on the driver, with an empty DataFrame of
the tracked schema (the source's columns plus ``_record_key``, ``_attempt``
and ``_acker_ids``), while Spark's writers refuse to write from this thread:
a write the job attempts is recorded and stopped (nothing lands), and what the
job returns is compared with the pipeline's output. It costs one call of the
job per run (an empty local frame starts no Spark task), not one per round.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..run_report import RunError
from ..steps.frames import TRACKING_COLUMN
from .memory_source import is_dataframe

__all__ = ["JobWritesItself", "OutputForgotten", "OutputNotReturned", "check_job", "writes_refused"]

log = logging.getLogger(__name__)


class OutputNotReturned(RunError, TypeError):
    """A pipeline with an output ran a job that did not return its output DataFrame."""


class OutputForgotten(RunError, TypeError):
    """A job returned its output DataFrame to a pipeline built without ``output=``: its rows would be dropped."""


class JobWritesItself(RunError, TypeError):
    """The job runs Spark's writer itself: every delivery (a replay, a rerun) would write its rows again."""


class _WriteRefused(Exception):
    """Raised inside the job by a refused writer call, to stop the job before it writes."""


# The writer methods that land data (classic and Connect share the names).
_WRITER_METHODS = ("save", "saveAsTable", "insertInto", "parquet", "json", "csv", "orc", "text", "jdbc")
_WRITER_V2_METHODS = ("append", "create", "createOrReplace", "replace", "overwrite", "overwritePartitions")


def _writer_classes() -> list[tuple[type, tuple[str, ...]]]:
    """Spark's writer classes present in this interpreter, each with the methods that write."""
    classes: list[tuple[type, tuple[str, ...]]] = []
    for module_name in ("pyspark.sql.readwriter", "pyspark.sql.connect.readwriter"):
        try:
            module = __import__(module_name, fromlist=["DataFrameWriter"])
        except Exception:  # noqa: BLE001 - Connect's module needs grpc/pandas extras: absent means unused
            continue
        for name, methods in (("DataFrameWriter", _WRITER_METHODS), ("DataFrameWriterV2", _WRITER_V2_METHODS)):
            cls = getattr(module, name, None)
            if cls is not None:
                classes.append((cls, methods))
    return classes


def _target(method: str, writer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """What the refused call would have written, for the error: ``parquet('/out')``, ``saveAsTable('db.t')``."""
    where = args[0] if args else kwargs.get("path", kwargs.get("name", kwargs.get("tableName")))
    if where is None:
        where = getattr(writer, "_table_name", None) or getattr(writer, "_table", None)
    return f"{method}({where!r})" if where is not None else f"{method}()"


@contextlib.contextmanager
def writes_refused(attempts: list[str]) -> Iterator[None]:
    """While open, Spark's writer calls made by this thread are appended to ``attempts`` and raise instead of writing.

    Other threads (another pipeline's commit in the same driver) write as usual.
    """
    owner = threading.get_ident()
    saved: list[tuple[type, str, Any]] = []

    def refusing(cls_method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != owner:
                return original(self, *args, **kwargs)
            attempts.append(_target(cls_method, self, args, kwargs))
            raise _WriteRefused(cls_method)

        return call

    for cls, methods in _writer_classes():
        for method in methods:
            original = cls.__dict__.get(method)
            if original is None:
                continue
            saved.append((cls, method, original))
            setattr(cls, method, refusing(method, original))
    try:
        yield
    finally:
        for cls, method, original in saved:
            setattr(cls, method, original)


def check_job(spark: Any, schema: Any, job: Callable[[Any], object], output: Any) -> None:
    """Run ``job`` on an empty frame of ``schema`` (the tracked columns); raise if it writes or its result is wrong.

    Raises :class:`JobWritesItself` when the job called Spark's writer,
    :class:`OutputForgotten` when it returned a DataFrame and ``output`` is
    None, :class:`OutputNotReturned` when ``output`` is set and it returned no
    DataFrame with the tracking column. A job that fails on an empty frame for
    another reason is not judged here (its rounds will say what is wrong).
    """
    empty = spark.createDataFrame([], schema)
    attempts: list[str] = []
    result: object = None
    failed: BaseException | None = None
    with writes_refused(attempts):
        try:
            result = job(empty)
        except _WriteRefused:
            pass
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - whatever else the job raises is its rounds' to meet, not the check's
            failed = err
    if attempts:
        wanted = (
            "return that DataFrame instead (the pipeline's output commits it exactly once)"
            if output is not None
            else "return that DataFrame and pass output=FileOutput(path, ...) (or TableOutput/BatchOutput) to "
            "SourcePipeline, which commits the rows of acked deliveries exactly once"
        )
        raise JobWritesItself(
            f"the job writes its output itself ({', '.join(attempts)}): each delivery of a record (a replay, a "
            f"rerun) would write its rows again, and rows a bolt emitted before the writer are never acked. "
            f"Found by running the job on an empty frame before reading any record: nothing was written and no "
            f"record was read or marked done. Remove the write and {wanted}"
        )
    if failed is not None:
        log.debug("the job failed on an empty frame (%s); its result is judged by the rounds", failed)
        return
    if output is None and is_dataframe(result):
        raise OutputForgotten(
            "the job returned a DataFrame but the pipeline has no output=: nothing would compute it, so its rows "
            "would be dropped and no record read. Pass output=FileOutput(path, partition_by=[...]) (or "
            "TableOutput/BatchOutput) to SourcePipeline to commit them exactly once, or end the job with an action "
            "over a sink bolt. No record was read or marked done"
        )
    if output is not None and (not is_dataframe(result) or TRACKING_COLUMN not in result.columns):  # type: ignore[attr-defined]
        raise OutputNotReturned(not_returned_message(output, result))


def not_returned_message(output: Any, result: object) -> str:
    """The error for a job that did not return its output DataFrame to a pipeline with ``output``."""
    return (
        f"the pipeline has an output ({output.describe()}), so the job must return its output DataFrame (the rows "
        f"its last bolt emitted, with {TRACKING_COLUMN!r}), not {type(result).__name__}: return the DataFrame "
        "instead of writing it or running an action"
    )
