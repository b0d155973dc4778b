"""``acker-demo --spark-read``: the word count with records read by Spark on the executors (SourcePipeline).

Generated records are handed to the pipeline as they are (an in-memory
source): it copies them once into its checkpoint as Parquet and reads that copy
on the executors, each record named by its key; ``--source-dir`` reads text
files with ``spark.read.text`` (records identified by file and position).
Each record's tree starts in the task that reads it, failures are replayed by
re-reading the source, and the job ends with Spark's own Parquet writer: the
pipeline commits the word rows of the deliveries that ACKED, exactly once
(``output=FileOutput(...)``), into a folder next to the SQLite file that keeps
the dead letters; the checkpoint lives there too.

``--source redis`` publishes the records to a Redis stream of a
``redis-server`` the demo starts (AOF on, in the work folder, a free port) and
hands the pipeline that stream (:class:`~acker_spark.queues.RedisStreamSource`):
it drains what is on the stream, each message keyed by its entry id, and acks
each message at Redis only after its rows are committed; dead letters also go
to the stream's dead-letter stream with their cause.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from acker_spark.dead_letter import DeadLetterStore
from acker_spark.replay_policy import ReplayPolicy
from acker_spark.sources import Record
from acker_spark.steps.executor import close_clients

from . import wordcount

__all__ = ["run_source_tracked", "expected_without_dead", "output_check"]

STREAM = "demo"
"""The Redis stream ``--source redis`` fills and drains."""


def _source(args: argparse.Namespace, spark: Any, records: list[Record]) -> Any:
    """What the pipeline reads: the text files as a DataFrame, or the generated records themselves."""
    if args.source_dir is not None:
        return spark.read.text(str(args.source_dir))
    return records  # in memory: SourcePipeline copies them into its checkpoint once


def run_source_tracked(
    args: argparse.Namespace, spark: Any, records: list[Record], db: Path, live: Any, chaos_factory: Any
) -> dict[str, Any]:
    """One tracked run through SourcePipeline; the summary fields the demo prints."""
    work = db.parent / f"{db.stem}-source"
    run_id = time.time_ns()  # a fresh run each time the demo runs
    checkpoint, output = work / f"checkpoint-{run_id}", work / f"words-{run_id}.parquet"
    from_redis = getattr(args, "source", "memory") == "redis"
    with contextlib.ExitStack() as stack:
        if from_redis:
            source = stack.enter_context(_redis_stream(records, work / f"redis-{run_id}"))
        else:
            source = _source(args, spark, records)
        summary = _run(args, spark, db, live, chaos_factory, source, checkpoint, output)
    summary["source"] = "redis" if from_redis else "files" if args.source_dir is not None else "memory"
    return summary


@contextlib.contextmanager
def _redis_stream(records: list[Record], folder: Path) -> Iterator[Any]:
    """A redis-server of the demo's own holding ``records`` as stream entries; the source that drains them."""
    import redis
    from acker_bench.brokers import running_redis
    from acker_spark.queues import RedisStreamSource

    with running_redis(folder) as server:
        client = redis.Redis.from_url(server.url)
        pipe = client.pipeline(transaction=False)
        for record in records:
            pipe.xadd(STREAM, {"data": str(record.value)})
        pipe.execute()
        client.close()
        source = RedisStreamSource(server.url, STREAM, "demo")
        try:
            yield source
        finally:
            source.close()


def _run(
    args: argparse.Namespace,
    spark: Any,
    db: Path,
    live: Any,
    chaos_factory: Any,
    source: Any,
    checkpoint: Path,
    output: Path,
) -> dict[str, Any]:
    """The pipeline's run over ``source`` against fresh ackers; the summary fields."""
    from acker_client import ClusterClient
    from acker_spark.executor_read.source_pipeline import SourcePipeline
    from acker_spark.output import FileOutput

    from acker_service.process_cluster import ProcessCluster

    from .dataframe_job import build_output_job

    with ProcessCluster(count=args.shards, message_timeout=args.message_timeout) as cluster:
        injection = wordcount.FailureInjection(
            fail_percent=args.fail_percent,
            crash_partition=0 if args.crash_task else None,
            crash_marker=str(db.with_name(db.name + ".crashed")),  # one crashed task per run (cli.crash_marker)
        )
        job, bolts = build_output_job(cluster.addresses, partitions=args.partitions, injection=injection)
        policy = ReplayPolicy(max_attempts=args.max_attempts, backoff_base=args.backoff, backoff_cap=8.0)
        chaos = chaos_factory(cluster)
        with ClusterClient(cluster.addresses) as client, chaos:
            pipeline = SourcePipeline(
                spark,
                client,
                checkpoint,
                policy=policy,
                dead_letters=DeadLetterStore(db),
                on_progress=live.update if live else None,
                output=FileOutput(str(output)),  # Spark's Parquet writer, exactly once per record
            )
            started = time.perf_counter()
            stats = pipeline.run(source, job)
            seconds = time.perf_counter() - started
    close_clients()
    extra = {k: getattr(stats, k) for k in ("acked_at_broker", "dead_lettered_at_broker") if hasattr(stats, k)}
    return {
        **extra,
        **stats.as_dict(),
        "pipeline_seconds": round(seconds, 3),
        "acker_killed": chaos.killed,
        "acker_restarted": chaos.restarted,
        "commit_errors": sum(b.commit_errors.value for b in bolts if b.commit_errors is not None),
        "checkpoint": str(checkpoint),
        "output": str(output),
    }


def expected_without_dead(records: list[Record], db: Path) -> Counter[str]:
    """Word counts of the input minus the words of the dead-lettered records (their payloads name them)."""
    expected = wordcount.expected_counts(records)
    for letter in DeadLetterStore(db).all():
        expected.subtract(wordcount.tokenize(letter.record["value"]))
    return +expected


def output_check(spark: Any, output: str) -> tuple[Counter[str], int, int]:
    """The Parquet output's word counts, its rows, and rows that repeat a (record, position) (0 when exact)."""
    rows = spark.read.parquet(output)
    counts = Counter({r["word"]: r["count"] for r in rows.groupBy("word").count().collect()})
    total = rows.count()
    return counts, total, total - rows.select("key", "position").distinct().count()
