"""The driver process of ``acker-bench --mode queue``: drains the broker with SourcePipeline into Parquet, then exits.

Run as ``python -m acker_bench.queue_driver CONFIG_JSON``; the bench kills it
with ``kill -9`` (its whole process group) and starts it again on the same
checkpoint. Its last stdout line is a JSON object: the drain's figures and the
seconds ``SourcePipeline.run`` took. With ``broker="files"`` it runs the same
job over the same records read from Parquet files instead (``url`` is their
folder, keyed by the ``key`` column): the bench's files comparison.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

POISON = "poison"
"""A payload starting with this word raises in the job: dead-lettered with its cause."""


@dataclass(frozen=True)
class QueueDriverConfig:
    """What the driver drains, where it writes, which ackers it uses."""

    broker: str  # "redis", "rabbitmq", or "files" (the same records from Parquet, for the comparison)
    url: str  # the broker's URL, or the Parquet folder
    queue: str
    batch: int
    checkpoint: str
    output: str
    addresses: list[str]
    master: str = "local[2]"
    max_attempts: int = 4  # deliveries per message before it is dead-lettered (the poison ones use them all)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def split_words(batch: pa.RecordBatch, collector: Any) -> None:
    """The job's one step: a row per word of the payload, anchored to its message; poison payloads fail.

    A failed message's rows are staged but never committed: only the deliveries that ACKED are.
    """
    pieces = pc.split_pattern(batch.column("value"), " ")
    parents = pc.list_parent_indices(pieces)
    collector.emit({"id": pc.take(batch.column("key"), parents), "word": pc.list_flatten(pieces)}, anchors=parents)
    poisoned = pc.starts_with(batch.column("value"), POISON).to_numpy(zero_copy_only=False)
    if poisoned.any():
        collector.fail(np.flatnonzero(poisoned), "ValueError: a poison message")


def source_of(config: QueueDriverConfig) -> Any:
    """The queue source the config names."""
    if config.broker == "redis":
        from acker_spark.queues import RedisStreamSource

        return RedisStreamSource(config.url, config.queue, "bench", batch=config.batch, claim_idle=3600)
    from acker_spark.queues import RabbitMQSource

    return RabbitMQSource(config.url, config.queue, batch=config.batch, queue_type="classic")


def main(argv: list[str] | None = None) -> int:
    """Drain once; print the figures as JSON."""
    config = QueueDriverConfig(**json.loads((argv or sys.argv[1:])[0]))
    from acker_client import ClusterClient
    from acker_spark import ArrowBolt, FileOutput, ReplayPolicy, SourcePipeline, local_session

    spark = local_session(config.master, app_name="acker-bench-queue")
    bolt = ArrowBolt(split_words, config.addresses, schema="id string, word string", name="split")
    # Timed from the source's making: reading the files' schema is the files run's first Spark job, as the
    # drain's first one is inside its run.
    started = time.perf_counter()
    source = spark.read.parquet(config.url) if config.broker == "files" else source_of(config)
    key = "key" if config.broker == "files" else None
    with ClusterClient(config.addresses) as client:
        pipeline = SourcePipeline(
            spark,
            client,
            config.checkpoint,
            policy=ReplayPolicy(max_attempts=config.max_attempts, backoff_base=0.1, backoff_cap=1.0),
            output=FileOutput(config.output),
            progress=None,
            budget=None,
        )
        stats = pipeline.run(source, lambda df: bolt.apply_df(df), key=key)
        seconds = time.perf_counter() - started
    figures = {k: v for k, v in stats.as_dict().items() if isinstance(v, (int, float, bool))}
    figures.update(seconds=seconds)
    if config.broker != "files":
        source.close()
        figures.update(acked_at_broker=stats.acked_at_broker, queue_batches=stats.queue_batches)
    print(json.dumps(figures), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
