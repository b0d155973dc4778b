"""acker-bench --mode pipeline: the plain Spark job against the tracked SourcePipeline, alternating, in one run.

Both read the same N lines from text files with ``spark.read.text`` and run
the demo's DataFrame word count (the ``split`` and ``count`` ArrowBolt
functions, a shuffle by word, the idempotent SQLite sink). The plain job runs
the functions untracked over ``spark.read.text(dir)`` keyed by file and
``monotonically_increasing_id``; the tracked one runs them through a
:class:`~acker_spark.executor_read.source_pipeline.SourcePipeline` against embedded ackers.
Rounds alternate (plain, tracked, plain, tracked, ...) so that machine noise
hits both; the best time of each is reported. Driver CPU is this Python
process's ``time.process_time()`` over a run (every driver thread: py4j, the
outcome streams, the journal; not the JVM), divided by N.

With ``reader_only`` each round also runs the same job behind the pipeline's
reading step with tracking off (:class:`~acker_spark.executor_read.source_reader.SourceReader`
with no acker addresses: the same extra ``mapInArrow`` stage and columns, no
trees, no inits, no acks): how much of the tracked run's extra time is the
reading stage itself, and how much is tracking.

With ``sink="parquet"`` the same lines are split into word rows written as
Parquet instead: :mod:`acker_bench.pipeline_parquet`. With ``raise_fraction``
that tracked Parquet job runs with a fraction of its records raising, against
none: :mod:`acker_bench.pipeline_raising`.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PipelineBenchConfig", "run_pipeline_bench"]


@dataclass(frozen=True)
class PipelineBenchConfig:
    """Records, files, alternating rounds, shuffle partitions, embedded ackers and their timeout."""

    records: int = 200_000
    files: int = 8
    rounds: int = 2
    partitions: int = 4
    ackers: int = 2
    message_timeout: float = 600.0
    master: str = "local[2]"
    reader_only: bool = False
    sink: str = "sqlite"  # or "parquet": plain df.write.parquet against FileOutput (acker_bench.pipeline_parquet)
    raise_fraction: float = 0.0  # > 0: the Parquet job with this fraction raising (acker_bench.pipeline_raising)


def _write_source(folder: Path, config: PipelineBenchConfig, records: int) -> Counter[str]:
    """``records`` generated sentences over ``files`` text files; the expected word counts."""
    from acker_demo.wordcount import tokenize
    from acker_spark import generated_sentences

    folder.mkdir(parents=True)
    expected: Counter[str] = Counter()
    outs = [open(folder / f"part-{i:02d}.txt", "w") for i in range(config.files)]  # noqa: SIM115 - closed below
    try:
        for index, record in enumerate(generated_sentences(records)):
            outs[index % config.files].write(record.value + "\n")
            expected.update(tokenize(record.value))
    finally:
        for out in outs:
            out.close()
    return expected


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _timed(fn: Any) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_pipeline_bench(config: PipelineBenchConfig) -> dict[str, Any]:
    """Run the comparison; the figures as a dict (seconds are the best round of each)."""
    if config.raise_fraction > 0:
        from .pipeline_raising import run_raising_bench

        return run_raising_bench(config)
    if config.sink == "parquet":
        from .pipeline_parquet import run_parquet_bench

        return run_parquet_bench(config)
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import build_job, build_source_job
    from acker_demo.wordcount import create_sink, sink_counts
    from acker_spark import close_clients, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.executor_read.source_reader import SourceReader, reader_schema
    from acker_spark.tracking.emission_log import RoundFilter, write_filter
    from acker_spark.tracking.identity import resolve_identity
    from pyspark.sql import functions as F

    from acker_service.process_cluster import ProcessCluster

    work = Path(tempfile.mkdtemp(prefix="acker-bench-pipeline-"))
    try:
        expected = _write_source(work / "in", config, config.records)
        _write_source(work / "warm", config, min(config.records, 10_000))
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None  # a test's shared session is left running
        spark = local_session(config.master, app_name="acker-bench-pipeline", shuffle_partitions=config.partitions)
        source = str(work / "in")

        def sink(name: str) -> Path:
            path = work / f"{name}.sqlite"
            create_sink(path, clear=True)
            return path

        def plain(db: Path, directory: str = source) -> None:
            job, _ = build_job(None, db, partitions=config.partitions)
            lines = spark.read.text(directory)
            job(
                lines.select(
                    F.concat_ws("#", F.col("_metadata.file_path"), F.monotonically_increasing_id()).alias("key"),
                    "value",
                    F.lit(1).alias("attempt"),
                    F.lit(b"").alias("_acker_ids"),
                )
            )

        def reader_only(db: Path, round_no: int) -> None:
            df = spark.read.text(source)
            spec = resolve_identity(spark, df, None)
            checkpoint = work / f"reader-only-{round_no}"
            everything = RoundFilter("all", np.zeros(0, np.uint64), np.zeros(0, np.uint16))
            path = write_filter(checkpoint, 0, everything)
            reader = SourceReader(spec, 1, "reader-only", str(checkpoint), 0, str(path), None)
            tracked_columns = spec.with_columns(df)
            job, _ = build_source_job(None, db, partitions=config.partitions)
            job(tracked_columns.mapInArrow(reader, reader_schema(tracked_columns.schema)))

        rows: dict[str, list[tuple[float, float]]] = {"plain": [], "tracked": [], "reader_only": []}
        exact: dict[str, bool] = {}
        result: dict[str, Any] = {"mode": "pipeline", "records": config.records, "files": config.files}
        plain(sink("warm"), str(work / "warm"))  # forks the Python workers once: no round pays for it
        with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout) as cluster:
            with ClusterClient(cluster.addresses) as client:
                for round_no in range(config.rounds):
                    db = sink(f"plain-{round_no}")
                    wall, cpu, _ = _timed(lambda db=db: plain(db))
                    rows["plain"].append((wall, cpu))
                    exact["plain"] = exact.get("plain", True) and sink_counts(db) == expected

                    if config.reader_only:
                        db = sink(f"reader-only-{round_no}")
                        wall, cpu, _ = _timed(lambda db=db, r=round_no: reader_only(db, r))
                        rows["reader_only"].append((wall, cpu))
                        exact["reader_only"] = exact.get("reader_only", True) and sink_counts(db) == expected

                    db = sink(f"tracked-{round_no}")
                    job, _ = build_source_job(cluster.addresses, db, partitions=config.partitions)
                    pipeline = SourcePipeline(spark, client, work / f"checkpoint-{round_no}")
                    rss_before = _rss_bytes()
                    wall, cpu, stats = _timed(lambda p=pipeline, j=job: p.run(spark.read.text(source), j))
                    rows["tracked"].append((wall, cpu))
                    assert pipeline.book is not None
                    table = pipeline.book.table
                    result["driver_rss_bytes_before_tracked"] = rss_before
                    result["driver_rss_bytes_after_tracked"] = _rss_bytes()
                    result["record_table_bytes"] = sum(
                        a.nbytes
                        for a in (
                            table.roots,
                            table.idents,
                            table.attempts,
                            table.rounds,
                            table.state,
                            table.reason,
                            table.due,
                        )
                    )
                    result["tracked_acked"] = stats.acked
                    result["tracked_replayed"] = stats.replayed
                    exact["tracked"] = exact.get("tracked", True) and (
                        sink_counts(db) == expected and stats.acked == config.records
                    )
        close_clients()
        if owned:
            spark.stop()
        plain_s, plain_cpu = min(rows["plain"])
        tracked_s, tracked_cpu = min(rows["tracked"])
        result.update(
            {
                "plain_seconds": round(plain_s, 3),
                "tracked_seconds": round(tracked_s, 3),
                "tracked_over_plain": round(tracked_s / plain_s, 3),
                "plain_driver_cpu_us_per_record": round(plain_cpu / config.records * 1e6, 3),
                "driver_cpu_us_per_record": round(tracked_cpu / config.records * 1e6, 3),
                "plain_rounds_seconds": [round(w, 3) for w, _ in rows["plain"]],
                "tracked_rounds_seconds": [round(w, 3) for w, _ in rows["tracked"]],
                "sink_exact": exact["plain"] and exact["tracked"],
                "driver_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "driver_cpu_measure": "time.process_time() of the driver Python process (all its threads, not the JVM)",
            }
        )
        if rows["reader_only"]:
            reader_s = min(rows["reader_only"])[0]
            result.update(
                {
                    "reader_only_seconds": round(reader_s, 3),
                    "reader_only_over_plain": round(reader_s / plain_s, 3),
                    "reader_only_rounds_seconds": [round(w, 3) for w, _ in rows["reader_only"]],
                    "reader_only_sink_exact": exact["reader_only"],
                }
            )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
