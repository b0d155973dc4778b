"""A run started again on a finished checkpoint reports the same counts: one dead letter per dead record."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers with a timeout no job here reaches."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def fail_bad(batch: pa.RecordBatch, collector: Any) -> None:
    """A sink that fails every record whose text is ``bad`` (on every delivery) and acks the rest."""
    collector.fail(np.flatnonzero(np.array([t == "bad" for t in batch.column("text").to_pylist()], dtype=bool)))


def test_rerun_on_a_finished_checkpoint_counts_each_dead_record_once(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """5 of 40 records fail on all 3 deliveries: 5 dead letters, and a rerun on the checkpoint says 5, not 15."""
    rows = [(f"k{i:03d}", "bad" if i % 8 == 0 else "good") for i in range(40)]
    source = spark.createDataFrame(rows, "id string, text string")
    sink = ArrowBolt(fail_bad, ackers.addresses, schema=None, name="sink")
    policy = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
    letters = DeadLetterStore(tmp_path / "dead.sqlite")

    def run() -> Any:
        pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=policy, dead_letters=letters)
        return pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")

    first = run()
    assert (first.acked, first.dead_lettered, first.replayed) == (35, 5, 10)
    again = run()
    assert again.resumed and again.rounds == 0
    assert (again.acked, again.dead_lettered, again.replayed, again.emitted) == (35, 5, 10, 40)
    assert len(letters.all()) == 5


def test_first_log_line_says_whether_trees_are_replicated(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's first line names the acker count and replication, so a user sees whether an acker loss replays."""
    rows = [(f"k{i}", "good") for i in range(6)]
    with local_cluster(2, message_timeout=60.0, replicas=2) as cluster, ClusterClient(cluster.addresses) as client:
        sink = ArrowBolt(fail_bad, cluster.addresses, schema=None, name="sink")
        pipeline = SourcePipeline(spark, client, tmp_path / "cp")
        with caplog.at_level("INFO", logger="acker_spark.executor_read.source_pipeline"):
            pipeline.run(
                spark.createDataFrame(rows, "id string, text string"), lambda df: sink.apply_df(df).count(), key="id"
            )
    close_clients()
    first = [r.getMessage() for r in caplog.records if r.name == "acker_spark.executor_read.source_pipeline"][0]
    assert "2 ackers, replicas 2 (each tree kept by two ackers)" in first and str(tmp_path / "cp") in first
