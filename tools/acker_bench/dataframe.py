"""acker-bench --mode dataframe: rows/s through a 2-stage ArrowBolt pipeline, tracked against untracked.

Both runs use the same local Spark, the same source, the same micro-batches and
the same job: stage 1 emits ``fan_out`` children per record (anchored to it,
vectorised), the children are shuffled with ``repartition(partitions, "key")``,
and stage 2, a sink, acks them on return. The tracked run goes through
``SourcePipeline`` over the records in memory (copied once into a temporary
checkpoint, then read by Spark), against embedded ackers (every record must end
ACKED); the untracked one runs the same bolts with ``addresses=None`` over
micro-batches of the records (:func:`acker_demo.untracked.run_untracked`).
What the difference measures: copying the records, decoding and encoding
``_acker_ids``, deriving edge ids, the columnar commits, the trees' inits and
their outcomes.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["DataFrameBenchConfig", "run_dataframe_bench"]


@dataclass(frozen=True)
class DataFrameBenchConfig:
    """Records, children per record, micro-batch size, shuffle partitions, embedded ackers and their timeout."""

    records: int = 200_000
    fan_out: int = 4
    batch: int = 20_000
    partitions: int = 4
    ackers: int = 2
    message_timeout: float = 60.0
    master: str = "local[2]"


def fan_out_children(fan_out: int) -> Any:
    """Stage 1: ``fan_out`` children per input row, anchored to it (one numpy expression per batch)."""

    def emit(batch: pa.RecordBatch, collector: Any) -> None:
        anchors = np.repeat(np.arange(batch.num_rows), fan_out)
        keys = batch.column("key").take(pa.array(anchors))
        collector.emit(
            {"key": keys, "child": pa.array(np.tile(np.arange(fan_out, dtype=np.int32), batch.num_rows))}, anchors
        )

    return emit


def sink(batch: pa.RecordBatch, collector: Any) -> None:
    """Stage 2: nothing to write; every row is acked on return."""


def _job(addresses: Sequence[str] | None, config: DataFrameBenchConfig) -> tuple[Any, Any]:
    from acker_spark.steps.arrow_bolt import ArrowBolt

    stage1 = ArrowBolt(fan_out_children(config.fan_out), addresses, schema="key string, child int", name="fan-out")
    stage2 = ArrowBolt(sink, addresses, schema=None, name="sink")

    def job(df: Any) -> None:
        stage2.apply_df(stage1.apply_df(df).repartition(config.partitions, "key")).count()

    return job, (stage1, stage2)


def _source(count: int, tag: str) -> list[tuple[str, str]]:
    return [(f"{tag}-{i}", "x") for i in range(count)]


def run_dataframe_bench(config: DataFrameBenchConfig) -> dict[str, Any]:
    """Run the untracked, then the tracked pipeline over ``config.records`` records; rows/s of both and the ratio."""
    from acker_client import ClusterClient
    from acker_demo.untracked import run_untracked
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.session import local_session
    from acker_spark.steps.executor import close_clients

    from acker_service.process_cluster import ProcessCluster

    spark = local_session(config.master, app_name="acker-bench-dataframe", shuffle_partitions=config.partitions)
    warm, _ = _job(None, config)
    run_untracked(spark, _source(min(config.batch, 1000), "warm"), warm, batch_size=config.batch, as_dataframe=True)

    job, _ = _job(None, config)
    started = time.perf_counter()
    plain = run_untracked(
        spark,
        _source(config.records, "u"),
        job,
        batch_size=config.batch,
        partitions=config.partitions,
        as_dataframe=True,
    )
    untracked_s = time.perf_counter() - started

    with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout) as cluster:
        job, (stage1, stage2) = _job(cluster.addresses, config)
        with ClusterClient(cluster.addresses) as client, tempfile.TemporaryDirectory() as work:
            pipeline = SourcePipeline(spark, client, f"{work}/checkpoint", progress=None)
            started = time.perf_counter()
            stats = pipeline.run(_source(config.records, "t"), job)
            tracked_s = time.perf_counter() - started
    close_clients()
    rows = config.records * (1 + config.fan_out)  # rows through the bolts: records in stage 1, children in stage 2
    return {
        "mode": "dataframe",
        "records": config.records,
        "fan_out": config.fan_out,
        "batch": config.batch,
        "partitions": config.partitions,
        "ackers": config.ackers,
        "untracked_seconds": round(untracked_s, 3),
        "tracked_seconds": round(tracked_s, 3),
        "untracked_rows_per_s": round(rows / untracked_s, 1),
        "tracked_rows_per_s": round(rows / tracked_s, 1),
        "tracked_over_untracked_time": round(tracked_s / untracked_s, 3),
        "records_acked": stats.acked,
        "records_untracked": plain.acked,
        "replayed": stats.replayed,
        "commit_errors": sum(b.commit_errors.value for b in (stage1, stage2) if b.commit_errors is not None),
    }
