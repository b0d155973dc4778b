"""acker-bench --mode redrive: N dead letters redriven through a SourcePipeline job, each exactly once, how fast.

The bench fills a dead-letter table with N letters as a SourcePipeline run
leaves them (each a row ``{"id", "amount"}`` with a ValueError cause), starts
embedded ackers and a local SparkSession, and redrives every letter (uncapped
unless ``rate``) through a job whose ArrowBolt sink writes each batch's
``(id, attempt)`` to a Parquet file of its own and acks the rows. Exactly once
means: every letter ends ``acked`` in the table, the sink saw each id exactly
once, on its first attempt (no letter delivered twice), and no other id.
``seconds`` is the whole redrive: claiming the letters, writing their rows as
Parquet, the Spark job with tracking, and recording the outcomes. Before it,
the same rows run once through the same job as a plain ``SourcePipeline.run``
over Parquet (``run_seconds``): on a busy machine the ratio of the two says
more than either (``baseline=False`` leaves it out). A run of 1,000 rows
before both pays the Python workers' start, imports and acker connections.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RedriveBenchConfig", "run_redrive_bench"]


@dataclass(frozen=True)
class RedriveBenchConfig:
    """Letters, embedded ackers and their timeout, the Spark master, and the rate (None: uncapped)."""

    records: int = 100_000
    ackers: int = 2
    message_timeout: float = 600.0
    master: str = "local[2]"
    rate: float | None = None
    baseline: bool = True


class ParquetSink:
    """Writes each batch's ``(id, _attempt)`` into a Parquet file of its own under ``folder``; returning acks."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, batch: Any, collector: Any) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"id": batch.column("id"), "attempt": batch.column("_attempt")})
        pq.write_table(table, f"{self.folder}/{uuid.uuid4().hex}.parquet")


def _fill(store: Any, records: int) -> None:
    from acker_protocol.wire import Outcome
    from acker_spark.dead_letter import DeadLetter

    at = time.time()
    store.add_letters(
        DeadLetter(
            f"k{i:07d}",
            {"id": f"k{i:07d}", "amount": float(i)},
            Outcome.FAILED,
            1,
            at,
            f"ValueError: amount of k{i:07d} is not a number (at job.py:12 in parse)",
        )
        for i in range(records)
    )


def _baseline(spark: Any, client: Any, addresses: list[str], work: Path, records: int) -> float:
    """Seconds of a plain SourcePipeline.run of the same rows, from Parquet, through the same kind of job."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from acker_spark import ArrowBolt
    from acker_spark.executor_read.source_pipeline import SourcePipeline

    source, sink_folder = work / "input", work / "sink"
    source.mkdir(parents=True)
    sink_folder.mkdir()
    ids = [f"k{i:07d}" for i in range(records)]
    table = pa.table({"id": ids, "amount": [float(i) for i in range(records)]})
    half = -(-records // 2)  # two files, as the redrive writes on local[2]
    for part in range(2):
        pq.write_table(table.slice(part * half, half), str(source / f"part-{part}.parquet"))
    sink = ArrowBolt(ParquetSink(str(sink_folder)), addresses, schema=None, name=f"{work.name}-sink")
    started = time.monotonic()
    stats = SourcePipeline(spark, client, work / "checkpoint").run(
        spark.read.parquet(str(source)), lambda df: sink.apply_df(df).count(), key="id"
    )
    seconds = time.monotonic() - started
    if stats.acked != records:
        raise RuntimeError(f"the baseline run acked {stats.acked} of {records} records")
    return round(seconds, 3)


def run_redrive_bench(config: RedriveBenchConfig) -> dict[str, Any]:
    """Redrive ``config.records`` letters once; the figures and whether each went through exactly once."""
    import pyarrow.parquet as pq
    from acker_client import ClusterClient
    from acker_client.testing import local_cluster
    from acker_spark import ArrowBolt, DeadLetterStore, close_clients, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline

    if config.records < 1:
        raise ValueError("--records must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="acker-bench-redrive-"))
    spark, owned = None, False
    try:
        store = DeadLetterStore(work / "dead.sqlite")
        _fill(store, config.records)
        sink_folder = work / "sink"
        sink_folder.mkdir()
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None  # a test's shared session is left running
        spark = local_session(config.master, app_name="acker-bench-redrive")
        spark.range(1000).count()  # start the JVM's executors and Python workers before anything is timed
        run_seconds = None
        with local_cluster(config.ackers, message_timeout=config.message_timeout) as cluster:
            sink = ArrowBolt(ParquetSink(str(sink_folder)), cluster.addresses, schema=None, name="sink")
            with ClusterClient(cluster.addresses) as client:
                # A small tracked run first: the Python workers' imports and acker connections are paid here,
                # not by whichever timed run comes first.
                _baseline(spark, client, cluster.addresses, work / "warm-up", min(config.records, 1_000))
                if config.baseline:
                    run_seconds = _baseline(spark, client, cluster.addresses, work / "baseline", config.records)
                pipeline = SourcePipeline(spark, client, work / "checkpoint")
                report = pipeline.redrive(store, lambda df: sink.apply_df(df).count(), rate=config.rate)
            close_clients()
        seen = pq.read_table(str(sink_folder)).to_pydict() if any(sink_folder.iterdir()) else {"id": [], "attempt": []}
        ids, attempts = seen["id"], seen["attempt"]
        statuses = [letter.redrive_status for letter in store.all()]
        expected = {f"k{i:07d}" for i in range(config.records)}
        exactly_once = (
            len(ids) == config.records
            and set(ids) == expected
            and all(a == 1 for a in attempts)
            and statuses.count("acked") == config.records
            and report.acked == config.records
        )
        return {
            "mode": "redrive",
            "records": config.records,
            "seconds": round(report.seconds, 3),
            "records_per_s": round(config.records / report.seconds, 1) if report.seconds > 0 else 0.0,
            "rate_cap": config.rate,
            "run_seconds": run_seconds,
            "redrive_over_run": round(report.seconds / run_seconds, 2) if run_seconds else None,
            "acked": report.acked,
            "dead": report.dead,
            "sink_rows": len(ids),
            "exactly_once": exactly_once,
        }
    finally:
        if spark is not None and owned:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)
