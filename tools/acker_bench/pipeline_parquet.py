"""acker-bench --mode pipeline --sink parquet: plain ``df.write.parquet`` against exactly-once ``FileOutput``.

Both jobs read the same N lines with ``spark.read.text`` and split them into
word rows ``(key, position, word)`` with the demo's ``split_sentences``
function (``key``: the line's ``xxhash64``, the same whoever computes it).
Spark computes the key on the source frame, where the scan computes it, in
every job alike: a column Spark computes between the pipeline's reading step
and the bolt would split them into two Python passes (the plain job has one),
so the tracked job's reading step, bolt and stager run in one ``mapInArrow``,
as the plain job's bolt does (``plain_python_steps``/``tracked_python_steps``:
the Python steps in each job's plan, the stager's step included):

- plain: the function untracked, ``df.write.parquet(out)``;
- tracked: a :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline` with
  ``output=FileOutput(out)``: the tasks write the word rows once, as Parquet
  files in a hidden folder of ``out`` (in the same Python pass as reading and
  splitting where no shuffle separates them), and ack them; the driver's
  commit publishes the files of the ACKED trees by rename;
- Spark's own exactly-once file sink: the same job as a Structured Streaming
  query over the same text files (``availableNow``), written by the file sink
  and its ``_spark_metadata`` log.

``driver_cpu_us_per_record``: this process's CPU time over the tracked run per
record; ``output_files``/``output_bytes``: the tracked output's data files.

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


def _files(folder: Path) -> tuple[int, int]:
    """Visible data files under ``folder`` (hidden and ``_``-prefixed names left out, as Spark reads) and their bytes."""
    found = [
        p
        for p in folder.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in p.relative_to(folder).parts)
    ]
    return len(found), sum(p.stat().st_size for p in found)


def run_parquet_bench(config: Any) -> dict[str, Any]:
    """Run the comparison for a :class:`~acker_bench.pipeline_bench.PipelineBenchConfig`; the figures as a dict."""
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import WORD_SCHEMA, split_sentences
    from acker_spark import ArrowBolt, close_clients, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.output import FileOutput
    from acker_spark.steps.fusion import ArrowChain, map_in_arrow, python_steps
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from acker_service.process_cluster import ProcessCluster

    from .pipeline_bench import _timed, _write_source

    class TimedCommits(SourcePipeline):
        """A SourcePipeline that adds up the driver's time in output commits (the bench's split of the cost)."""

        commit_seconds = 0.0
        python_steps = 0  # of the last round's output frame with the stager's step

        def _stage(self, result: Any, round_no: int) -> None:
            # The stager's step is appended to the job's frame as the pipeline appends it; an empty
            # chain in its place runs nothing (the frame is only planned, never run).
            self.python_steps = python_steps(map_in_arrow(result, ArrowChain(()), result.schema))
            super()._stage(result, round_no)

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
            """The source frame of every job: the lines, keyed by Spark as it scans them."""
            return spark.read.text(directory).select(F.xxhash64("value").cast("string").alias("key"), "value")

        def plain_frame(directory: str) -> Any:
            split = ArrowBolt(split_sentences, None, schema=WORD_SCHEMA, name="split")
            untracked = lines(directory).select("*", F.lit(1).alias("attempt"), F.lit(b"").alias("_acker_ids"))
            return split.apply_df(untracked).select("key", "position", "word")

        def plain(out: Path, directory: str = source) -> None:
            plain_frame(directory).write.parquet(str(out))

        def spark_exactly_once(out: Path, checkpoint: Path) -> None:
            """The same job through Spark's own exactly-once file sink: a file-source query, availableNow."""
            split = ArrowBolt(split_sentences, None, schema=WORD_SCHEMA, name="split")
            stream = spark.readStream.format("text").load(source)
            keyed = stream.select(
                F.xxhash64("value").cast("string").alias("key"),
                "value",
                F.lit(1).alias("attempt"),
                F.lit(b"").alias("_acker_ids"),
            )  # computed with the scan, as in the other jobs
            query = (
                split.apply_df(keyed)
                .select("key", "position", "word")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        plain(work / "warm-out", str(work / "warm"))  # forks the Python workers once: no round pays for it
        rows: dict[str, list[float]] = {"plain": [], "tracked": [], "commit": [], "spark_exactly_once": []}
        driver_cpu: list[float] = []
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
                    # Plain columns only (a rename is no computation): the bolt joins the reading step's pass.
                    keyed = df.select("key", "value", F.col("_attempt").alias("attempt"), "_acker_ids")
                    return split.apply_df(keyed).select("key", "position", "word", "_acker_ids")

                result["plain_python_steps"] = python_steps(plain_frame(source))

                for round_no in range(config.rounds):
                    plain_out = work / f"plain-{round_no}"
                    wall, _, _ = _timed(lambda out=plain_out: plain(out))
                    rows["plain"].append(wall)

                    tracked_out = work / f"tracked-{round_no}"
                    pipeline = TimedCommits(
                        spark, client, work / f"checkpoint-{round_no}", output=FileOutput(str(tracked_out))
                    )
                    wall, cpu, stats = _timed(lambda p=pipeline: p.run(lines(source), job))
                    result["tracked_python_steps"] = pipeline.python_steps
                    rows["tracked"].append(wall)
                    driver_cpu.append(cpu)
                    rows["commit"].append(pipeline.commit_seconds)
                    result["tracked_acked"], result["tracked_replayed"] = stats.acked, stats.replayed
                    result["output_rows"] = stats.output_rows
                    exact = (
                        exact and stats.acked == config.records and _same_rows(spark, str(plain_out), str(tracked_out))
                    )
                    result["output_files"], result["output_bytes"] = _files(tracked_out)
                    result["plain_output_files"], result["plain_output_bytes"] = _files(plain_out)

                    streamed_out = work / f"streamed-{round_no}"
                    wall, _, _ = _timed(
                        lambda o=streamed_out, c=work / f"stream-cp-{round_no}": spark_exactly_once(o, c)
                    )
                    rows["spark_exactly_once"].append(wall)
                    exact = exact and _same_rows(spark, str(plain_out), str(streamed_out))
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
                "spark_exactly_once_seconds": round(min(rows["spark_exactly_once"]), 3),
                "tracked_over_spark_exactly_once": round(tracked_s / min(rows["spark_exactly_once"]), 3),
                "spark_exactly_once_over_plain": round(min(rows["spark_exactly_once"]) / plain_s, 3),
                "driver_cpu_us_per_record": round(driver_cpu[best] / config.records * 1e6, 3),
                "sink_exact": exact,
            }
        )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
