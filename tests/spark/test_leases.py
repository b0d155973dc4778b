"""Leases on real local Spark: a bolt that works past the ackers' message timeout keeps its trees (issue 21).

The ackers time a tree out between T and 1.5 T after its last init or reset
(3 buckets); the spout's backstop is 1.75 T. Each bolt here holds its
partition's tuples, sleeps for 2.5 T and only then acks them. T leaves room
for the job to reach its tasks on a busy machine (2-5 s seen here): leases
start with the task. The control without leases runs on the RDD path only. With leases (the default,
the timeout learned from the ackers' Describe) every record is ACKED; with
``leases=False`` the same job's records end TIMED_OUT.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient, Spout, TrackedTuple
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import ArrowBolt, Bolt, Delivery, close_clients
from acker_spark.steps.frames import delivery_frame
from pyspark import cloudpickle

from .test_executor import Outcomes

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

TIMEOUT = 6.0
WORK = 2.5 * TIMEOUT  # past the ackers' latest expiry (1.5 T) and the spout's backstop (1.75 T)
RECORDS = 6


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Two in-process ackers with a short timeout, so a slow bolt outlives it."""
    with local_cluster(2, message_timeout=TIMEOUT, buckets=3) as cluster:
        yield cluster
    close_clients()


def slow_ack(tuples: Iterator[TrackedTuple], collector: Any) -> Iterator[TrackedTuple]:
    """Hold the partition's tuples, work past the timeout, then ack them."""
    held = list(tuples)
    time.sleep(WORK)
    for t in held:
        collector.ack(t)
    return iter(())


def slow_ack_batch(batch: pa.RecordBatch, collector: Any) -> None:
    """The columnar twin: work past the timeout; the batch's rows are acked on return."""
    time.sleep(WORK)


def _same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return batches


def _emitted(spout: Spout) -> list[TrackedTuple]:
    return [spout.emit(Delivery(f"r{i}", f"record {i}", 1), f"r{i}") for i in range(RECORDS)]


def _settled(spout: Spout, outcomes: Outcomes) -> dict[Any, list[Outcome]]:
    assert spout.wait_idle(30.0), f"{spout.pending} records never settled"
    return outcomes.by_id


@pytest.mark.parametrize("leases", [True, False], ids=["leases", "no-leases"])
def test_rdd_bolt_working_past_the_timeout_keeps_its_trees(spark: Any, ackers: Any, leases: bool) -> None:
    """A Bolt sleeping 2.5x the message timeout: ACKED with leases, TIMED_OUT without."""
    outcomes = Outcomes()
    with ClusterClient(ackers.addresses) as client, Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout:
        rdd = spark.sparkContext.parallelize(_emitted(spout), 2)
        Bolt(slow_ack, ackers.addresses, leases=leases).apply(rdd).count()
        settled = _settled(spout, outcomes)
        resets = spout.stats.timeout_resets
    expected = Outcome.ACKED if leases else Outcome.TIMED_OUT
    assert settled == {f"r{i}": [expected] for i in range(RECORDS)}
    assert (resets > 0) == leases  # the acker told the spout about every renewal


def test_arrow_bolt_working_past_the_timeout_keeps_its_trees(spark: Any, ackers: Any) -> None:
    """An ArrowBolt sink sleeping 2.5x the message timeout: ACKED."""
    # Start Arrow's Python workers first (the session warmed only plain ones): leases start with the task.
    spark.range(2, numPartitions=2).mapInArrow(_same, "id long").count()
    outcomes = Outcomes()
    with ClusterClient(ackers.addresses) as client, Spout(client, on_ack=outcomes.ack, on_fail=outcomes.fail) as spout:
        frame = delivery_frame(spark, _emitted(spout), partitions=2)
        ArrowBolt(slow_ack_batch, ackers.addresses, schema=None).apply_df(frame).count()
        settled = _settled(spout, outcomes)
    assert settled == {f"r{i}": [Outcome.ACKED] for i in range(RECORDS)}
