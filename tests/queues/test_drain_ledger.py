"""The drain's choices before a batch runs, against a real redis-server: settled messages, worn-out messages."""

from __future__ import annotations

from pathlib import Path

import redis
from acker_spark.queues import QueueRunStats, RedisStreamSource
from acker_spark.queues.drain import _fresh
from acker_spark.queues.settled import SettledLedger

from .brokers import RedisServer


def test_redelivered_settled_messages_are_settled_again_not_processed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A message whose batch was recorded but whose ack was lost: acked (or dead-lettered with its cause) at once."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    ids = [client.xadd("orders", {"data": f"m{i}"}) for i in range(4)]
    ledger = SettledLedger(tmp_path / "settled")
    ledger.record(1, [ids[0]], {ids[1]: "FAILED after 3 attempts: ValueError: bad"})
    source = RedisStreamSource(redis_server.url, "orders", "nightly")
    totals = QueueRunStats()
    fresh = _fresh(source, SettledLedger(tmp_path / "settled"), source.read(10), 5, totals)  # a restarted drain
    assert [m.id for m in fresh] == ids[2:]
    assert (totals.acked_at_broker, totals.dead_lettered_at_broker, totals.already_settled) == (1, 1, 2)
    (letter,) = client.xrange("orders:dead")
    assert letter[1]["acker_source_id"] == ids[1] and "ValueError: bad" in letter[1]["acker_cause"]
    assert int(client.xpending("orders", "nightly")["pending"]) == 2  # the fresh ones, held for their batch


def test_messages_delivered_past_the_last_attempt_are_dead_lettered(redis_server: RedisServer, tmp_path: Path) -> None:
    """Runs that died holding a message count its deliveries; past max_attempts it is dead-lettered, named so."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    worn = client.xadd("orders", {"data": "worn"})
    source = RedisStreamSource(redis_server.url, "orders", "nightly")
    for _ in range(3):
        source.read(10)  # three deliveries, none acked
    fresh_one = client.xadd("orders", {"data": "new"})
    totals = QueueRunStats()
    fresh = _fresh(source, SettledLedger(tmp_path / "settled"), source.read(10), 3, totals)
    assert [m.id for m in fresh] == [fresh_one] and totals.dead_lettered_at_broker == 1
    (letter,) = client.xrange("orders:dead")
    assert letter[1]["acker_source_id"] == worn and "delivered 4 times" in letter[1]["acker_cause"]
