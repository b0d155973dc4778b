"""The Redis Streams queue source against a real redis-server: reads, claims, acks and dead letters."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from acker_spark.queues import Message, RedisStreamSource

from .brokers import RedisServer


def publish(server: RedisServer, stream: str, count: int, start: int = 0) -> list[str]:
    """``count`` entries ``data=m<i>``; their ids."""
    client = redis.Redis.from_url(server.url)
    ids = [client.xadd(stream, {"data": f"m{i}"}).decode() for i in range(start, start + count)]
    client.close()
    return ids


def pending(server: RedisServer, stream: str, group: str) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.xpending(stream, group)["pending"])
    finally:
        client.close()


def source(server: RedisServer, **options: Any) -> RedisStreamSource:
    return RedisStreamSource(server.url, "orders", "nightly", **options)


def test_read_new_entries_then_ack(redis_server: RedisServer) -> None:
    """New entries come in order with one delivery; each stays pending until acked."""
    src = source(redis_server)
    ids = publish(redis_server, "orders", 5)
    messages = src.read(3)
    assert messages == [Message(ids[i], f"m{i}", 1) for i in range(3)]
    assert pending(redis_server, "orders", "nightly") == 3
    assert src.ack([m.id for m in messages]) == 3
    assert src.ack([m.id for m in messages]) == 0  # acked once
    rest = src.read(10)
    assert [m.payload for m in rest] == ["m3", "m4"]
    src.ack([m.id for m in rest])
    assert src.read(10) == []
    src.close()


def test_restarted_consumer_reads_its_pending_entries_first_with_the_delivery_counted(
    redis_server: RedisServer,
) -> None:
    """A driver killed holding entries: the same consumer, restarted, gets them again before new ones."""
    ids = publish(redis_server, "orders", 4)
    source(redis_server).read(2)  # the killed run's batch: never acked
    publish(redis_server, "orders", 1, start=4)
    again = source(redis_server).read(10)
    assert [(m.id, m.deliveries) for m in again[:2]] == [(ids[0], 2), (ids[1], 2)]
    assert [(m.payload, m.deliveries) for m in again[2:]] == [("m2", 1), ("m3", 1), ("m4", 1)]


def test_idle_entries_of_another_consumer_are_claimed(redis_server: RedisServer) -> None:
    """XAUTOCLAIM: entries a dead consumer left idle past claim_idle go to the next reader; fresh ones do not."""
    ids = publish(redis_server, "orders", 3)
    dead = source(redis_server, consumer="a", claim_idle=3600)
    held = dead.read(3)
    other = source(redis_server, consumer="b", claim_idle=3600)
    assert other.read(10) == []  # held by "a", not idle long enough
    dead.release([held[0].id, held[2].id])  # a's entries past claim_idle, as after an hour without a heartbeat
    claimed = other.read(10)
    assert [(m.id, m.deliveries) for m in claimed] == [(ids[0], 2), (ids[2], 2)]


def test_dead_letter_moves_entry_with_cause_and_acks_once(redis_server: RedisServer) -> None:
    """The dead-letter stream gets the entry's fields and its cause; a repeat (after a crash) adds nothing."""
    src = source(redis_server)
    ids = publish(redis_server, "orders", 2)
    src.read(2)
    assert src.dead_letter([(ids[1], "FAILED after 3 attempts: ValueError: bad")]) == 1
    assert src.dead_letter([(ids[1], "FAILED after 3 attempts: ValueError: bad")]) == 0
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    letters = client.xrange("orders:dead")
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields["acker_source_id"] == ids[1] and fields["data"] == "m1"
    assert fields["acker_cause"] == "FAILED after 3 attempts: ValueError: bad"
    assert pending(redis_server, "orders", "nightly") == 1  # ids[0] still held


def test_entry_without_payload_field_is_dead_lettered_at_read(redis_server: RedisServer) -> None:
    """An entry lacking the payload field cannot be processed: it goes to the dead-letter stream, named."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.xadd("orders", {"other": "x"})
    good = client.xadd("orders", {"data": "ok"})
    messages = source(redis_server).read(10)
    assert [m.id for m in messages] == [good]
    (letter,) = client.xrange("orders:dead")
    assert "no field 'data'" in letter[1]["acker_cause"]
    assert pending(redis_server, "orders", "nightly") == 1


def test_pending_entries_survive_a_broker_restart(redis_server: RedisServer) -> None:
    """With AOF, the group and its pending entries are there after redis-server restarts."""
    ids = publish(redis_server, "orders", 3)
    source(redis_server).read(3)
    redis_server.restart()
    again = source(redis_server).read(10)
    assert [(m.id, m.deliveries) for m in again] == [(i, 2) for i in ids]


def test_bad_batch_size_is_refused(redis_server: RedisServer) -> None:
    """A batch of no messages is a mistake, said so."""
    with pytest.raises(ValueError, match="batch must be at least 1"):
        source(redis_server, batch=0)


def test_a_source_rides_out_a_server_restart(redis_server: RedisServer) -> None:
    """A source made from a URL retries through a redis-server restart: its held entries are acked after it."""
    src = source(redis_server)
    publish(redis_server, "orders", 2)
    held = src.read(10)
    redis_server.stop()
    back = threading.Timer(1.0, redis_server.start)  # down for a second while the driver acks
    back.start()
    try:
        assert src.ack([m.id for m in held]) == 2
    finally:
        back.join()
    assert pending(redis_server, "orders", "nightly") == 0
