"""One Python pass per stage: the reading step, consecutive bolts and the stager run as one ``mapInArrow``."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, close_clients
from acker_spark.executor_read import source_open
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.output import FileOutput, run_output
from acker_spark.steps.fusion import python_steps
from pyspark import cloudpickle
from pyspark.sql import functions as F

from .test_output import FAST, expected_words, keyed_source, rows_of, split_job

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark


def _split(batch: pa.RecordBatch, collector: Any) -> None:
    pieces = pc.split_pattern(batch.column("text"), " ")
    collector.emit({"word": pc.list_flatten(pieces)}, anchors=pc.list_parent_indices(pieces))


def _upper(batch: pa.RecordBatch, collector: Any) -> None:
    words = batch.column("word")
    collector.emit({"word": pc.utf8_upper(words), "n": pc.utf8_length(words)}, anchors=np.arange(batch.num_rows))


def _lines(spark: Any) -> Any:
    rows = [(f"a{i} b{i} c{i}",) for i in range(50)]
    return spark.createDataFrame(rows, "text string").select("text", F.lit(b"").alias("_acker_ids"))


def test_consecutive_bolts_and_a_column_selection_run_in_one_python_step(spark: Any) -> None:
    """Two bolts with plain selections (renames) between them: one MapInArrow node, the same rows as step by step."""
    split = ArrowBolt(_split, None, schema="word string", name="split")
    upper = ArrowBolt(_upper, None, schema="word string, n int", name="upper")
    words = split.apply_df(_lines(spark))
    fused = upper.apply_df(words.select(F.col("word").alias("word"), "_acker_ids"))
    assert python_steps(fused) == 1
    expected = sorted((f"{c}{i}".upper(), len(f"{c}{i}")) for i in range(50) for c in "abc")
    assert sorted((r["word"], r["n"]) for r in fused.collect()) == expected


def test_a_selection_of_a_bolt_frame_the_job_does_not_hold_runs_in_the_same_python_step(spark: Any) -> None:
    """``bolt.apply_df(df).select(...)`` keeps no reference to the bolt's frame: the next step still joins its pass."""
    split = ArrowBolt(_split, None, schema="word string", name="split")
    upper = ArrowBolt(_upper, None, schema="word string, n int", name="upper")
    fused = upper.apply_df(split.apply_df(_lines(spark)).select(F.col("word").alias("word"), "_acker_ids"))
    gc.collect()
    assert python_steps(fused) == 1
    expected = sorted((f"{c}{i}".upper(), len(f"{c}{i}")) for i in range(50) for c in "abc")
    assert sorted((r["word"], r["n"]) for r in fused.collect()) == expected


def test_a_shuffle_or_a_computed_column_keeps_the_steps_apart(spark: Any) -> None:
    """A repartition (a new stage) or a column Spark computes between bolts: two Python steps, as before."""
    split = ArrowBolt(_split, None, schema="word string", name="split")
    upper = ArrowBolt(_upper, None, schema="word string, n int", name="upper")
    words = split.apply_df(_lines(spark))
    assert python_steps(upper.apply_df(words.repartition(3))) == 2
    computed = words.select(F.concat("word", F.lit("!")).alias("word"), "_acker_ids")
    shouted = upper.apply_df(computed)
    assert python_steps(shouted) == 2
    assert sorted(r["word"] for r in shouted.collect()) == sorted(f"{c}{i}!".upper() for i in range(50) for c in "abc")


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers with a timeout no job here reaches."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def test_the_pipeline_reads_tracks_and_stages_in_one_python_pass(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader, bolt and stager of a tracked job with exactly-once output: one Python step; each row once."""
    made: list[Any] = []
    real = source_open.map_in_arrow

    def noting(df: Any, function: Any, schema: Any) -> Any:
        out = real(df, function, schema)
        made.append(out)
        return out

    monkeypatch.setattr(source_open, "map_in_arrow", noting)  # the reader's frame
    monkeypatch.setattr(run_output, "map_in_arrow", noting)  # the stager's
    out = tmp_path / "out"
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(out)))
    pipeline.run(keyed_source(spark, 60), split_job(ackers.addresses), key="id")
    assert rows_of(spark.read.parquet(str(out))) == expected_words(60)
    staged = made[-1]  # the stager's frame (the reader's came first)
    assert python_steps(staged) == 1
