"""acker-bench --mode pipeline --raise-fraction F: the tracked job with a fraction of records raising, against none.

The job is the Parquet one of :mod:`acker_bench.pipeline_parquet` (``split_sentences``
over N lines, a :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline`
with ``output=FileOutput(...)``). In the raising variant the function raises
``ValueError`` for every batch holding a selected line (``pmod(xxhash64(line),
1,000,000) < F * 1,000,000``, after doing its work, as a function failing late
would), so the bolt isolates those lines and the pipeline dead-letters them.
Rounds alternate (none, raising, ...), each with a fresh bolt (a cold start, as
a new job), and the best of each is reported:

- ``raising_over_none``: the time ratio;
- ``rows_handed_none`` / ``rows_handed_raising``: rows handed to the function
  (a Spark accumulator) in the best rounds, and ``rows_handed_over_records`` for the raising one;
- ``raising_exact``: every round of the raising variant dead-lettered exactly
  the selected lines, acked every other one on its first delivery, and wrote the
  none variant's rows less those of the selected lines.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["RaisingSplit", "run_raising_bench"]

_SCALE = 1_000_000  # the selection's resolution: fractions down to one in a million


class RaisingSplit:
    """The demo's split function, counting rows handed; raises ValueError for a batch holding a selected line."""

    def __init__(self, fraction: float, handed: Any) -> None:
        self.threshold = int(round(fraction * _SCALE))
        self.handed = handed

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        from acker_demo.dataframe_job import split_sentences

        self.handed.add(batch.num_rows)
        split_sentences(batch, collector)
        if self.threshold:
            keys = batch.column("key").cast(pa.int64()).to_numpy()
            selected = np.flatnonzero(np.mod(keys, _SCALE) < self.threshold)
            if len(selected):
                raise ValueError(f"line {keys[selected[0]]} is one of the bench's raising records")


def run_raising_bench(config: Any) -> dict[str, Any]:
    """Run the comparison for a :class:`~acker_bench.pipeline_bench.PipelineBenchConfig`; the figures as a dict."""
    from acker_client import ClusterClient
    from acker_demo.dataframe_job import WORD_SCHEMA
    from acker_spark import ArrowBolt, close_clients, local_session
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.output import FileOutput
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from acker_service.process_cluster import ProcessCluster

    from .pipeline_bench import _timed, _write_source

    work = Path(tempfile.mkdtemp(prefix="acker-bench-raising-"))
    try:
        _write_source(work / "in", config, config.records)
        owned = SparkSession.getActiveSession() is None  # a test's shared session is left running
        spark = local_session(config.master, app_name="acker-bench-raising", shuffle_partitions=config.partitions)
        source = str(work / "in")
        threshold = int(round(config.raise_fraction * _SCALE))

        def selected(key: Any) -> Any:
            return F.pmod(key.cast("long"), F.lit(_SCALE)) < threshold

        keyed = spark.read.text(source).select(F.xxhash64("value").cast("string").alias("key"))
        raising_lines = keyed.filter(selected(F.col("key"))).count()
        rows: dict[str, list[tuple[float, int]]] = {"none": [], "raising": []}
        exact = True
        result: dict[str, Any] = {
            "mode": "pipeline",
            "sink": "parquet",
            "records": config.records,
            "raise_fraction": config.raise_fraction,
            "raising_records": raising_lines,
        }
        with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout) as cluster:
            with ClusterClient(cluster.addresses) as client:

                def tracked(name: str, fraction: float) -> tuple[float, int, Any, Path]:
                    handed = spark.sparkContext.accumulator(0)
                    split = ArrowBolt(
                        RaisingSplit(fraction, handed), cluster.addresses, schema=WORD_SCHEMA, name="split"
                    )

                    def job(df: Any) -> Any:
                        keyed = df.select(
                            F.xxhash64("value").cast("string").alias("key"),
                            "value",
                            F.col("_attempt").alias("attempt"),
                            "_acker_ids",
                        )
                        return split.apply_df(keyed).select("key", "position", "word", "_acker_ids")

                    out = work / name
                    pipeline = SourcePipeline(spark, client, work / f"checkpoint-{name}", output=FileOutput(str(out)))
                    wall, _, stats = _timed(lambda: pipeline.run(spark.read.text(source), job))
                    return wall, int(handed.value), stats, out

                tracked("warm", 0.0)  # forks the Python workers once: no round pays for it
                for round_no in range(config.rounds):
                    wall, handed, stats, none_out = tracked(f"none-{round_no}", 0.0)
                    rows["none"].append((wall, handed))
                    exact = exact and stats.acked == config.records and stats.dead_lettered == 0
                    wall, handed, stats, raising_out = tracked(f"raising-{round_no}", config.raise_fraction)
                    rows["raising"].append((wall, handed))
                    result["raising_dead_lettered"], result["raising_replayed"] = stats.dead_lettered, stats.replayed
                    expected = spark.read.parquet(str(none_out)).filter(~selected(F.col("key")))
                    written = spark.read.parquet(str(raising_out))
                    exact = (
                        exact
                        and (stats.acked, stats.dead_lettered, stats.replayed)
                        == (config.records - raising_lines, raising_lines, 0)
                        and written.count() == expected.count()
                        and written.exceptAll(expected).isEmpty()
                    )
        close_clients()
        if owned:
            spark.stop()
        none_s, none_handed = min(rows["none"])
        raising_s, raising_handed = min(rows["raising"])
        result.update(
            {
                "none_seconds": round(none_s, 3),
                "raising_seconds": round(raising_s, 3),
                "raising_over_none": round(raising_s / none_s, 3),
                "rows_handed_none": none_handed,
                "rows_handed_raising": raising_handed,
                "rows_handed_over_records": round(raising_handed / config.records, 3),
                "none_rounds_seconds": [round(w, 3) for w, _ in rows["none"]],
                "raising_rounds_seconds": [round(w, 3) for w, _ in rows["raising"]],
                "raising_exact": exact,
                "sink_exact": exact,
            }
        )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
