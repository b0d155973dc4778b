"""The acker_queue planner driven by hand against a real redis-server: acks wait for a *done* output commit.

No Spark: the test calls the stream reader's planning methods as Spark's
planning process would, reads the partitions as an executor would (in this
process), and acks or fails the trees itself. The output commit log is
written by hand in StreamOutput's layout, so the test controls when a commit
is decided and when it is done. A planner whose ack raises is a planner killed
between the ledger and the broker; a new reader on the same checkpoint is its
restart.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from acker_client import BoltCollector, ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_spark import close_clients
from acker_spark.output.commits import COMMITS_DIR
from acker_spark.queues import RedisStreamSource
from acker_spark.steps.frames import unpack_ids
from acker_spark.tracking.checkpoint import Checkpoint

from .brokers import RedisServer

pytest.importorskip("pyspark.sql.datasource")
from acker_spark.streaming import AckerQueueDataSource  # noqa: E402 - after the skip: needs PySpark 4
from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

DEADLINE = 60.0


class PlannerKilled(BaseException):
    """Stands for the planning process dying at a chosen point."""


@pytest.fixture
def ackers() -> Iterator[Any]:
    with local_cluster(2, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def pending(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.xpending("orders", "g")["pending"])
    finally:
        client.close()


def write_commit(checkpoint: Path, number: int, roots: list[int], state: str) -> None:
    """A commit of ``roots`` in StreamOutput's log, in ``state`` (the test plays the query's foreachBatch)."""
    folder = checkpoint / COMMITS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"c{number:05d}.npz", roots=np.sort(np.asarray(roots, dtype=np.uint64)))
    (folder / f"c{number:05d}.json").write_text(json.dumps({"number": number, "state": state, "rounds": [1]}))


def test_acks_wait_for_a_done_commit_and_a_lost_ack_is_repeated_after_a_restart(
    ackers: Any, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dead message is dead-lettered at once; ACKED ones wait for a done commit; an ack lost after the ledger
    write is repeated by a restarted planner."""
    client = redis.Redis.from_url(redis_server.url)
    sent = {client.xadd("orders", {"data": text}).decode(): text for text in ("a b", "c", "bad", "d e f")}
    client.close()
    checkpoint = tmp_path / "acker-checkpoint"
    options = {
        "redis": redis_server.url,
        "stream": "orders",
        "group": "g",
        "ackers": ",".join(ackers.addresses),
        "checkpoint": str(checkpoint),
        "max_attempts": "1",
    }
    reader = AckerQueueDataSource(options).streamReader(None)
    with ClusterClient(ackers.addresses) as acker_client:
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            assert end["round"] == 1
            shipped = pickle.loads(pickle.dumps(reader))  # what an executor gets: no broker connection
            assert shipped._planner is None
            rows = [
                row
                for part in reader.partitions(start, end)
                for batch in shipped.read(part)
                for row in zip(*batch.to_pydict().values())
            ]
            assert {(key, value, attempt) for key, value, attempt, _ in rows} == {(k, v, 1) for k, v in sent.items()}
            collector = BoltCollector(acker_client)
            roots = []
            for key, value, attempt, ids in rows:
                tracked = TrackedTuple((key, value, attempt), unpack_ids(ids))
                if value == "bad":
                    collector.fail(tracked)
                else:
                    collector.ack(tracked)
                    roots.extend(unpack_ids(ids).roots)
            acker_client.flush()
            journal = Checkpoint(checkpoint)
            deadline = time.monotonic() + DEADLINE
            while len(journal.read_outcomes()[0]) < len(rows):
                assert time.monotonic() < deadline, "the outcomes did not arrive"
                time.sleep(0.05)

            # The trees ended: the dead one is dead-lettered now, the ACKED ones wait for their commit.
            nxt = reader.latestOffset(end, ReadAllAvailable())
            assert nxt["round"] == 2  # an empty micro-batch, so foreachBatch can commit the ACKED trees
            assert pending(redis_server) == 3
            planner = reader.planner()
            assert planner.stats.dead_lettered_at_broker == 1 and planner.stats.acked_at_broker == 0

            write_commit(checkpoint, 0, roots, "decided")  # decided is not done: no ack yet
            reader.latestOffset(nxt, ReadAllAvailable())
            assert pending(redis_server) == 3

            write_commit(checkpoint, 0, roots, "done")

            def killed(ids: Any) -> int:
                raise PlannerKilled

            monkeypatch.setattr(planner.source, "ack", killed)
            with pytest.raises(PlannerKilled):
                reader.latestOffset(nxt, ReadAllAvailable())
            assert pending(redis_server) == 3  # recorded in the ledger, not acked
        finally:
            reader.stop()
    close_clients()

    # The restarted planner: the ledger names the three, so their redeliveries are acked, not spooled again.
    again = AckerQueueDataSource(options).streamReader(None)
    try:
        last = again.latestOffset(nxt, ReadAllAvailable())
        assert last == nxt  # nothing new to read, nothing waiting for a commit
        assert again.planner().stats.already_settled == 3 and pending(redis_server) == 0
    finally:
        again.stop()
    spool = sorted((checkpoint / "queue" / "spool").glob("*.jsonl"))
    assert len(spool) == 1 and len(spool[0].read_text().splitlines()) == 4
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    (letter,) = [fields for _, fields in client.xrange("orders:dead")]
    client.close()
    assert letter["data"] == "bad" and letter["acker_cause"].startswith("FAILED after 1 attempts")


def test_without_commits_nothing_is_acked_and_empty_micro_batches_stop(
    ackers: Any, redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Entries a killed planner read but did not spool are read again. A query that never commits through
    StreamOutput: its ACKED messages stay pending at the broker, and the planner asks for three empty
    micro-batches, warns, and then plans nothing more."""
    client = redis.Redis.from_url(redis_server.url)
    for text in ("a", "b"):
        client.xadd("orders", {"data": text})
    client.close()
    options = {
        "redis": redis_server.url,
        "stream": "orders",
        "group": "g",
        "ackers": ",".join(ackers.addresses),
        "checkpoint": str(tmp_path / "acker-checkpoint"),
    }
    # A planner killed after its read and before its spool file: one entry pending for its consumer.
    killed_read = RedisStreamSource(redis_server.url, "orders", "g", consumer="acker-stream")
    assert [m.payload for m in killed_read.read(1)] == ["a"] and pending(redis_server) == 1
    killed_read.close()
    reader = AckerQueueDataSource(options).streamReader(None)
    with ClusterClient(ackers.addresses) as acker_client:
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            shipped = pickle.loads(pickle.dumps(reader))
            collector = BoltCollector(acker_client)
            values = []
            for part in reader.partitions(start, end):
                for batch in shipped.read(part):
                    for key, value, attempt, ids in zip(*batch.to_pydict().values()):
                        values.append(value)
                        collector.ack(TrackedTuple((key, value, attempt), unpack_ids(ids)))
            assert sorted(values) == ["a", "b"]  # the killed planner's entry is read again from the broker
            acker_client.flush()
            journal = Checkpoint(tmp_path / "acker-checkpoint")
            deadline = time.monotonic() + DEADLINE
            while len(journal.read_outcomes()[0]) < 2:
                assert time.monotonic() < deadline, "the outcomes did not arrive"
                time.sleep(0.05)
            rounds = []
            for _ in range(5):
                end = reader.latestOffset(end, ReadAllAvailable())
                rounds.append(end["round"])
            assert rounds == [2, 3, 4, 4, 4]
            assert "committed no ACKED tree" in caplog.text
            assert pending(redis_server) == 2
        finally:
            reader.stop()
    close_clients()
