"""The compose file's queue brokers (profile `queues`): a Redis drain through the compose ackers, a RabbitMQ restart.

Real containers: the acker image and one image of Debian's redis-server and
rabbitmq-server (deploy/images/brokers), started with ``--profile queues`` in the
suite's compose project; the driver and the executors (local Spark) run on this
host and reach everything through the published ports.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
import redis
from acker_client import ClusterClient
from acker_spark import ArrowBolt, ReplayPolicy
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.output import FileOutput
from acker_spark.queues import RabbitMQSource, RedisStreamSource
from pyspark import cloudpickle

from .conftest import ComposeCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture(scope="module")
def brokers(compose_cluster: ComposeCluster) -> ComposeCluster:
    """The suite's compose project with its Redis and RabbitMQ services up and healthy."""
    compose_cluster.up_brokers()
    return compose_cluster


def _split(batch: Any, collector: Any) -> None:
    import pyarrow.compute as pc

    pieces = pc.split_pattern(batch.column("value"), " ")
    parents = pc.list_parent_indices(pieces)
    collector.emit({"id": pc.take(batch.column("key"), parents), "word": pc.list_flatten(pieces)}, anchors=parents)


def test_a_redis_stream_of_the_compose_broker_is_drained_through_the_compose_ackers(
    brokers: ComposeCluster, spark: Any, tmp_path: Path
) -> None:
    """40 messages on the compose Redis: each message's words once in the output, every message acked there."""
    url = brokers.broker_url("redis")
    publisher = redis.Redis.from_url(url, decode_responses=True)
    stream = f"orders-{tmp_path.name}"
    ids = [publisher.xadd(stream, {"data": f"w{i}_a w{i}_b"}) for i in range(40)]
    source = RedisStreamSource(url, stream, "nightly", batch=25)
    bolt = ArrowBolt(_split, brokers.addresses, schema="id string, word string", name="split")
    with ClusterClient(brokers.addresses) as client:
        pipeline = SourcePipeline(
            spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(tmp_path / "out")), progress=None
        )
        stats = pipeline.run(source, lambda df: bolt.apply_df(df))
    assert (stats.queue_batches, stats.acked_at_broker) == (2, 40)
    rows = Counter((r["id"], r["word"]) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert rows == Counter({(entry, f"w{i}_{part}"): 1 for i, entry in enumerate(ids) for part in "ab"})
    assert int(publisher.xpending(stream, "nightly")["pending"]) == 0
    publisher.close()


def test_the_compose_rabbitmq_keeps_its_queue_through_a_restart_and_the_source_rides_it_out(
    brokers: ComposeCluster,
) -> None:
    """Durable queue, persistent messages: after `docker-compose restart rabbitmq` every held message comes back."""
    url = brokers.broker_url("rabbitmq")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()  # on disk before the restart: an unconfirmed persistent message may not be
    source = RabbitMQSource(url, "compose-orders", batch=100, wait=0.3)
    for i in range(20):
        channel.basic_publish(
            "", "compose-orders", f"m{i}".encode(), pika.BasicProperties(message_id=f"id{i}", delivery_mode=2)
        )
    connection.close()
    assert len(source.read(100)) == 20
    brokers.restart_service("rabbitmq")
    assert source.ack([f"id{i}" for i in range(20)]) == 0  # the tags died with the channel
    again = source.read(100)
    assert sorted(m.id for m in again) == sorted(f"id{i}" for i in range(20))
    assert source.ack([m.id for m in again]) == 20
    assert source.read(100) == []
    source.close()
