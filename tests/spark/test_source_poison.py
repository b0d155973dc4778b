"""SourcePipeline: one raising record costs one record, with its cause; poison is not retried, timeouts are.

Reproduced before: under SourcePipeline one record whose bolt raised failed its
task, its job and every unfinished tree of the job, each round, so thousands of
good records were dead-lettered with no cause. Now the ArrowBolt isolates the
raising record inside its task (the others are acked in the same job), the
executor writes the exception into the checkpoint, and the pipeline's policy
dead-letters a poison type (ValueError) at once while it replays a TimeoutError.
"""

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
from acker_protocol.wire import Outcome
from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = 20_000
POLICY = ReplayPolicy(max_attempts=4, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers with a timeout no job here reaches."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


class Parse:
    """A sink that parses ``amount``: k00042's is malformed (ValueError), k00077's service times out once."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        ids = batch.column("id").to_pylist()
        attempts = batch.column("_attempt").to_numpy()
        for i, key in enumerate(ids):
            if key == "k00042":
                raise ValueError(f"amount of {key} is not a number: 'n/a'")
            if key == "k00077" and attempts[i] == 1:
                raise TimeoutError(f"pricing service timed out for {key}")
        np.asarray(batch.column("amount").to_numpy(), dtype=np.float64)  # the work


def test_one_raising_record_of_20000_is_one_dead_letter_with_its_cause(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """A ValueError record is dead-lettered at once with its exception; a TimeoutError record is retried and
    acked; the other 19,998 are acked on their first delivery."""
    rows = [(f"k{i:05d}", float(i)) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, amount double").repartition(4)
    sink = ArrowBolt(Parse(), ackers.addresses, schema=None, name="parse")
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY, dead_letters=letters)
    stats = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
    assert (stats.acked, stats.dead_lettered, stats.job_errors) == (RECORDS - 1, 1, 0)
    assert stats.replayed == 1  # the timeout, once; the malformed record was not retried
    (letter,) = letters.all()
    assert (letter.key, letter.reason, letter.attempts) == ("k00042", Outcome.FAILED, 1)
    assert letter.cause is not None and letter.cause.startswith("ValueError: amount of k00042 is not a number")
    assert "in __call__)" in letter.cause  # where it was raised
