"""SourcePipeline draining a Redis stream: every message's rows committed once, then acked at the broker.

Real redis-server (AOF), real local Spark, in-process ackers. A driver death
is a BaseException raised at the chosen point (after the commit and before the
ack; in the middle of a batch's job): everything the drain knows is in the
checkpoint and at the broker, so a new pipeline on the same checkpoint is a
restarted driver.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import redis
from acker_client import ClusterClient
from acker_spark import ArrowBolt, ReplayPolicy
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.output import FileOutput
from acker_spark.queues import RedisStreamSource
from pyspark import cloudpickle

from ..queues.brokers import RedisServer

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

FAST = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


class DriverKilled(BaseException):
    """Stands for the driver's death at a chosen point (nothing catches a BaseException on the way out)."""


@pytest.fixture
def ackers(patient_ackers: Any) -> Any:
    """The ackers of this module: a timeout no job here reaches (conftest's ``patient_ackers``)."""
    return patient_ackers


def publish(server: RedisServer, count: int) -> list[str]:
    """``count`` messages: message i is ``"m<i> w<i>_0 ... "`` (i % 3 + 1 words); ``"poison"`` at i == 13."""
    client = redis.Redis.from_url(server.url)
    ids = []
    for i in range(count):
        text = "poison" if i == 13 else " ".join(f"w{i}_{j}" for j in range(i % 3 + 1))
        ids.append(client.xadd("orders", {"data": text}).decode())
    client.close()
    return ids


def expected(server: RedisServer, ids: list[str]) -> Counter[tuple[str, str]]:
    """Each (message id, word) output row once, the poison message's none."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    rows: Counter[tuple[str, str]] = Counter()
    for entry_id, fields in client.xrange("orders"):
        if fields["data"] != "poison":
            rows.update((entry_id, word) for word in fields["data"].split(" "))
    client.close()
    assert len(rows) > len(ids)
    return rows


class Split:
    """Splits each payload into words; fails messages 7, 17, ... on their first delivery, "poison" always."""

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        pieces = pc.split_pattern(batch.column("value"), " ")
        parents = pc.list_parent_indices(pieces)
        collector.emit({"id": pc.take(batch.column("key"), parents), "word": pc.list_flatten(pieces)}, anchors=parents)
        values = batch.column("value").to_pylist()
        first = batch.column("_attempt").to_numpy() == 1
        flaky = np.array([v.split("_")[0].endswith("7") for v in values]) & first
        collector.fail(np.flatnonzero(flaky), "ConnectionError: a flaky store")  # retried
        collector.fail(np.flatnonzero([v == "poison" for v in values]), "ValueError: a bad message")  # dead at once


def split_job(addresses: Any) -> Any:
    bolt = ArrowBolt(Split(), addresses, schema="id string, word string", name="split")
    return lambda df: bolt.apply_df(df)


def output_rows(spark: Any, out: Path) -> Counter[tuple[str, str]]:
    return Counter((r["id"], r["word"]) for r in spark.read.parquet(str(out)).collect())


def group_pending(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.xpending("orders", "nightly")["pending"])
    finally:
        client.close()


def dead_stream(server: RedisServer) -> list[dict[str, str]]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        return [fields for _, fields in client.xrange("orders:dead")]
    finally:
        client.close()


def pipeline_for(spark: Any, client: ClusterClient, tmp_path: Path) -> SourcePipeline:
    return SourcePipeline(
        spark, client, tmp_path / "cp", policy=FAST, output=FileOutput(str(tmp_path / "out")), progress=None
    )


def test_drain_commits_each_message_once_then_acks_it(
    spark: Any, ackers: Any, client: ClusterClient, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two batches: failed messages replayed from the copy, the poison one dead-lettered with its cause."""
    ids = publish(redis_server, 50)
    source = RedisStreamSource(redis_server.url, "orders", "nightly", batch=30)
    stats = pipeline_for(spark, client, tmp_path).run(source, split_job(ackers.addresses))
    assert (stats.queue_batches, stats.acked_at_broker, stats.dead_lettered_at_broker) == (2, 49, 1)
    assert stats.replayed == 5 and stats.dead_lettered == 1
    assert output_rows(spark, tmp_path / "out") == expected(redis_server, ids)
    assert group_pending(redis_server) == 0
    (letter,) = dead_stream(redis_server)
    assert letter["acker_source_id"] == ids[13] and letter["data"] == "poison"
    assert letter["acker_cause"].startswith("FAILED after 1 attempts") and "a bad message" in letter["acker_cause"]


def test_driver_killed_between_commit_and_ack_acks_on_restart_without_output_twice(
    spark: Any, ackers: Any, client: ClusterClient, redis_server: RedisServer, tmp_path: Path, monkeypatch: Any
) -> None:
    """No ack before the commit: at the first ack the batch's rows are already in the output; the restart acks them."""
    ids = publish(redis_server, 40)
    source = RedisStreamSource(redis_server.url, "orders", "nightly", batch=25)
    seen: dict[str, int] = {}

    def dying_ack(message_ids: Any) -> int:
        committed = {row[0] for row in output_rows(spark, tmp_path / "out")}
        seen["acking"], seen["committed"] = len(message_ids), len(committed & set(message_ids))
        raise DriverKilled

    monkeypatch.setattr(source, "ack", dying_ack)
    with pytest.raises(DriverKilled):
        pipeline_for(spark, client, tmp_path).run(source, split_job(ackers.addresses))
    assert seen["acking"] == seen["committed"] == 25 - 1  # every message acked had its rows committed (poison aside)
    assert group_pending(redis_server) == 25 - 1  # held, not acked: the poison one is dead-lettered before the acks
    again = RedisStreamSource(redis_server.url, "orders", "nightly", batch=25)
    stats = pipeline_for(spark, client, tmp_path).run(again, split_job(ackers.addresses))
    assert stats.resumed and stats.acked_at_broker == 40 - 1
    assert output_rows(spark, tmp_path / "out") == expected(redis_server, ids)
    assert group_pending(redis_server) == 0 and len(dead_stream(redis_server)) == 1


def test_driver_killed_in_a_batch_job_finishes_the_batch_from_its_copy(
    spark: Any, ackers: Any, client: ClusterClient, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A driver dying in the second batch's job: the restart resumes that batch (the broker is not read for it)."""
    ids = publish(redis_server, 40)
    job = split_job(ackers.addresses)
    calls = {"n": 0}

    def dying_job(df: Any) -> Any:
        calls["n"] += 1
        out = job(df)
        # Each batch's run first checks the job on an empty frame (calls 1 and 4); batch 1 has two rounds
        # (the first read, the flaky messages' replay: calls 2 and 3); call 5 is batch 2's first read.
        if calls["n"] == 5:
            out.count()  # the trees start and end in flight of a dying driver
            raise DriverKilled
        return out

    source = RedisStreamSource(redis_server.url, "orders", "nightly", batch=20)
    with pytest.raises(DriverKilled):
        pipeline_for(spark, client, tmp_path).run(source, dying_job)
    assert group_pending(redis_server) == 20  # batch 2, held
    again = RedisStreamSource(redis_server.url, "orders", "nightly", batch=20)
    stats = pipeline_for(spark, client, tmp_path).run(again, job)
    assert stats.resumed and stats.queue_batches == 1 and stats.acked_at_broker == 20
    assert output_rows(spark, tmp_path / "out") == expected(redis_server, ids)
    assert group_pending(redis_server) == 0
