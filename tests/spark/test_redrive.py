"""SourcePipeline.redrive on real local Spark and real ackers: after the fix, every selected dead letter is sent
through the job once as a new tree and acked; a driver that dies mid-redrive is finished by the next redrive
without sending any letter twice."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_spark import ArrowBolt, DeadLetterStore, ReplayPolicy, Select, close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.sqlite import open_db, upsert
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

RECORDS = 1_000
POLICY = ReplayPolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.2)


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Ackers with a timeout no job here reaches."""
    with local_cluster(2, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


class Sink:
    """Writes (id, attempt) of every row it takes into ``seen``; ids in ``value_errors`` raise ValueError, ids in
    ``key_errors`` KeyError (the bug before its fix: both empty)."""

    def __init__(self, db: str, value_errors: frozenset[str] = frozenset(), key_errors: frozenset[str] = frozenset()):
        self.db, self.value_errors, self.key_errors = db, value_errors, key_errors

    def __call__(self, batch: pa.RecordBatch, collector: Any) -> None:
        ids = batch.column("id").to_pylist()
        for key in ids:
            if key in self.value_errors:
                raise ValueError(f"amount of {key} is not a number")
            if key in self.key_errors:
                raise KeyError("price")
        attempts = batch.column("_attempt").to_pylist()  # a delivery of a record is its attempt
        with open_db(self.db) as conn:
            upsert(conn, "seen", ("id", "root"), list(zip(ids, map(str, attempts))))


def sink_job(ackers: Any, db: Path, **bad: frozenset[str]) -> Any:
    bolt = ArrowBolt(Sink(str(db), **bad), ackers.addresses, schema=None, name="sink")
    return lambda df: bolt.apply_df(df).count()


def seen(db: Path) -> dict[str, int]:
    """Each id the sink wrote, with the number of its deliveries (attempts) that wrote it."""
    with open_db(db) as conn:
        return dict(conn.execute("SELECT id, COUNT(DISTINCT root) FROM seen GROUP BY id").fetchall())


@pytest.fixture
def failed_run(spark: Any, ackers: Any, client: ClusterClient, tmp_path: Path) -> tuple[Any, DeadLetterStore, Path]:
    """A run of RECORDS records in which 30 raise ValueError and 10 KeyError: 40 dead letters with causes."""
    db = tmp_path / "sink.sqlite"
    with open_db(db) as conn:
        conn.execute("CREATE TABLE seen (id TEXT, root TEXT, PRIMARY KEY (id, root))")
    rows = [(f"k{i:05d}", float(i)) for i in range(RECORDS)]
    source = spark.createDataFrame(rows, "id string, amount double").repartition(4)
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    bad_value = frozenset(f"k{i:05d}" for i in range(0, 600, 20))
    bad_key = frozenset(f"k{i:05d}" for i in range(7, 700, 70))
    pipeline = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY, dead_letters=letters)
    stats = pipeline.run(source, sink_job(ackers, db, value_errors=bad_value, key_errors=bad_key), key="id")
    assert (stats.acked, stats.dead_lettered) == (RECORDS - 40, 40)
    with open_db(db) as conn:
        conn.execute("DELETE FROM seen")  # from here on, the sink sees only redriven deliveries
    return pipeline, letters, db


def test_redrive_after_the_fix_acks_each_selected_dead_letter_once(
    failed_run: tuple[Any, DeadLetterStore, Path], ackers: Any
) -> None:
    pipeline, letters, db = failed_run
    assert [(g.kind, g.count) for g in letters.groups()] == [("ValueError", 30), ("KeyError", 10)]
    report = pipeline.redrive(letters, sink_job(ackers, db), select=Select(cause="ValueError"), schema="amount double")
    assert (report.claimed, report.acked, report.dead) == (30, 30, 0)
    value_keys = {d.key for d in letters.all() if d.cause and d.cause.startswith("ValueError")}
    assert seen(db) == dict.fromkeys(value_keys, 1)  # each written by exactly one new tree
    statuses = {d.key: d.redrive_status for d in letters.all()}
    assert {statuses[k] for k in value_keys} == {"acked"}
    assert {s for k, s in statuses.items() if k not in value_keys} == {None}  # the KeyErrors were not selected
    # The same selection again: nothing left to send.
    again = pipeline.redrive(letters, sink_job(ackers, db), select=Select(cause="ValueError"))
    assert (again.claimed, again.sent) == (0, 0)
    assert seen(db) == dict.fromkeys(value_keys, 1)


def test_a_letter_that_fails_again_is_dead_again_with_its_new_cause(
    failed_run: tuple[Any, DeadLetterStore, Path], ackers: Any
) -> None:
    pipeline, letters, db = failed_run
    key_keys = sorted(d.key for d in letters.all() if d.cause and d.cause.startswith("KeyError"))
    still_bad = frozenset(key_keys[:2])
    report = pipeline.redrive(letters, sink_job(ackers, db, value_errors=still_bad), select=Select(cause="KeyError"))
    assert (report.acked, report.dead, report.causes) == (8, 2, {"ValueError": 2})
    dead = [d for d in letters.all() if d.redrive_status == "dead"]
    assert [d.key for d in dead] == key_keys[:2]
    assert all(d.redrive_cause and d.redrive_cause.startswith("ValueError: amount of") for d in dead)
    assert {g.kind: g.count for g in letters.groups()}["ValueError"] == 32  # grouped under the new cause


class Crash(Exception):
    """Stands in for the driver dying."""


def test_redrive_killed_midway_and_run_again_sends_each_letter_once(
    failed_run: tuple[Any, DeadLetterStore, Path], spark: Any, client: ClusterClient, ackers: Any, tmp_path: Path
) -> None:
    """Chunks of 10 letters (rate 10/s with an injected clock); the driver 'dies' in the second chunk after its
    records were acked and before the store recorded them. The next redrive resumes that chunk's checkpoint
    (nothing sent again) and sends the rest: every letter written by one tree, all acked."""
    _, letters, db = failed_run
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def die_in_second_chunk(stats: Any) -> None:
        # The second chunk's run (20 letters written in all) with its 10 records acked: die before the store hears.
        if stats.acked == 10 and not stats.pending and len(seen(db)) == 20:
            raise Crash

    dying = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY, on_progress=die_in_second_chunk)
    with pytest.raises(Crash):
        dying.redrive(letters, sink_job(ackers, db), rate=10, chunk_seconds=1, clock=lambda: now[0], sleep=sleep)
    statuses = [d.redrive_status for d in letters.all()]
    assert (statuses.count("acked"), statuses.count("redriving")) == (10, 30)
    assert len(seen(db)) == 20  # two chunks' deliveries were made

    fresh = SourcePipeline(spark, client, tmp_path / "cp", policy=POLICY)
    report = fresh.redrive(letters, sink_job(ackers, db), rate=10, chunk_seconds=1, clock=lambda: now[0], sleep=sleep)
    assert report.resumed and (report.claimed, report.acked, report.sent) == (40, 40, 30)
    assert seen(db) == dict.fromkeys((d.key for d in letters.all()), 1)  # no letter delivered twice
    assert {d.redrive_status for d in letters.all()} == {"acked"}


def test_acker_ctl_redrive_runs_the_job_module_over_the_selection(
    failed_run: tuple[Any, DeadLetterStore, Path], ackers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command takes the KeyError letters through the job module's job: they end acked, the rest untouched."""
    from acker_ctl.cli import main

    _, letters, _ = failed_run
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the job module, as a user's would be on the path
    printed: list[str] = []
    code = main(
        [
            "--ackers",
            ",".join(ackers.addresses),
            "--json",
            "dead-letters",
            "redrive",
            "--store",
            str(letters.path),
            "--job",
            "redrive_job:make_job",
            "--checkpoint",
            str(tmp_path / "cp"),
            "--cause",
            "KeyError",
        ],  # fmt: skip
        out=printed.append,
    )
    assert code == 0, printed
    result = json.loads(printed[0])
    assert (result["claimed"], result["acked"], result["dead"]) == (10, 10, 0)
    statuses = {d.key: d.redrive_status for d in letters.all() if d.cause and d.cause.startswith("KeyError")}
    assert set(statuses.values()) == {"acked"} and len(statuses) == 10
    assert sum(d.redrive_status is None for d in letters.all()) == 30
