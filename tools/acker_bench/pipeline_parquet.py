"""acker-bench --mode pipeline --sink parquet: plain ``df.write.parquet`` against exactly-once ``FileOutput``.

Both jobs read the same N lines with ``spark.read.text`` and split them into
word rows ``(key, position, word)`` with the demo's ``split_sentences``
function (``key``: the line's ``xxhash64``, the same whoever computes it):

- plain: the function untracked, ``df.write.parquet(out)``;
- tracked: a :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline` with
  ``output=FileOutput(out)``: the executors stage each Arrow batch of the word
  rows under the checkpoint and ack it, the driver commits the rows of the
  ACKED trees with Spark's Parquet writer at the end of the run.

Rounds alternate (plain, tracked, ...) so that machine noise hits both; the
best of each is reported. The tracked time is split into the commit step
(the driver reading the staged rows back, keeping the ACKED ones once and
writing them; timed around the pipeline's commit) and the rest (reading,
tracking and staging in the Spark job, and the wait for the trees' outcomes).
``sink_exact``: both outputs hold the same rows as multisets (``exceptAll``
both ways, with the counts equal), every round.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_parquet_bench"]


def _same_rows(spark: Any, a: str, b: str) -> bool:
    """True if the Parquet folders ``a`` and ``b`` hold the same rows, each as often."""
    left, right = spark.read.parquet(a), spark.read.parquet(b)
    return left.count() == right.count() and left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def run_parquet_bench(config: Any) -> dict[str, Any]:
    """Run the comparison for a :class:`~acker_bench.pipeline_bench.PipelineBenchConfig`; the figures as a dict."""
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import WORD_SCHEMA, split_sentences
    from acker_spark import ArrowBolt, close_clients, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.output import FileOutput
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from acker_service.process_cluster import ProcessCluster

    from .pipeline_bench import _timed, _write_source

    class TimedCommits(SourcePipeline):
        """A SourcePipeline that adds up the driver's time in output commits (the bench's split of the cost)."""

        commit_seconds = 0.0

        def _commit_acked(self) -> None:
            started = time.perf_counter()
            super()._commit_acked()
            self.commit_seconds += time.perf_counter() - started

    work = Path(tempfile.mkdtemp(prefix="acker-bench-parquet-"))
    try:
        _write_source(work / "in", config, config.records)
        _write_source(work / "warm", config, min(config.records, 10_000))
        owned = SparkSession.getActiveSession() is None  # a test's shared session is left running
        spark = local_session(config.master, app_name="acker-bench-parquet", shuffle_partitions=config.partitions)
        source = str(work / "in")

        def lines(directory: str) -> Any:
            return spark.read.text(directory).select(F.xxhash64("value").cast("string").alias("key"), "value")

        def plain(out: Path, directory: str = source) -> None:
            split = ArrowBolt(split_sentences, None, schema=WORD_SCHEMA, name="split")
            untracked = lines(directory).select("*", F.lit(1).alias("attempt"), F.lit(b"").alias("_acker_ids"))
            split.apply_df(untracked).select("key", "position", "word").write.parquet(str(out))

        plain(work / "warm-out", str(work / "warm"))  # forks the Python workers once: no round pays for it
        rows: dict[str, list[float]] = {"plain": [], "tracked": [], "commit": []}
        exact = True
        result: dict[str, Any] = {
            "mode": "pipeline",
            "sink": "parquet",
            "records": config.records,
            "files": config.files,
        }
        with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout) as cluster:
            with ClusterClient(cluster.addresses) as client:
                split = ArrowBolt(split_sentences, cluster.addresses, schema=WORD_SCHEMA, name="split")

                def job(df: Any) -> Any:
                    keyed = df.select(
                        F.xxhash64("value").cast("string").alias("key"),
                        "value",
                        F.col("_attempt").alias("attempt"),
                        "_acker_ids",
                    )
                    return split.apply_df(keyed).select("key", "position", "word", "_acker_ids")

                for round_no in range(config.rounds):
                    plain_out = work / f"plain-{round_no}"
                    wall, _, _ = _timed(lambda out=plain_out: plain(out))
                    rows["plain"].append(wall)

                    tracked_out = work / f"tracked-{round_no}"
                    pipeline = TimedCommits(
                        spark, client, work / f"checkpoint-{round_no}", output=FileOutput(str(tracked_out))
                    )
                    wall, _, stats = _timed(lambda p=pipeline: p.run(spark.read.text(source), job))
                    rows["tracked"].append(wall)
                    rows["commit"].append(pipeline.commit_seconds)
                    result["tracked_acked"], result["tracked_replayed"] = stats.acked, stats.replayed
                    result["output_rows"] = stats.output_rows
                    exact = (
                        exact and stats.acked == config.records and _same_rows(spark, str(plain_out), str(tracked_out))
                    )
        close_clients()
        if owned:
            spark.stop()
        plain_s = min(rows["plain"])
        best = min(range(len(rows["tracked"])), key=rows["tracked"].__getitem__)
        tracked_s, commit_s = rows["tracked"][best], rows["commit"][best]
        result.update(
            {
                "plain_seconds": round(plain_s, 3),
                "tracked_seconds": round(tracked_s, 3),
                "tracked_over_plain": round(tracked_s / plain_s, 3),
                "commit_seconds": round(commit_s, 3),
                "tracked_before_commit_seconds": round(tracked_s - commit_s, 3),
                "tracked_before_commit_over_plain": round((tracked_s - commit_s) / plain_s, 3),
                "plain_rounds_seconds": [round(w, 3) for w in rows["plain"]],
                "tracked_rounds_seconds": [round(w, 3) for w in rows["tracked"]],
                "commit_rounds_seconds": [round(w, 3) for w in rows["commit"]],
                "sink_exact": exact,
            }
        )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
