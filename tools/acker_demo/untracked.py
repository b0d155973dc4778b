"""The untracked baseline: the same job over the same records with no acker, in micro-batches (nothing replayed).

What the tracking overhead is measured against (``acker-demo --no-tracking``,
``--compare-untracked``, ``acker-bench --mode dataframe``). Each batch is one
Spark job over tuples whose value is a ``Delivery`` (``key``, ``value``,
``attempt`` 1) and whose ``_acker_ids`` are empty, so bolts built with
``addresses=None`` run the very functions of the tracked job. A job error
propagates: without tracking nothing could replay the batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from acker_client import MessageId, TrackedTuple
from acker_spark.run_report import RunStats
from acker_spark.session import default_parallelism, spark_context_of
from acker_spark.sources import Delivery, Record
from acker_spark.steps.frames import delivery_frame

__all__ = ["run_untracked"]


def run_untracked(
    spark: Any,
    source: Iterable[Record | tuple[str, Any]],
    job: Callable[[Any], object],
    *,
    batch_size: int = 1_000,
    partitions: int | None = None,
    on_progress: Callable[[RunStats], None] | None = None,
    as_dataframe: bool = False,
) -> RunStats:
    """Run ``job`` over ``source`` in batches of ``batch_size``: an RDD of tuples, or a DataFrame with ``as_dataframe``."""
    sc = spark_context_of(spark)
    if not as_dataframe and sc is None:
        raise TypeError("Spark Connect has no RDDs: run_untracked(..., as_dataframe=True) with DataFrame bolts")
    slices = partitions or default_parallelism(spark)
    stats = RunStats()
    records = iter(source)
    while True:
        batch = [
            TrackedTuple(Delivery(str(k), v, 1), MessageId.EMPTY) for k, v in itertools.islice(records, batch_size)
        ]
        if not batch:
            return stats
        if as_dataframe:
            job(delivery_frame(spark, batch, slices))
        else:
            job(sc.parallelize(batch, min(slices, len(batch))))
        stats.emitted += len(batch)
        stats.attempts += len(batch)
        stats.acked += len(batch)
        stats.jobs += 1
        if on_progress is not None:
            on_progress(stats)
