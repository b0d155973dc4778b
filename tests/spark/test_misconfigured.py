"""Issue 23, case 2: a misconfigured job fails at once, with its cause, instead of dead-lettering quietly.

Reproduced on main: Bolts given the right ackers in the wrong order (the
driver's client in order) dead-lettered all 306 records over five attempts
each, every row ``FAILED`` with no text, and ``run()`` returned normally; the
cause ("check the client's address order") was only in executor stderr. Now
each executor checks the shard layout (Describe) as the driver does, the task
fails with ClusterMisconfigured, and the pipeline stops at that first job:
no replay, the source not read further, ``run()`` raises naming the cause.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient, ClusterMisconfigured, MessageId, TrackedTuple
from acker_protocol.wire import Outcome
from acker_spark import Bolt, DeadLetterStore, Delivery, GuaranteedPipeline, RecordsFailed
from pyspark import cloudpickle

from .test_undelivered import split, store  # the same two steps, shipped by value there

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = [(f"r{i}", f"alpha beta {i}") for i in range(12)]


def test_an_executor_checks_the_shard_order_as_the_driver_does(ackers: Any) -> None:
    """Outside Spark: a Bolt's task over addresses out of shard order raises, naming the position and the fix."""
    wrong = list(reversed(ackers.addresses))
    bolt = Bolt(store, wrong, name="store")
    tuples = [TrackedTuple(Delivery("k", "v", 1), MessageId({12345: 7}))]
    with pytest.raises(ClusterMisconfigured, match=r"step 'store': address 0 .* is acker shard 2 of 3.*shard order"):
        list(bolt.run_partition(0, tuples))


def test_bolts_in_the_wrong_shard_order_stop_the_run_at_once_with_the_cause(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    wrong = list(reversed(ackers.addresses))
    split_bolt, store_bolt = Bolt(split, wrong, name="split"), Bolt(store, wrong, name="store")
    dead_letters = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = GuaranteedPipeline(spark, client, max_pending=4, partitions=2, dead_letters=dead_letters)
    with pytest.raises(RecordsFailed) as raised:
        pipeline.run(RECORDS, lambda rdd: store_bolt.apply(split_bolt.apply(rdd)).count())
    error = raised.value
    assert error.stopped is not None and error.stopped.type == "ClusterMisconfigured"
    assert "misconfiguration" in str(error) and "shard order" in str(error)
    # Stopped at the first job: nothing replayed, no more of the source read, each record taken dead-lettered.
    assert (error.stats.job_errors, error.stats.replayed, error.stats.emitted) == (1, 0, 4)
    dead = dead_letters.all()
    assert [d.key for d in dead] == [key for key, _ in RECORDS[:4]]
    assert all(d.reason is Outcome.FAILED and d.cause and "ClusterMisconfigured" in d.cause for d in dead)
