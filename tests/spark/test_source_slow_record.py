"""SourcePipeline: a record that hangs in a bolt does not time out the rows read with it (issue 28, item 5).

Reproduced before: one record hanging in an ArrowBolt while the other rows of
its partition, read (their trees started by the reader) but not yet handed to
the bolt in a later Arrow batch, timed out and were delivered twice: the bolt's
leases covered only the batches it had received. Now the bolt also holds every
tree the reader of its own task started (the task's emission file), so those
rows keep their trees until the bolt gets to them.

The acker timeout is short (2 s) and the record hangs past it for real, so the
test is in the chaos tier.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

TIMEOUT = 2.0
HANG = 4 * TIMEOUT  # past the ackers' latest expiry (1.5 T) of a tree nobody renews
RECORDS = 400
POLICY = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Two in-process ackers with a 2 s message timeout (3 buckets: a tree expires 2-3 s after its last reset)."""
    with local_cluster(2, message_timeout=TIMEOUT, buckets=3) as cluster:
        yield cluster
    close_clients()


@pytest.fixture
def small_batches(spark: Any) -> Iterator[None]:
    """Arrow batches of 25 rows: the partition reaches the bolt in 16 batches, most of them read ahead."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "25")
    yield
    spark.conf.set(key, before)


class HangOnce:
    """A sink whose record k0003 hangs for HANG seconds on its first delivery."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        keys = batch.column("id").to_pylist()
        attempts = batch.column("_attempt").to_pylist()
        if any(k == "k0003" and a == 1 for k, a in zip(keys, attempts)):
            time.sleep(HANG)


def test_rows_read_behind_a_hung_record_keep_their_trees(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, small_batches: None
) -> None:
    """Every record acked on its first delivery: none of the 399 rows behind the hung one timed out."""
    rows = [(f"k{i:04d}", i) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, n long").repartition(1)
    sink = ArrowBolt(HangOnce(), ackers.addresses, schema=None, name="hang-once")
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY)
    stats = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
    assert (stats.acked, stats.dead_lettered, stats.job_errors) == (RECORDS, 0, 0)
    assert (stats.timed_out, stats.replayed) == (0, 0), "rows read behind the hung record were delivered again"
