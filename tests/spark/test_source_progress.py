"""SourcePipeline's progress moves during a Spark job, and acker-ctl progress reads it (issue 28, item 4).

Reproduced before: nothing showed progress while a round's job ran (the
driver thread is blocked in it; ``on_progress`` is called between rounds).
Here the job's own bolt waits, inside its Spark task, until the driver's
``progress.json`` shows the rows its reader has read while the job is still
running: only a figure that moves during the job lets it go on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_ctl.cli import main as ctl_main
from acker_spark import ArrowBolt, ReplayPolicy, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = 300
POLICY = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    with local_cluster(2, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


class WaitForProgress:
    """A sink whose first batch waits (up to a minute) for progress.json to show this running job's reads."""

    def __init__(self, checkpoint: Path, seen: Path) -> None:
        self.checkpoint = checkpoint
        self.seen = seen

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        if self.seen.exists():
            return
        deadline = time.monotonic() + 60.0  # a failure bound, not a measurement
        figures: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                figures = json.loads((self.checkpoint / "progress.json").read_text())
            except (FileNotFoundError, ValueError):
                figures = {}
            if figures.get("in_job") and figures.get("read", 0) >= batch.num_rows:
                break
            time.sleep(0.1)
        self.seen.write_text(json.dumps(figures))


def test_progress_moves_while_the_job_runs_and_acker_ctl_shows_it(
    spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path
) -> None:
    checkpoint, seen = tmp_path / "cp", tmp_path / "seen.json"
    rows = [(f"k{i:04d}", i) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, n long").repartition(1)
    sink = ArrowBolt(WaitForProgress(checkpoint, seen), ackers.addresses, schema=None, name="wait")
    pipeline = SourcePipeline(spark, client, checkpoint, policy=POLICY, progress="log", progress_file_interval=0.2)
    stats = pipeline.run(source, lambda df: sink.apply_df(df).count(), key="id")
    assert stats.acked == RECORDS
    during = json.loads(seen.read_text())
    assert during.get("in_job") is True, f"progress.json never showed the running job's reads: {during}"
    assert (during["round"], during["state"]) == (0, "running")
    assert 0 < during["read"] <= RECORDS and during["acked"] == 0
    after = json.loads((checkpoint / "progress.json").read_text())
    assert (after["state"], after["read"], after["acked"], after["pending"], after["dead"]) == (
        "finished", RECORDS, RECORDS, 0, 0
    )  # fmt: skip
    printed: list[str] = []
    assert ctl_main(["progress", "--checkpoint", str(checkpoint)], out=printed.append) == 0
    assert printed[0].startswith(f"run {after['name']}: finished")
    assert f"acked {RECORDS}" in printed[0].splitlines()[1] or f"acked {RECORDS}" in "\n".join(printed)
