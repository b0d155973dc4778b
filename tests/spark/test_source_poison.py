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


class CountingParse:
    """A sink raising ValueError for each key of ``bad``; counts rows handed to it and rows of calls that returned."""

    def __init__(self, bad: frozenset[str], handed: Any, returned: Any) -> None:
        self.bad = bad
        self.handed = handed
        self.returned = returned

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        self.handed.add(batch.num_rows)
        for key in batch.column("id").to_pylist():
            if key in self.bad:
                raise ValueError(f"amount of {key} is not a number: 'n/a'")
        self.returned.add(batch.num_rows)


def test_a_tenth_of_a_percent_raising_costs_about_itself_and_stays_exact(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    """40 raising records of 40,000 in batches of 500: 40 dead letters, each with its own cause and 1 attempt;
    every other record returned once and acked on its first delivery; the function handed at most 1.2x the rows."""
    records = 40_000
    bad = frozenset(f"k{i:05d}" for i in range(537, records, 1_000))
    rows = [(f"k{i:05d}", float(i)) for i in range(records)]
    source = spark.createDataFrame(rows, "id string, amount double").repartition(2)
    handed, returned = spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0)
    sink = ArrowBolt(CountingParse(bad, handed, returned), ackers.addresses, schema=None, name="parse")
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY, dead_letters=letters)
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "500")
    try:
        stats = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
    finally:
        spark.conf.set(key, before)
    assert (stats.acked, stats.dead_lettered, stats.replayed, stats.job_errors) == (records - len(bad), len(bad), 0, 0)
    assert returned.value == records - len(bad)  # each good record in exactly one call that returned
    print(f"rows handed to the function: {handed.value:,} for {records:,} records")
    assert handed.value <= 1.2 * records
    found = {letter.key: letter for letter in letters.all()}
    assert set(found) == bad
    for name, letter in found.items():
        assert (letter.reason, letter.attempts) == (Outcome.FAILED, 1)
        assert letter.cause is not None and letter.cause.startswith(f"ValueError: amount of {name} is not a number")
