"""The demo's word count as a DataFrame job of ArrowBolts (``acker-demo --dataframe``).

The same pipeline as :mod:`acker_demo.wordcount`, column-wise: sentences are
split with pyarrow compute (one child row per word, anchored to its sentence),
shuffled by word with ``repartition(partitions, "word")``, and a sink bolt
writes the rows to the same idempotent SQLite table, then fails the injected
words through the collector; every other row is acked when it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from acker_spark.sqlite import open_db, upsert
from acker_spark.steps.arrow_bolt import ArrowBolt

from .wordcount import FailureInjection, InjectedCrash, Job, Word

__all__ = [
    "NO_FAULTS",
    "WORD_SCHEMA",
    "split_sentences",
    "CheckWordRows",
    "CountWordRows",
    "build_job",
    "build_output_job",
    "build_source_job",
]

WORD_SCHEMA = "key string, position int, word string, attempt int"
"""The split bolt's output columns."""

NO_FAULTS = FailureInjection()
"""The default: nothing injected."""

# RE2's \w is ASCII only: letters and digits of any script, as Python's str \w matches.
_SEPARATORS = r"[^\p{L}\p{N}_']+"


def split_sentences(batch: pa.RecordBatch, collector: Any) -> None:
    """ArrowBolt function: each sentence's words (lower case), anchored to it; sentences are acked on return."""
    pieces = pc.split_pattern_regex(pc.utf8_lower(batch.column("value")), _SEPARATORS)
    parents = pc.list_parent_indices(pieces).to_numpy(zero_copy_only=False).astype(np.int64)
    words = pc.list_flatten(pieces)
    keep = pc.not_equal(words, "").to_numpy(zero_copy_only=False)  # separators at either end leave ""
    parents, words = parents[keep], pc.filter(words, pa.array(keep))
    # A word's position in its sentence: its index minus the index of its sentence's first word.
    first = np.flatnonzero(np.concatenate(([True], parents[1:] != parents[:-1])))
    positions = np.arange(len(parents)) - np.repeat(first, np.diff(np.append(first, len(parents))))
    anchors = pa.array(parents)
    out = {
        "key": pc.take(batch.column("key"), anchors),
        "position": pa.array(positions, pa.int32()),
        "word": words,
        "attempt": pc.take(batch.column("attempt"), anchors),
    }
    collector.emit(out, anchors=parents)


class CountWordRows:
    """ArrowBolt sink: write the batch's word rows to SQLite, fail the injected ones; the rest are acked on return."""

    def __init__(self, db_path: str | Path, injection: FailureInjection = NO_FAULTS) -> None:
        self.db_path = str(db_path)
        self.injection = injection

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        crash = context is not None and self.injection.crashes(context.partitionId(), context.attemptNumber())
        columns = batch.to_pydict()
        rows = list(zip(columns["key"], columns["position"], columns["word"]))
        failed = self._failed(columns)
        with open_db(self.db_path) as conn:
            if crash:
                # Some rows committed, then the attempt dies: the retry rewrites them (the sink is idempotent).
                upsert(conn, "words", ("record_key", "position", "word"), rows[: self.injection.crash_after])
                conn.commit()
                raise InjectedCrash(f"injected crash after {self.injection.crash_after} words (first attempt)")
            upsert(conn, "words", ("record_key", "position", "word"), [r for r, f in zip(rows, failed) if not f])
        # Committed: returning acks every row not failed here.
        collector.fail(failed)

    def _failed(self, columns: dict[str, list[Any]]) -> np.ndarray:
        """Which rows the injection fails (a hash per row: only when failures are injected at all)."""
        count = len(columns["key"])
        injection = self.injection
        if injection.fail_percent <= 0 and not injection.always_fail and not injection.fail_first:
            return np.zeros(count, dtype=bool)
        words = map(Word, columns["key"], columns["position"], columns["word"], columns["attempt"])
        return np.fromiter((injection.should_fail(w) for w in words), dtype=bool, count=count)


class CheckWordRows:
    """ArrowBolt step before the output: fails the injected word rows, passes the others on (anchored to themselves).

    The output rows are what the pipeline commits; a crash injected here kills
    the task's first attempt after ``crash_after`` rows of its first batch.
    """

    def __init__(self, injection: FailureInjection = NO_FAULTS) -> None:
        self.injection = injection
        self._counting = CountWordRows("", injection)  # its failure draw, without its SQLite sink

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and self.injection.crashes(context.partitionId(), context.attemptNumber()):
            raise InjectedCrash(f"injected crash in partition {context.partitionId()} (first attempt)")
        failed = self._counting._failed(batch.to_pydict())
        kept = np.flatnonzero(~failed)
        collector.emit(batch.take(pa.array(kept)), anchors=kept)
        collector.fail(failed)


def build_output_job(
    addresses: Sequence[str] | None, *, partitions: int = 4, injection: FailureInjection = NO_FAULTS
) -> tuple[Any, tuple[ArrowBolt, ArrowBolt]]:
    """The word count for ``SourcePipeline(..., output=FileOutput(...))``: the job returns the word rows to commit."""
    split = ArrowBolt(split_sentences, addresses, schema=WORD_SCHEMA, name="split")
    check = ArrowBolt(CheckWordRows(injection), addresses, schema=WORD_SCHEMA, name="check")

    def job(df: Any) -> Any:
        keyed = df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids")
        return check.apply_df(split.apply_df(keyed).repartition(partitions, "word"))

    return job, (split, check)


def build_job(
    addresses: Sequence[str] | None,
    db_path: str | Path,
    *,
    partitions: int = 4,
    injection: FailureInjection = NO_FAULTS,
) -> tuple[Job, tuple[ArrowBolt, ArrowBolt]]:
    """The DataFrame word-count job over frames of ``key``, ``value``, ``attempt`` and ``_acker_ids`` (None: untracked)."""
    split = ArrowBolt(split_sentences, addresses, schema=WORD_SCHEMA, name="split")
    count = ArrowBolt(CountWordRows(db_path, injection), addresses, schema=None, name="count")

    def job(df: Any) -> None:
        # Hash partitioning by word: a recomputed partition receives the same rows.
        words = split.apply_df(df).repartition(partitions, "word")
        count.apply_df(words).count()

    return job, (split, count)


def build_source_job(
    addresses: Sequence[str] | None,
    db_path: str | Path,
    *,
    partitions: int = 4,
    injection: FailureInjection = NO_FAULTS,
) -> tuple[Job, tuple[ArrowBolt, ArrowBolt]]:
    """The same word count for ``SourcePipeline.run(spark.read.text(dir), job)``: lines keyed by their identity.

    The pipeline's frame names the record ``_record_key`` and its delivery
    ``_attempt``; the bolts read ``key`` and ``attempt``, so the job renames them.
    """
    inner, bolts = build_job(addresses, db_path, partitions=partitions, injection=injection)

    def job(df: Any) -> None:
        inner(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids"))

    return job, bolts
