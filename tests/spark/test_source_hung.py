"""A record that hangs its task, failed at the acker: the run cancels the hung round and finishes in seconds.

Reproduced before: one record hanging 600 s in a bolt, failed with ``acker-ctl
fail``, ended FAILED at the acker, but SourcePipeline's driver waited for the
Spark job, that is the full 600 s. Now the round watch sees that every tree
the round started has ended, one failed from outside the job, and that no
tree was started since: it cancels the round's job group, and the failed
record is replayed (its second attempt does not hang) and acked.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_spark import ArrowBolt, ReplayPolicy
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.tracking.emission_log import read_round
from acker_spark.tracking.identity import derive_roots, hash_key_column
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

RECORDS = 40
HUNG = "k00007"


# ``ackers``: conftest's, whose 4 s timeout the records read behind the hung one reach (replayed).


@pytest.fixture
def one_row_batches(spark: Any) -> Iterator[None]:
    """One record per Arrow batch: the hung record holds no other in its bolt batch."""
    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1")
    yield
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)


class Price:
    """A sink whose call for ``HUNG`` never returns on its first attempt (600 s)."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        attempts = batch.column("_attempt").to_numpy()
        for i, key in enumerate(batch.column("id").to_pylist()):
            if key == HUNG and attempts[i] == 1:
                time.sleep(600)


def test_a_hung_record_failed_at_the_acker_lets_the_run_finish(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path, one_row_batches: None
) -> None:
    rows = [(f"k{i:05d}", float(i)) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, amount double").repartition(2)
    sink = ArrowBolt(Price(), ackers.addresses, schema=None, name="price")
    policy = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=policy, hang_grace=1.0)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["stats"] = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            result["error"] = err

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    # The operator's view: the hung record's tree, once its task started it; then `acker-ctl fail`.
    ident = hash_key_column(pa.array([HUNG]), "id")
    root = None
    while root is None and runner.is_alive():
        salt = pipeline._manifest.salt
        if salt:
            candidate = int(derive_roots(salt, ident, np.ones(1, dtype=np.uint16))[0])
            rounds = range(pipeline._manifest.source.next_round) if pipeline._manifest.source else range(0)
            if any(candidate in set(read_round(pipeline.checkpoint.path, r).roots.tolist()) for r in rounds):
                root = candidate
        time.sleep(0.2)  # polling the checkpoint, no assertion on time
    assert root is not None, result
    with ClusterClient(ackers.addresses) as operator:
        operator.fail(root)
        operator.flush()
    runner.join(300)  # far less than the 600 s the record hangs
    assert not runner.is_alive(), "the run waited for the hung task"
    assert "error" not in result, result.get("error")
    stats = result["stats"]
    assert (stats.acked, stats.dead_lettered) == (RECORDS, 0)
    assert stats.replayed >= 1  # the hung record, on its second attempt
