"""Tracked DataFrame pipelines over Spark Connect: a real local Connect server, no SparkContext, no RDDs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo import dataframe_job
from acker_spark import ArrowBolt, Bolt, close_clients, generated_sentences, tracked_rdd
from acker_spark.session import spark_context_of
from pyspark import cloudpickle
from pyspark.sql import functions as F

from .test_arrow_bolt import CrashingSink, run_frames
from .test_dataframe import WORDS, StoreGroups, split_rows
from .test_rdd_bolts import assert_every_record_acked_once, task_attempts

# The Connect server's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.connect]


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout outlives any job here."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def test_connect_session_has_no_spark_context(connect_spark: Any) -> None:
    """The fixture really is Spark Connect: no SparkContext, so nothing here can fall back to RDDs."""
    assert spark_context_of(connect_spark) is None
    assert type(connect_spark).__module__.startswith("pyspark.sql.connect")


def test_arrow_word_count_over_connect(connect_spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """The ArrowBolt word count (repartition by word) through SourcePipeline on Connect: every record ACKED once."""
    records = list(generated_sentences(120, seed=41))
    job, (split, count) = dataframe_job.build_job(ackers.addresses, db, partitions=3)
    stats = run_frames(connect_spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)
    assert split.commits is None and count.commits is None  # no accumulators on Connect


def test_row_bolts_with_groupby_over_connect(connect_spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """Row-function Bolt.apply_df (mapInArrow, no df.rdd) with a groupBy/collect_list on Connect: each record ACKED once."""
    records = list(generated_sentences(100, seed=42))
    split = Bolt(split_rows, ackers.addresses, name="split")
    store = Bolt(StoreGroups(db), ackers.addresses, name="store")

    def job(df: Any) -> None:
        groups = (
            split.apply_df(df, WORDS)
            .groupBy("word")
            .agg(
                F.collect_list(F.struct("key", "position")).alias("members"),
                F.collect_list("_acker_ids").alias("_acker_ids"),
            )
        )
        store.apply_df(groups).count()

    stats = run_frames(connect_spark, client, db, records, job)
    assert_every_record_acked_once(stats, records, db)


def test_task_retry_over_connect(connect_spark: Any, ackers: Any, client: ClusterClient, db: Path) -> None:
    """On the Connect server's local[2,4], a sink task's attempt 0 dies after writing; the retry acks each tree once."""
    records = list(generated_sentences(80, seed=44))
    split = ArrowBolt(dataframe_job.split_sentences, ackers.addresses, schema=dataframe_job.WORD_SCHEMA)
    store = ArrowBolt(CrashingSink(db, crash_partition=0), ackers.addresses, schema=None, name="store")

    def job(df: Any) -> None:
        store.apply_df(split.apply_df(df).repartition(2, "word")).count()

    stats = run_frames(connect_spark, client, db, records, job)
    assert task_attempts(db)[1] >= 1  # Spark retried the crashed task
    assert_every_record_acked_once(stats, records, db)


def test_untracked_dataframe_run_over_connect(connect_spark: Any, db: Path) -> None:
    """The untracked baseline (as_dataframe=True) on Connect runs the ArrowBolt job with no acker and matches the input."""
    from acker_demo.untracked import run_untracked
    from acker_demo.wordcount import expected_counts, sink_counts

    records = list(generated_sentences(30, seed=43))
    job, _ = dataframe_job.build_job(None, db, partitions=2)
    stats = run_untracked(connect_spark, records, job, batch_size=20, as_dataframe=True)
    assert (stats.acked, stats.jobs) == (30, 2)
    assert sink_counts(db) == expected_counts(records)


def test_rdd_jobs_are_refused_on_connect(connect_spark: Any) -> None:
    """RDD bolts over a tracked frame on Connect fail at once with a message pointing at the DataFrame bolts."""
    frame = connect_spark.createDataFrame([("k", b"")], "key string, _acker_ids binary")
    with pytest.raises(TypeError, match="Bolt.apply_df"):
        tracked_rdd(frame)
