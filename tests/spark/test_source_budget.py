"""SourcePipeline's failure budget: a job whose records fail in bulk stops while it runs, naming the cause.

Reproduced before: with 20% of 20,000 records raising, the job was handed
240,920 rows (12x the input) before the run stopped after 65 s, and no
error said why. Now the round watch counts the causes the executors write
while the job runs, cancels the round's job group once more than 5% of the
records read failed for good, and ``run`` raises BudgetExceeded naming
ValueError with its count and an example record. Records not processed stay
in the checkpoint: the fixed job, run again with it, finishes the run.
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
from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy
from acker_spark.budget import BudgetExceeded, FailureBudget
from acker_spark.executor_read.source_pipeline import SourcePipeline
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = 20_000
POLICY = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers(patient_ackers: Any) -> Any:
    """The ackers of this module: a timeout no job here reaches (conftest's ``patient_ackers``)."""
    return patient_ackers


@pytest.fixture
def small_batches(spark: Any) -> Iterator[None]:
    """Arrow batches of 100 rows: records are read, processed and failed in steps the budget can see."""
    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    yield
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)


class Parse:
    """A sink parsing ``amount``: with ``broken``, every fifth record's is malformed (ValueError)."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        for key in batch.column("id").to_pylist():
            if self.broken and int(key[1:]) % 5 == 0:
                raise ValueError(f"amount of {key} is not a number: 'n/a'")
        np.asarray(batch.column("amount").to_numpy(), dtype=np.float64)  # the work


def test_a_job_failing_20_percent_stops_within_the_bound_and_a_fixed_rerun_continues(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, small_batches: None
) -> None:
    rows = [(f"k{i:05d}", float(i)) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, amount double").repartition(8)
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    checkpoint = tmp_path / "cp"
    broken = ArrowBolt(Parse(broken=True), ackers.addresses, schema=None, name="parse")
    pipeline = SourcePipeline(spark, client, checkpoint, policy=POLICY, dead_letters=letters)
    with pytest.raises(BudgetExceeded) as raised:
        pipeline.run(source, lambda df: broken.apply_df(df).count(), key="id")
    error = raised.value
    print(
        f"\nbudget stop: {error.dead} of {error.read} read failed for good, {error.dead_past} past the bound"
        f" (~{error.dead_past * 5} records processed past it); {error.read_after} records read and"
        f" {error.seconds_after:.2f} s from the verdict to the job's end; {len(letters.all())} dead letters"
    )
    # Within the bound: at most 1,000 records read past the budget before the job stopped. What was
    # processed past it is counted by its failures (one in five records fails), and that count also
    # takes in the failures of records processed *before* the verdict that settled after it; on a
    # loaded machine (a fresh-clone run beside another Spark worker) that lag alone gave 237 dead
    # past the bound with nothing read after it. So the processed half is checked at twice the bound.
    assert error.read_after <= 1_000 and error.dead_past * 5 <= 2_000
    assert error.read < RECORDS and error.dead > FailureBudget().fraction * error.read  # type: ignore[operator]
    top = error.causes[0]
    assert (top.kind, len(error.causes)) == ("ValueError", 1) and top.count >= 1
    assert int(top.example_key[1:]) % 5 == 0  # a record key, one of the malformed ones
    assert top.example_cause.startswith(f"ValueError: amount of {top.example_key} is not a number")
    assert f"x ValueError (e.g. {top.example_key}: ValueError: amount of" in str(error)
    assert error.stats is not None and error.stats.job_errors == 0  # cancelled, not failed

    # The job fixed, the same checkpoint: the run continues where it stopped.
    fixed = ArrowBolt(Parse(broken=False), ackers.addresses, schema=None, name="parse-fixed")
    again = SourcePipeline(spark, client, checkpoint, policy=POLICY, dead_letters=letters)
    stats = again.run(source, lambda df: fixed.apply_df(df).count(), key="id")
    dead = {letter.key for letter in letters.all()}
    assert all(int(key[1:]) % 5 == 0 for key in dead)  # only malformed records were dead-lettered
    assert len(dead) == len(letters.all())  # each once
    assert (stats.acked, stats.dead_lettered) == (RECORDS - len(dead), len(dead))
    assert stats.resumed and stats.pending == 0
