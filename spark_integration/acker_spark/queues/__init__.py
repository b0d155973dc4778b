"""Queue sources with per-message acks: SourcePipeline drains a broker's queue, acking each message after its commit.

::

    source = RedisStreamSource("redis://localhost:6379/0", "orders", "nightly")
    pipeline = SourcePipeline(spark, ClusterClient(addresses), "checkpoint/", output=FileOutput("out/"))
    stats = pipeline.run(source, job)   # job(df) gets ``key`` (the broker id) and ``value`` (the payload)

The contract a broker implements is :class:`QueueSource`
(:mod:`acker_spark.queues.contract`); the batch loop is
:mod:`acker_spark.queues.drain`. The broker clients (``redis``, ``pika``:
the ``[queues]`` extra) are imported only by the source that uses them.
"""

from typing import Any

from .contract import Message, QueueSource, is_queue_source
from .drain import QueueRunStats, drain_queue

__all__ = [
    "Message",
    "QueueRunStats",
    "QueueSource",
    "RabbitMQSource",
    "RedisStreamSource",
    "drain_queue",
    "is_queue_source",
]


def __getattr__(name: str) -> Any:
    """The broker sources, imported on first use (each module imports its client only when a source is made)."""
    if name == "RedisStreamSource":
        from .redis_streams import RedisStreamSource

        return RedisStreamSource
    if name == "RabbitMQSource":
        from .rabbitmq import RabbitMQSource

        return RabbitMQSource
    raise AttributeError(name)
