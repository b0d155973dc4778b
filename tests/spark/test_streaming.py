"""The acker_spout streaming source: the reader's offset log and replays alone, then a streaming word count."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import BoltCollector, ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import Bolt, DeadLetterStore, close_clients
from acker_spark.frames import unpack_ids
from acker_spark.sqlite import open_db, upsert
from acker_spark.stream_ledger import StreamLedger
from acker_spark.streaming import FORMAT, AckerSpoutDataSource, StreamOptions, register_acker_spout
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

pytest.importorskip("pyarrow")  # the Python Data Source API needs it (the [streaming] extra)

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

MESSAGE_TIMEOUT = 30.0
DEADLINE = 60.0  # seconds to wait for every record to settle before the test fails


def write_lines(directory: Path, name: str, lines: list[str]) -> None:
    """Put a complete text file into the source directory (written aside, then renamed in)."""
    staging = directory.parent / f".{name}.tmp"
    staging.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    staging.rename(directory / name)


# -- the reader alone (no Spark) ------------------------------------------------


def test_options_are_validated() -> None:
    """Missing or malformed options raise ValueError naming the option."""
    with pytest.raises(ValueError, match="ackers"):
        StreamOptions.parse({"database": "x", "generated": "3"})
    with pytest.raises(ValueError, match="max_attempts"):
        StreamOptions.parse({"ackers": "a:1", "database": "x", "generated": "3", "max_attempts": "two"})
    with pytest.raises(ValueError, match="exactly one record source"):
        StreamOptions.parse({"ackers": "a:1", "database": "x"})
    parsed = StreamOptions.parse({"ackers": "a:1, b:2", "database": "x", "path": "/d", "MAX_PENDING": "7"})
    assert (parsed.ackers, parsed.max_pending) == (("a:1", "b:2"), 7)


def test_reader_offsets_partitions_commit_and_replay(tmp_path: Path) -> None:
    """latestOffset emits at most max_pending trees, partitions slice the log, a failure comes back as attempt 2."""
    source = tmp_path / "in"
    source.mkdir()
    write_lines(source, "a.txt", [f"line {i}" for i in range(5)])
    db = tmp_path / "progress.sqlite"
    with local_cluster(1, message_timeout=MESSAGE_TIMEOUT) as ackers, ClusterClient(ackers.addresses) as client:
        options = {
            "ackers": ",".join(ackers.addresses),
            "database": str(db),
            "path": str(source),
            "max_pending": "4",
            "max_attempts": "2",
            "backoff_base": "0",
            "partitions": "3",
        }
        reader = AckerSpoutDataSource(options).streamReader(None)
        try:
            start = reader.initialOffset()
            assert start == {"offset": 0}
            end = reader.latestOffset(start, ReadAllAvailable())
            assert end == {"offset": 4}  # max_pending bounds the trees in flight
            parts = reader.partitions(start, end)
            rows = [row for part in parts for row in reader.read(part)]
            assert len(parts) == 3
            assert [(key, attempt) for key, _, attempt, _ in rows] == [(f"a.txt:{n}", 1) for n in range(1, 5)]
            assert reader.latestOffset(end, ReadAllAvailable()) == end  # full: nothing new
            reader.commit(end)
            assert reader.spout().rows(0, 4) == []  # committed rows are forgotten

            collector = BoltCollector(client)
            for key, value, attempt, ids in rows:
                t = TrackedTuple((key, value, attempt), unpack_ids(ids))
                collector.fail(t) if key in ("a.txt:2", "a.txt:3") else collector.ack(t)
            client.flush()
            # Every outcome received and its callback done (a replay is queued by the callback).
            assert reader.spout().spout.wait_idle(DEADLINE)

            after = reader.latestOffset(end, ReadMaxRows(2))
            assert after == {"offset": 6}
            replayed = reader.spout().rows(4, 6)
            assert [(key, attempt) for key, _, attempt, _ in replayed] == [("a.txt:2", 2), ("a.txt:3", 2)]
            assert all(set(unpack_ids(r[3]).roots).isdisjoint(unpack_ids(o[3]).roots) for r in replayed for o in rows)
            more = reader.latestOffset(after, ReadAllAvailable())
            assert [row[0] for row in reader.spout().rows(6, more["offset"])] == ["a.txt:5"]
        finally:
            reader.stop()
    outcomes = {(d.key, d.attempt): (d.outcome, d.final) for d in StreamLedger(db).deliveries()}
    assert len({d.run for d in StreamLedger(db).deliveries()}) == 1
    assert outcomes[("a.txt:1", 1)] == (Outcome.ACKED, True)
    assert outcomes[("a.txt:2", 1)] == (Outcome.FAILED, False)
    assert ("a.txt:2", 2) in outcomes  # closed while pending: LOST, recorded, not settled
    assert outcomes[("a.txt:2", 2)] == (Outcome.LOST, False)
    assert DeadLetterStore(db).keys() == set()


# -- end to end on Spark ----------------------------------------------------------

FAIL_ONCE = {"b.txt:1", "b.txt:3", "c.txt:2"}
ALWAYS_FAIL = "c.txt:4"


def split(tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
    """One (key, position, word, attempt) child per word, anchored to its line; then ack the line."""
    for line in tuples:
        row = line.value
        for position, word in enumerate(row.value.split()):
            yield collector.emit((row.key, position, word, row.attempt), anchors=[line])
        collector.ack(line)


class StoreWords:
    """Sink bolt: write the words, then ack them; fail the injected ones instead."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        words = list(tuples)
        keep = [w for w in words if not self.injected(w.value)]
        with open_db(self.db) as conn:
            upsert(conn, "words", ("record_key", "position", "word"), [tuple(w.value)[:3] for w in keep])
        for w in words:
            collector.fail(w) if self.injected(w.value) else collector.ack(w)
        return iter(())

    @staticmethod
    def injected(word: Any) -> bool:
        """Fail position 0 of the chosen lines on attempt 1, and of one line always."""
        key, position, _, attempt = word
        return position == 0 and (key == ALWAYS_FAIL or (key in FAIL_ONCE and attempt == 1))


def test_streaming_word_count_with_replays_and_dead_letter(spark: Any, tmp_path: Path) -> None:
    """Each line is acked once or dead-lettered; replays are exactly the injected failures; the sink is exact."""
    source = tmp_path / "in"
    source.mkdir()
    files = {
        "a.txt": ["the quick brown fox", "jumps over", "the lazy dog"],
        "b.txt": ["acker spark storm", "tuple tree", "root edge spout", "bolt shard"],
        "c.txt": ["ledger replay", "stream record word", "one two three", "never works"],
    }
    for name, lines in files.items():
        write_lines(source, name, lines)
    expected = {f"{name}:{n}": line for name, lines in files.items() for n, line in enumerate(lines, start=1)}
    db = tmp_path / "out.sqlite"
    with open_db(db) as conn:
        conn.execute(
            "CREATE TABLE words (record_key TEXT, position INT, word TEXT, PRIMARY KEY (record_key, position))"
        )
    ledger = StreamLedger(db)
    register_acker_spout(spark)
    with local_cluster(3, message_timeout=MESSAGE_TIMEOUT) as ackers:
        addresses = ackers.addresses
        split_bolt, store_bolt = Bolt(split, addresses, name="split"), Bolt(StoreWords(db), addresses, name="store")

        def job(df: Any, epoch: int) -> None:
            words = split_bolt.apply_df(df, "key string, position int, word string, attempt int")
            store_bolt.apply_df(words.repartition(2, F.col("word"))).count()

        stream = (
            spark.readStream.format(FORMAT)
            .option("ackers", ",".join(addresses))
            .option("database", str(db))
            .option("max_pending", "5")
            .option("max_attempts", "2")
            .option("backoff_base", "0.2")
            .load(str(source))
        )
        query = (
            stream.writeStream.foreachBatch(job)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            # AvailableNow ends the query only once every record present at its start is settled.
            assert query.awaitTermination(DEADLINE), f"the query did not finish in {DEADLINE} s"
        finally:
            query.stop()
        close_clients()
    assert query.exception() is None
    assert ledger.settled_keys() == set(expected)

    deliveries = ledger.deliveries()
    acked = Counter(d.key for d in deliveries if d.outcome is Outcome.ACKED)
    dead = DeadLetterStore(db).all()
    assert [(d.key, d.reason, d.attempts) for d in dead] == [(ALWAYS_FAIL, Outcome.FAILED, 2)]
    assert acked == Counter({key: 1 for key in expected if key != ALWAYS_FAIL})
    assert {d.key for d in deliveries if d.attempt > 1} == FAIL_ONCE | {ALWAYS_FAIL}
    assert {(d.key, d.attempt) for d in deliveries if d.outcome is Outcome.FAILED} == {
        *((key, 1) for key in FAIL_ONCE),
        (ALWAYS_FAIL, 1),
        (ALWAYS_FAIL, 2),
    }
    with open_db(db) as conn:
        stored = conn.execute("SELECT record_key, position, word FROM words WHERE record_key != ?", (ALWAYS_FAIL,))
        sink = sorted(stored.fetchall())
    assert sink == sorted(
        (key, pos, word)
        for key, line in expected.items()
        if key != ALWAYS_FAIL
        for pos, word in enumerate(line.split())
    )
