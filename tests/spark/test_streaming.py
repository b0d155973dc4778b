"""The acker_spout streaming source: partitions of coordinates read and started on executors, replays by re-reading,
a streaming word count, and a query restarted with records in flight."""

from __future__ import annotations

import pickle
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acker_client import BoltCollector, ClusterClient, TrackedTuple
from acker_client.testing import local_cluster
from acker_protocol.wire import Outcome
from acker_spark import Bolt, DeadLetterStore, close_clients
from acker_spark.sqlite import open_db, upsert
from acker_spark.steps.frames import unpack_ids
from acker_spark.streaming import FORMAT, AckerSpoutDataSource, StreamOptions, register_acker_spout
from acker_spark.streaming.stream_planner import stream_progress
from acker_spark.streaming.stream_source import ChunkPartition, ReplayPartition
from acker_spark.tracking.checkpoint import Checkpoint
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable

pytest.importorskip("pyarrow")  # the Python Data Source API needs it (the [streaming] extra)

# Spark's workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

MESSAGE_TIMEOUT = 60.0  # no job here reaches it: a tree in flight is settled by its outcome, not a timeout
DEADLINE = 120.0  # seconds to wait for a query before the test fails (a hang guard, not a speed check)


def write_lines(directory: Path, name: str, lines: list[str]) -> dict[int, str]:
    """Put a complete text file into the source directory (written aside, then renamed in); its lines by byte offset."""
    staging = directory.parent / f".{name}.tmp"
    staging.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    staging.rename(directory / name)
    offsets, at = {}, 0
    for line in lines:
        offsets[at] = line
        at += len(line.encode()) + 1
    return offsets


def keyed(name: str, by_offset: dict[int, str]) -> dict[str, str]:
    """The stream's keys (``file@byte``) of a file's lines."""
    return {f"{name}@{offset}": line for offset, line in by_offset.items() if line.strip()}


def options(ackers: Any, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The source's options for ``tmp_path``'s layout (in/, checkpoint option, SQLite database)."""
    return {
        "ackers": ",".join(ackers.addresses),
        "database": str(tmp_path / "out.sqlite"),
        "checkpoint": str(tmp_path / "acker-checkpoint"),
        "path": str(tmp_path / "in"),
        **extra,
    }


# -- the reader alone (no Spark) ------------------------------------------------


def test_options_are_validated() -> None:
    """Missing or malformed options raise ValueError naming the option."""
    with pytest.raises(ValueError, match="ackers"):
        StreamOptions.parse({"database": "x", "path": "/d", "checkpoint": "c"})
    with pytest.raises(ValueError, match="max_attempts"):
        StreamOptions.parse({"ackers": "a:1", "database": "x", "path": "/d", "checkpoint": "c", "max_attempts": "two"})
    with pytest.raises(ValueError, match="record source"):
        StreamOptions.parse({"ackers": "a:1", "database": "x"})
    with pytest.raises(ValueError, match='"checkpoint" is required'):
        StreamOptions.parse({"ackers": "a:1", "database": "x", "path": "/d"})
    with pytest.raises(ValueError, match="split_bytes"):
        StreamOptions.parse({"ackers": "a:1", "database": "x", "path": "/d", "checkpoint": "c", "split_bytes": "0"})
    parsed = StreamOptions.parse(
        {"ackers": "a:1, b:2", "database": "x", "path": "/d", "CHECKPOINT": "c", "MAX_PENDING": "7"}
    )
    assert (parsed.ackers, parsed.max_pending, parsed.checkpoint) == (("a:1", "b:2"), 7, "c")
    assert parsed.budget is not None and parsed.budget.fraction == 0.05  # the failure budget's default
    base = {"ackers": "a:1", "database": "x", "path": "/d", "checkpoint": "c"}
    assert StreamOptions.parse({**base, "failure_budget": "off"}).budget is None
    only = StreamOptions.parse({**base, "failure_budget": "off", "failure_budget_records": "10"}).budget
    assert only is not None and (only.fraction, only.records) == (None, 10)
    with pytest.raises(ValueError, match="failure_budget"):
        StreamOptions.parse({**base, "failure_budget": "2"})


def test_partitions_carry_coordinates_executors_start_trees_and_replays_reread(tmp_path: Path) -> None:
    """Partitions name byte ranges (no payload); read() starts the trees; a failure is re-read as attempt 2."""
    source = tmp_path / "in"
    source.mkdir()
    lines = [f"line {i:02d} " + "x" * 40 for i in range(12)]
    by_offset = write_lines(source, "a.txt", lines)
    keys = keyed("a.txt", by_offset)
    line_bytes = len(lines[0]) + 1
    with local_cluster(2, message_timeout=MESSAGE_TIMEOUT) as ackers, ClusterClient(ackers.addresses) as client:
        opts = options(ackers, tmp_path, max_bytes_per_batch=str(8 * line_bytes), partitions="3")
        opts.update(max_attempts="2", backoff_base="0")
        reader = AckerSpoutDataSource(opts).streamReader(None)
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            assert end == {"round": 1, "file": 0, "byte": 8 * line_bytes}  # one batch's byte budget
            parts = reader.partitions(start, end)
            assert len(parts) == 3 and all(isinstance(p, ChunkPartition) for p in parts)
            # A partition is a few hundred bytes of coordinates, whatever the records weigh.
            assert all(len(pickle.dumps(p)) < 1_000 and lines[0] not in repr(vars(p)) for p in parts)
            assert reader.planner().table.count(0) == 0  # the planner started nothing
            shipped = pickle.loads(pickle.dumps(reader))  # what an executor gets
            rows = [row for part in parts for batch in shipped.read(part) for row in zip(*batch.to_pydict().values())]
            assert [(key, value, attempt) for key, value, attempt, _ in rows] == [
                (key, value, 1) for key, value in list(keys.items())[:8]
            ]
            collector = BoltCollector(client)
            failed = {rows[2][0], rows[5][0]}
            for key, value, attempt, ids in rows:
                t = TrackedTuple((key, value, attempt), unpack_ids(ids))
                collector.fail(t) if key in failed else collector.ack(t)
            client.flush()
            # The next offset admits the rest of the file at once: it names the replays only if both
            # failures were journaled before it is asked for (outcomes arrive on other threads).
            journal = Checkpoint(tmp_path / "acker-checkpoint")
            _wait_until(lambda: len(journal.read_outcomes()[0]) >= len(rows), "the batch's outcomes journaled")
            nxt = _wait_for(reader, end, lambda planned: planned != end)
            replays = [p for p in reader.partitions(end, nxt) if isinstance(p, ReplayPartition)]
            assert len(replays) == 1 and sorted(replays[0].offsets.tolist()) == sorted(
                int(k.split("@")[1]) for k in failed
            )
            assert replays[0].attempts.tolist() == [2, 2]
            again = [row for p in replays for batch in shipped.read(p) for row in zip(*batch.to_pydict().values())]
            assert sorted((k, v, a) for k, v, a, _ in again) == sorted((k, keys[k], 2) for k in failed)
            first_roots = {r for row in rows for r in unpack_ids(row[3]).roots}
            assert all(set(unpack_ids(row[3]).roots).isdisjoint(first_roots) for row in again)
            # The same call also admitted the rest of the file: read it, ack everything.
            rest = [p for p in reader.partitions(end, nxt) if isinstance(p, ChunkPartition)]
            more = [row for p in rest for batch in shipped.read(p) for row in zip(*batch.to_pydict().values())]
            assert [k for k, _, _, _ in more] == list(keys)[8:]
            for key, value, attempt, ids in again + more:
                collector.ack(TrackedTuple((key, value, attempt), unpack_ids(ids)))
            client.flush()
            _wait_for(reader, nxt, lambda planned: not reader.planner().busy())
        finally:
            reader.stop()
            close_clients()
    progress = stream_progress(tmp_path / "acker-checkpoint")
    assert progress.acked == set(keys) and not progress.waiting and not progress.dead
    assert {k for k, n in progress.deliveries.items() if n > 1} == failed


def _wait_until(done: Any, what: str) -> None:
    """Poll ``done()`` until it is true (a hang guard of DEADLINE seconds)."""
    import time

    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _wait_for(reader: Any, start: dict, done: Any) -> dict:
    """Call latestOffset until ``done(offset)`` (outcomes arrive on the subscriptions' threads)."""
    import time

    deadline = time.monotonic() + DEADLINE
    while True:
        planned = reader.latestOffset(start, ReadAllAvailable())
        if done(planned):
            return planned
        assert time.monotonic() < deadline, "the outcomes did not arrive"
        reader.planner().feed.wait(0.1)


# -- end to end on Spark ----------------------------------------------------------


def split(tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
    """One (key, position, word, attempt) child per word, anchored to its line; then ack the line."""
    for line in tuples:
        row = line.value
        for position, word in enumerate(row.value.split()):
            yield collector.emit((row.key, position, word, row.attempt), anchors=[line])
        collector.ack(line)


class StoreWords:
    """Sink bolt: write the words, then ack them; fail the injected ones instead."""

    def __init__(self, db: Path, fail_once: set[str], always_fail: str) -> None:
        self.db, self.fail_once, self.always_fail = db, fail_once, always_fail

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        words = list(tuples)
        keep = [w for w in words if not self.injected(w.value)]
        with open_db(self.db) as conn:
            upsert(conn, "words", ("record_key", "position", "word"), [tuple(w.value)[:3] for w in keep])
        for w in words:
            collector.fail(w) if self.injected(w.value) else collector.ack(w)
        return iter(())

    def injected(self, word: Any) -> bool:
        """Fail position 0 of the chosen lines on attempt 1, and of one line always."""
        key, position, _, attempt = word
        return position == 0 and (key == self.always_fail or (key in self.fail_once and attempt == 1))


def test_streaming_word_count_with_replays_and_dead_letter(spark: Any, tmp_path: Path) -> None:
    """Each line is acked once or dead-lettered; replays are exactly the injected failures; the sink is exact."""
    source = tmp_path / "in"
    source.mkdir()
    files = {
        "a.txt": ["the quick brown fox", "jumps over", "", "the lazy dog"],
        "b.txt": ["acker spark storm", "tuple tree", "root edge spout", "bolt shard"],
        "c.txt": ["ledger replay", "stream record word", "one two three", "never works"],
    }
    expected: dict[str, str] = {}
    for name, lines in files.items():
        expected.update(keyed(name, write_lines(source, name, lines)))
    by_line = {line: key for key, line in expected.items()}
    fail_once = {by_line["acker spark storm"], by_line["root edge spout"], by_line["stream record word"]}
    always_fail = by_line["never works"]
    db = tmp_path / "out.sqlite"
    with open_db(db) as conn:
        conn.execute(
            "CREATE TABLE words (record_key TEXT, position INT, word TEXT, PRIMARY KEY (record_key, position))"
        )
    register_acker_spout(spark)
    partitions: list[int] = []
    with local_cluster(3, message_timeout=MESSAGE_TIMEOUT) as ackers:
        addresses = ackers.addresses
        split_bolt = Bolt(split, addresses, name="split")
        store_bolt = Bolt(StoreWords(db, fail_once, always_fail), addresses, name="store")

        def job(df: Any, epoch: int) -> None:
            partitions.append(df.rdd.getNumPartitions())
            words = split_bolt.apply_df(df, "key string, position int, word string, attempt int")
            store_bolt.apply_df(words.repartition(2, F.col("word"))).count()

        reader = spark.readStream.format(FORMAT)
        for key, value in options(ackers, tmp_path, max_attempts="2", backoff_base="0.2", partitions="3").items():
            reader = reader.option(key, value) if key != "path" else reader
        query = (
            reader.load(str(source))
            .writeStream.foreachBatch(job)
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
    assert max(partitions) >= 3, partitions  # a micro-batch is read by many tasks
    progress = stream_progress(tmp_path / "acker-checkpoint")
    assert progress.settled == set(expected) and not progress.waiting
    assert progress.dead == {always_fail}
    assert {key for key, n in progress.deliveries.items() if n > 1} == fail_once | {always_fail}
    dead = DeadLetterStore(db).all()
    assert [(d.key, d.record, d.reason, d.attempts) for d in dead] == [(always_fail, "never works", Outcome.FAILED, 2)]
    with open_db(db) as conn:
        stored = conn.execute("SELECT record_key, position, word FROM words WHERE record_key != ?", (always_fail,))
        sink = sorted(stored.fetchall())
    assert sink == sorted(
        (key, pos, word)
        for key, line in expected.items()
        if key != always_fail
        for pos, word in enumerate(line.split())
    )


class StoreLines:
    """Sink bolt: upsert each line, append a (key, attempt, run) row, then ack."""

    def __init__(self, db: Path, run: int) -> None:
        self.db, self.run = db, run

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
        tracked = list(tuples)
        rows = [t.value for t in tracked]
        with open_db(self.db) as conn:
            upsert(conn, "lines", ("record_key", "line"), [(r.key, r.value) for r in rows])
            conn.executemany("INSERT INTO writes VALUES (?, ?, ?)", [(r.key, r.attempt, self.run) for r in rows])
        for t in tracked:
            collector.ack(t)
        return iter(())


class InjectedStop(RuntimeError):
    """Raised by the first query's job to stop it mid-batch."""


def test_query_restarted_mid_stream_keeps_its_records_in_flight(spark: Any, tmp_path: Path) -> None:
    """A query dies with half a micro-batch acked and half in flight; restarted from its checkpoints, every record
    is processed, the acked half is not processed again, the in-flight half is re-read as attempt 2."""
    source = tmp_path / "in"
    source.mkdir()
    expected, batches = {}, []
    for name in ("a.txt", "b.txt", "c.txt"):
        lines = [f"{name[0]} {n:03d} alpha beta gamma" for n in range(30)]
        keys = keyed(name, write_lines(source, name, lines))
        expected.update(keys)
        batches.append(keys)
    file_bytes = (source / "a.txt").stat().st_size
    db = tmp_path / "out.sqlite"
    with open_db(db) as conn:
        conn.execute("CREATE TABLE lines (record_key TEXT PRIMARY KEY, line TEXT)")
        conn.execute("CREATE TABLE writes (record_key TEXT, attempt INT, run INT)")
    register_acker_spout(spark)

    def even(df: Any) -> Any:
        return F.expr("cast(split(value, ' ')[1] as int) % 2 = 0")

    with local_cluster(2, message_timeout=MESSAGE_TIMEOUT) as ackers:

        def start(run: int, job: Any) -> Any:
            reader = spark.readStream.format(FORMAT)
            opts = options(ackers, tmp_path, max_bytes_per_batch=str(file_bytes), partitions="2")
            for key, value in opts.items():
                reader = reader.option(key, value) if key != "path" else reader
            return (
                reader.load(str(source))
                .writeStream.foreachBatch(job)
                .trigger(availableNow=True)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .start()
            )

        first_sink = Bolt(StoreLines(db, 1), ackers.addresses, name="store")

        def first_job(df: Any, epoch: int) -> None:
            if epoch == 0:
                first_sink.apply_df(df).count()
                return
            # Read the whole batch (every tree started), process the even lines, then die.
            first_sink.apply_df(df.filter(even(df))).count()
            raise InjectedStop("the query stops with records in flight")

        query = start(1, first_job)
        with pytest.raises(Exception, match="InjectedStop|records in flight"):
            query.awaitTermination(DEADLINE)
        query.stop()
        in_flight = stream_progress(tmp_path / "acker-checkpoint")
        odd = {k for k, line in batches[1].items() if int(line.split()[1]) % 2}
        assert odd <= in_flight.waiting, "the first query should leave batch 1's odd lines in flight"

        second_sink = Bolt(StoreLines(db, 2), ackers.addresses, name="store")
        query = start(2, lambda df, epoch: second_sink.apply_df(df).count())
        try:
            assert query.awaitTermination(DEADLINE), f"the restarted query did not finish in {DEADLINE} s"
        finally:
            query.stop()
        close_clients()
    assert query.exception() is None
    with open_db(db) as conn:
        assert dict(conn.execute("SELECT record_key, line FROM lines").fetchall()) == expected
        writes = conn.execute("SELECT record_key, attempt, run FROM writes").fetchall()
    acked_first = set(batches[0]) | (set(batches[1]) - odd)
    redone = sorted({k for k, _, run in writes if run == 2} & acked_first)
    assert not redone, f"records acked under the first query were processed again: {redone[:5]}"
    assert {(k, a) for k, a, run in writes if run == 2} == {(k, 2) for k in odd} | {(k, 1) for k in batches[2]}
    progress = stream_progress(tmp_path / "acker-checkpoint")
    assert progress.acked == set(expected) and not progress.waiting
    assert Counter(progress.deliveries.values()) == Counter({1: len(expected) - len(odd), 2: len(odd)})
    assert np.all([n in (1, 2) for n in progress.deliveries.values()])
