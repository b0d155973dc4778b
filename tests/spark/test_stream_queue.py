"""The acker_queue streaming source over a real Redis stream: rows committed once, acks only after the commit.

Real redis-server (AOF), real local Spark, in-process ackers. Each
``foreachBatch`` call first checks the broker against the output: every
message the group no longer holds (acked or dead-lettered) has its rows
committed already, or is the dead one. A query stopped after its first
micro-batch and started again on the same checkpoints is a restarted query.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
from acker_spark import ArrowBolt, close_clients
from acker_spark.output import FileOutput, StreamOutput
from acker_spark.queues.contract import Message
from acker_spark.queues.queue_planner import spool_line, spool_record
from acker_spark.streaming import QUEUE_FORMAT, QueueOptions, register_acker_queue
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

from ..queues.brokers import RabbitServer, RedisServer, running_rabbitmq
from .test_source_queue import dead_stream

pytest.importorskip("pyarrow")
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

DEADLINE = 180.0  # a hang guard for a query, not a speed check


class Split:
    """Splits each payload into words; fails messages ending in 7 on their first delivery, "poison" always."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        pieces = pc.split_pattern(batch.column("value"), " ")
        parents = pc.list_parent_indices(pieces)
        collector.emit({"id": pc.take(batch.column("key"), parents), "word": pc.list_flatten(pieces)}, anchors=parents)
        values = batch.column("value").to_pylist()
        first = batch.column("attempt").to_numpy() == 1
        flaky = np.array([v.split("_")[0].endswith("7") for v in values]) & first
        collector.fail(np.flatnonzero(flaky), "ConnectionError: a flaky store")  # retried
        collector.fail(np.flatnonzero([v == "poison" for v in values]), "ValueError: a bad message")  # dead at once


class Stop(RuntimeError):
    """Stops the first query after its first micro-batch's output was written."""


@pytest.fixture
def ackers(patient_ackers: Any) -> Any:
    """The ackers of this module: a timeout no job here reaches (conftest's ``patient_ackers``)."""
    return patient_ackers


def payload(i: int) -> str:
    """Message i: ``w<i>_0 ...`` (i % 3 + 1 words), ``"poison"`` at i == 13 (as test_source_queue's drain)."""
    return "poison" if i == 13 else " ".join(f"w{i}_{j}" for j in range(i % 3 + 1))


def publish(server: RedisServer, count: int) -> dict[str, str]:
    """``count`` messages added to the stream: payload by entry id."""
    client = redis.Redis.from_url(server.url)
    sent = {client.xadd("orders", {"data": payload(i)}).decode(): payload(i) for i in range(count)}
    client.close()
    return sent


def committed_rows(out: Path) -> Counter[tuple[str, str]]:
    """The (id, word) rows committed to the Parquet output so far (staging folders are hidden: not read)."""
    hidden = (".", "_")
    files = [p for p in out.rglob("*.parquet") if not any(part.startswith(hidden) for part in p.relative_to(out).parts)]
    rows: Counter[tuple[str, str]] = Counter()
    for path in files:
        table = pq.read_table(path)
        rows.update(zip(table.column("id").to_pylist(), table.column("word").to_pylist()))
    return rows


def settled_at_broker(server: RedisServer) -> set[str]:
    """Ids the group has delivered and no longer holds: acked, or dead-lettered (acked with their move)."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        groups = {g["name"]: g for g in client.xinfo_groups("orders")}
        if "words" not in groups:
            return set()
        last = groups["words"]["last-delivered-id"]
        delivered = {entry_id for entry_id, _ in client.xrange("orders", "-", last)} if last != "0-0" else set()
        pending = {p["message_id"] for p in client.xpending_range("orders", "words", "-", "+", 10_000)}
        return delivered - pending
    finally:
        client.close()


def spooled(checkpoint: Path) -> list[str]:
    """The broker ids in the query's spool, in order (each message once: redeliveries are not spooled again)."""
    paths = sorted((checkpoint / "queue" / "spool").glob("*.jsonl"))
    lines = [line for path in paths for line in path.read_text().splitlines()]
    return [spool_record(line)[0] for line in lines]


def expected(sent: dict[str, str]) -> Counter[tuple[str, str]]:
    """Each (message id, word) row once; the poison message's none."""
    return Counter((mid, word) for mid, text in sent.items() if text != "poison" for word in text.split(" "))


def run_available_now(spark: Any, options: dict[str, str], tmp_path: Path, addresses: Any, job: Any) -> Any:
    """An availableNow acker_queue query (the broker's ``options`` plus the common ones) with ``job``; returns it ended."""
    reader = spark.readStream.format(QUEUE_FORMAT)
    common = {
        "ackers": ",".join(addresses),
        "checkpoint": str(tmp_path / "acker-checkpoint"),
        "max_attempts": "3",
        "backoff_base": "0.1",
        "failure_budget": "off",
    }
    for name, value in {**common, **options}.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(job)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
        .start()
    )
    try:
        query.awaitTermination(DEADLINE)
    finally:
        query.stop()
    return query


def run_query(spark: Any, server: RedisServer, tmp_path: Path, addresses: Any, job: Any) -> Any:
    """The Redis stream's query: several spool files (12 messages a read), several micro-batches (900 bytes)."""
    options = {
        "redis": server.url,
        "stream": "orders",
        "group": "words",
        "max_read": "12",
        "max_bytes_per_batch": "900",
    }
    return run_available_now(spark, options, tmp_path, addresses, job)


def test_options_name_the_broker() -> None:
    """The broker is one of redis/amqp; its stream or queue, and a Redis group, are required; the spool is the path."""
    base = {"ackers": "a:1", "checkpoint": "/tmp/cp"}
    with pytest.raises(ValueError, match='"redis"'):
        QueueOptions.parse(base)
    with pytest.raises(ValueError, match='"stream"'):
        QueueOptions.parse({**base, "redis": "redis://x"})
    with pytest.raises(ValueError, match='"group"'):
        QueueOptions.parse({**base, "redis": "redis://x", "stream": "s"})
    with pytest.raises(ValueError, match='"queue"'):
        QueueOptions.parse({**base, "amqp": "amqp://x"})
    with pytest.raises(ValueError, match="max_held"):
        QueueOptions.parse({**base, "amqp": "amqp://x", "queue": "q", "max_held": "0"})
    queue, stream = QueueOptions.parse({**base, "AMQP": "amqp://x", "queue": "q", "max_held": "50"})
    assert (queue.broker, queue.name, queue.max_held, queue.max_read) == ("amqp", "q", 50, 50)
    assert stream.path == "/tmp/cp/queue/spool" and stream.database == "/tmp/cp/queue/dead_letters.sqlite"


def test_spool_lines_keep_a_payload_whole() -> None:
    """A payload's newlines and quotes stay inside its one JSON line."""
    line = spool_line(Message("1-0", 'a\nb "c"\r\n'))
    assert line.count(b"\n") == 1 and spool_record(line.decode()) == ("1-0", 'a\nb "c"\r\n')
    with pytest.raises(TypeError, match="text payloads"):
        spool_line(Message("1-0", b"raw"))


def test_queue_stream_commits_each_message_once_and_acks_only_after_the_commit(
    spark: Any, ackers: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Replays from the spool, the poison message dead-lettered with its cause, a restart after the first
    micro-batch: each message's rows are in the output once, and no message leaves the group before them."""
    sent = publish(redis_server, 40)
    register_acker_queue(spark)
    out = tmp_path / "out"
    bolt = ArrowBolt(Split(), ackers.addresses, schema="id string, word string", name="split")
    output = StreamOutput(FileOutput(str(out)), tmp_path / "acker-checkpoint", ackers.addresses)
    batches: list[int] = []
    checks = {"settled": 0}

    def check_broker() -> None:
        # Runs in the query's driver, between planning calls: what the group let go of is committed.
        settled, rows = settled_at_broker(redis_server), committed_rows(out)
        have = {mid for mid, _ in rows}
        for mid in settled:
            assert mid in have or sent[mid] == "poison", f"message {mid} acked before its rows were committed"
        checks["settled"] = max(checks["settled"], len(settled))

    def stopping(df: Any, batch_id: int) -> None:
        check_broker()
        output.write(bolt.apply_df(df), batch_id)
        batches.append(batch_id)
        raise Stop("stopped after the first micro-batch's output")

    with pytest.raises(StreamingQueryException, match="stopped after the first"):
        run_query(spark, redis_server, tmp_path, ackers.addresses, stopping)
    assert batches == [0]

    def job(df: Any, batch_id: int) -> None:
        check_broker()
        output.write(bolt.apply_df(df), batch_id)
        check_broker()
        batches.append(batch_id)

    second = run_query(spark, redis_server, tmp_path, ackers.addresses, job)
    assert second.exception() is None
    close_clients()
    check_broker()
    assert batches[:2] == [0, 0]  # the stopped micro-batch ran again with its batch id
    assert committed_rows(out) == expected(sent)
    assert settled_at_broker(redis_server) == set(sent)  # every message acked or dead-lettered, none held
    assert sorted(spooled(tmp_path / "acker-checkpoint")) == sorted(sent)
    assert 0 < checks["settled"] <= len(sent)
    (letter,) = dead_stream(redis_server)
    poison = next(mid for mid, text in sent.items() if text == "poison")
    assert letter["acker_source_id"] == poison and letter["data"] == "poison"
    assert letter["acker_cause"].startswith("FAILED after 1 attempts") and "a bad message" in letter["acker_cause"]
    ledger = tmp_path / "acker-checkpoint" / "queue" / "settled"
    settled = [json.loads(p.read_text()) for p in sorted(ledger.glob("batch-*.json"))]
    assert sorted(mid for entry in settled for mid in entry["acked"]) == sorted(set(sent) - {poison})


@pytest.fixture
def rabbitmq_server(tmp_path: Path) -> Iterator[RabbitServer]:
    """A rabbitmq-server node of this test's own (it takes seconds to start)."""
    with running_rabbitmq(tmp_path / "rabbitmq") as server:
        yield server


def test_queue_stream_over_rabbitmq_acks_on_the_planners_channel(
    spark: Any, ackers: Any, rabbitmq_server: RabbitServer, tmp_path: Path
) -> None:
    """The planner holds the delivery tags on its channel until the commit: at the end the queue is empty (nothing
    requeued when the channel closed), each message's rows are committed once, the poison one is dead-lettered."""
    import pika
    from acker_spark.queues import RabbitMQSource
    from acker_spark.queues.rabbitmq import CAUSE_HEADER

    RabbitMQSource(rabbitmq_server.url, "orders").close()  # declares the queue and its dead-letter exchange
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_server.url))
    channel = connection.channel()
    sent = {}
    for i in range(30):
        sent[f"id{i}"] = payload(i)
        properties = pika.BasicProperties(message_id=f"id{i}", delivery_mode=2)
        channel.basic_publish("", "orders", payload(i).encode(), properties)
    register_acker_queue(spark)
    out = tmp_path / "out"
    bolt = ArrowBolt(Split(), ackers.addresses, schema="id string, word string", name="split")
    output = StreamOutput(FileOutput(str(out)), tmp_path / "acker-checkpoint", ackers.addresses)
    batches: list[int] = []

    def run(job: Any) -> Any:
        options = {
            "amqp": rabbitmq_server.url,
            "queue": "orders",
            "max_held": "20",  # the prefetch
            "max_read": "5",  # after the restart, reads that bring only held messages' redeliveries
            "max_bytes_per_batch": "300",  # several micro-batches
        }
        return run_available_now(spark, options, tmp_path, ackers.addresses, job)

    def stopping(df: Any, batch_id: int) -> None:
        output.write(bolt.apply_df(df), batch_id)
        batches.append(batch_id)
        raise Stop("stopped after the first micro-batch's output")

    # The first query stops holding deliveries on its channel: the broker requeues them, and the second
    # query's planner holds their redeliveries (spooled already: not spooled again) on its own channel.
    with pytest.raises(StreamingQueryException, match="stopped after the first"):
        run(stopping)

    def job(df: Any, batch_id: int) -> None:
        output.write(bolt.apply_df(df), batch_id)
        batches.append(batch_id)

    query = run(job)
    close_clients()
    assert query.exception() is None
    assert batches[:2] == [0, 0]
    assert sorted(spooled(tmp_path / "acker-checkpoint")) == sorted(sent)
    assert committed_rows(out) == expected(sent)
    # The query stopped: its channel is closed, so anything it had not acked is back on the queue.
    assert channel.queue_declare("orders", passive=True).method.message_count == 0
    method, properties, body = channel.basic_get("orders.dead", auto_ack=True)
    assert method is not None and properties.message_id == "id13" and body == b"poison"
    assert "a bad message" in properties.headers[CAUSE_HEADER]
    assert channel.basic_get("orders.dead", auto_ack=True)[0] is None
    connection.close()


def test_a_running_query_takes_messages_published_later(
    spark: Any, ackers: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A processing-time query: messages published while it runs are read, committed once and acked."""
    import time

    register_acker_queue(spark)
    out = tmp_path / "out"
    bolt = ArrowBolt(Split(), ackers.addresses, schema="id string, word string", name="split")
    output = StreamOutput(FileOutput(str(out)), tmp_path / "acker-checkpoint", ackers.addresses)
    query = (
        spark.readStream.format(QUEUE_FORMAT)
        .option("redis", redis_server.url)
        .option("stream", "orders")
        .option("group", "words")
        .option("ackers", ",".join(ackers.addresses))
        .option("checkpoint", str(tmp_path / "acker-checkpoint"))
        .option("backoff_base", "0.1")
        .option("failure_budget", "off")
        .load()
        .writeStream.foreachBatch(lambda df, batch_id: output.write(bolt.apply_df(df), batch_id))
        .trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
        .start()
    )
    sent: dict[str, str] = {}
    try:
        for _ in range(2):  # two waves, the second while the first is being settled
            sent.update(publish(redis_server, 8))
            time.sleep(2)
        deadline = time.monotonic() + DEADLINE
        while settled_at_broker(redis_server) != set(sent) or committed_rows(out) != expected(sent):
            assert query.exception() is None and time.monotonic() < deadline, "the messages were not all settled"
            time.sleep(0.5)
    finally:
        query.stop()
        close_clients()
    assert committed_rows(out) == expected(sent)
    assert sorted(spooled(tmp_path / "acker-checkpoint")) == sorted(sent)
