"""Redrive without Spark: the dead-letter table's groups, selections and marks, and the Redrive's chunks,
resume after a crash and pacing, with a runner standing in for the pipeline and an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from acker_protocol.wire import Outcome
from acker_spark.dead_letter import DeadLetterStore, Select, cause_kind
from acker_spark.redrive import Redrive, RedriveChunk, RedriveUnfinished


class Crash(Exception):
    """Stands in for a driver killed at a chosen moment."""


def store_with(tmp_path: Path, value_errors: int = 6, key_errors: int = 3) -> DeadLetterStore:
    """Dead letters k000.. with ValueError causes, then KeyError causes, then one with no cause."""
    store = DeadLetterStore(tmp_path / "dead.sqlite")
    rows: list[tuple[object, ...]] = []
    for i in range(value_errors):
        rows.append((f"k{i:03d}", {"id": f"k{i:03d}", "n": i}, Outcome.FAILED, 1, f"ValueError: bad n {i} (at j.py:3)"))
    for i in range(value_errors, value_errors + key_errors):
        rows.append((f"k{i:03d}", {"id": f"k{i:03d}", "n": i}, Outcome.FAILED, 1, "KeyError: 'price' (at j.py:9)"))
    rows.append(("z999", {"id": "z999", "n": -1}, Outcome.TIMED_OUT, 4, None))
    store.add_many(rows)
    return store


class Runner:
    """Records every chunk it is given; the keys in ``dead`` die again; raises Crash on chunk ``crash_at``."""

    def __init__(self, dead: dict[str, str] | None = None, crash_at: int | None = None) -> None:
        self.dead = dead or {}
        self.crash_at = crash_at
        self.chunks: list[tuple[list[str], Path]] = []

    def __call__(self, chunk: RedriveChunk, folder: Path) -> dict[str, str | None]:
        assert [value["id"] for value in chunk.values()] == chunk.keys  # each key with its own record
        self.chunks.append((chunk.keys, folder))
        if self.crash_at is not None and len(self.chunks) == self.crash_at:
            raise Crash
        return {key: self.dead[key] for key in chunk.keys if key in self.dead}


class FakeClock:
    """Time that moves only when the redrive sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_groups_by_cause_kind_with_counts_and_examples(tmp_path: Path) -> None:
    groups = store_with(tmp_path).groups(examples=2)
    assert [(g.kind, g.count) for g in groups] == [("ValueError", 6), ("KeyError", 3), ("(no cause)", 1)]
    assert [e.key for e in groups[0].examples] == ["k000", "k001"]
    assert groups[0].statuses == {"new": 6}


def test_cause_kind_of_free_text_and_none() -> None:
    assert cause_kind("ValueError: x (at a.py:1)") == "ValueError"
    assert cause_kind("price service said no") == "price service said no"
    assert cause_kind(None) == "(no cause)"


def test_select_by_cause_by_key_and_both(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    assert len(store.selected(Select())) == 10
    assert [d.key for d in store.selected(Select(cause="KeyError"))] == ["k006", "k007", "k008"]
    assert [d.key for d in store.selected(Select(keys=["k001", "z999"]))] == ["k001", "z999"]
    assert [d.key for d in store.selected(Select(cause="ValueError", keys=["k001", "k007"]))] == ["k001"]
    assert [d.key for d in store.selected(Select(cause="(no cause)"))] == ["z999"]


def test_select_refuses_empty_names() -> None:
    with pytest.raises(ValueError, match="non-empty strings"):
        Select(cause=[""])


def test_redrive_marks_acked_and_dead_again_with_the_new_cause(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    runner = Runner(dead={"k002": "TypeError: still bad (at j.py:4)"})
    report = Redrive(store, runner, tmp_path / "redrives", select=Select(cause="ValueError")).run()
    assert (report.claimed, report.sent, report.acked, report.dead) == (6, 6, 5, 1)
    assert report.causes == {"TypeError": 1}
    assert len(runner.chunks) == 1  # uncapped: one chunk
    letters = {d.key: d for d in store.all()}
    assert letters["k000"].redrive_status == "acked"
    assert (letters["k002"].redrive_status, letters["k002"].redrive_cause) == (
        "dead",
        "TypeError: still bad (at j.py:4)",
    )
    assert letters["k002"].cause.startswith("ValueError")  # the original cause is kept
    assert letters["k006"].redrive_status is None  # not selected
    # The letter that died again is grouped under its new cause, and a new redrive may take it.
    assert {g.kind: g.count for g in store.groups()}["TypeError"] == 1
    assert [d.key for d in store.selected(Select())] == ["k002", "k006", "k007", "k008", "z999"]


def test_a_second_redrive_of_the_same_selection_sends_nothing_acked_again(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    Redrive(store, Runner(), tmp_path / "r", select=Select(cause="ValueError")).run()
    runner = Runner()
    report = Redrive(store, runner, tmp_path / "r", select=Select(cause="ValueError")).run()
    assert (report.claimed, report.sent, runner.chunks) == (0, 0, [])


def test_killed_redrive_is_finished_by_the_next_with_each_letter_once(tmp_path: Path) -> None:
    """Chunks of 2 (rate 2/s, 1 s each); the runner dies on chunk 3: the next call runs chunk 3 again (same
    folder, so the pipeline resumes its checkpoint) and the rest, never chunks 1-2."""
    store = store_with(tmp_path)
    clock = FakeClock()
    first = Runner(crash_at=3)
    with pytest.raises(Crash):
        Redrive(
            store, first, tmp_path / "r", select=Select(), rate=2, chunk_seconds=1, clock=clock, sleep=clock.sleep
        ).run()
    assert [keys for keys, _ in first.chunks] == [["k000", "k001"], ["k002", "k003"], ["k004", "k005"]]
    assert {d.redrive_status for d in store.all()} == {"acked", "redriving"}
    (run,) = store.redrives()
    assert (run.status, run.chunk) == ("running", 2)

    second = Runner()
    report = Redrive(store, second, tmp_path / "r", select=Select(), rate=1000, clock=clock, sleep=clock.sleep).run()
    assert report.resumed and report.redrive_id == run.redrive_id
    assert second.chunks[0] == first.chunks[2]  # the killed chunk, in the same folder
    sent = [key for keys, _ in first.chunks[:2] + second.chunks for key in keys]
    assert sorted(sent) == sorted(d.key for d in store.all())  # each letter sent once (the killed chunk resumed)
    assert (report.acked, report.dead, report.claimed) == (10, 0, 10)
    assert store.redrives()[0].status == "done"


def test_an_unfinished_redrive_of_another_selection_must_be_finished_first(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    with pytest.raises(Crash):
        Redrive(store, Runner(crash_at=1), tmp_path / "r", select=Select(cause="KeyError")).run()
    with pytest.raises(RedriveUnfinished, match="KeyError"):
        Redrive(store, Runner(), tmp_path / "r", select=Select(cause="ValueError")).run()
    (run,) = store.redrives()
    assert store.abandon_redrive(run.redrive_id) == 3
    report = Redrive(store, Runner(), tmp_path / "r", select=Select(cause="ValueError")).run()
    assert report.acked == 6


def test_rate_paces_chunks_by_the_injected_clock(tmp_path: Path) -> None:
    """10 letters at 4/s in chunks of 2 s of letters (8): the second chunk starts 2 s after the first."""
    store = store_with(tmp_path)
    clock = FakeClock()
    runner = Runner()
    starts: list[float] = []

    def timed(chunk: RedriveChunk, folder: Path) -> dict[str, str | None]:
        starts.append(clock.now)
        return runner(chunk, folder)

    report = Redrive(store, timed, tmp_path / "r", rate=4, chunk_seconds=2, clock=clock, sleep=clock.sleep).run()
    assert [len(keys) for keys, _ in runner.chunks] == [8, 2]
    assert [s - 100.0 for s in starts] == [0.0, 2.0]
    assert report.sent == 10 and report.seconds == 2.0


def test_bad_arguments_get_clear_errors(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    with pytest.raises(ValueError, match="rate must be > 0"):
        Redrive(store, Runner(), tmp_path, rate=0)
    with pytest.raises(ValueError, match="redrive id"):
        Redrive(store, Runner(), tmp_path, redrive_id="../x")
    with pytest.raises(TypeError, match="Select"):
        Redrive(store, Runner(), tmp_path, select="ValueError")  # type: ignore[arg-type]


def test_a_store_made_before_redrives_gains_the_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE dead_letters (record_key TEXT PRIMARY KEY, record TEXT NOT NULL, reason TEXT NOT NULL,"
        " attempts INTEGER NOT NULL, created_at REAL NOT NULL) WITHOUT ROWID"
    )
    conn.execute("INSERT INTO dead_letters VALUES ('a', '1', 'FAILED', 3, 0)")
    conn.commit()
    conn.close()
    store = DeadLetterStore(path)
    (letter,) = store.all()
    assert (letter.key, letter.cause, letter.redrive_status) == ("a", None, None)
    assert [g.kind for g in store.groups()] == ["(no cause)"]


def chunk_of(keys: list[str], values: list[object]) -> RedriveChunk:
    import json

    return RedriveChunk(keys, [json.dumps(v) for v in values])


def test_payload_rows_are_keyed_by_the_column_holding_the_keys() -> None:
    from acker_spark.executor_read.redrive_source import payload_table

    table, column = payload_table(chunk_of(["a", "b"], [{"n": 1, "id": "a"}, {"n": 2, "id": "b"}]), None)
    assert column == "id" and table.column("n").to_pylist() == [1, 2]
    with pytest.raises(ValueError, match="key='n' does not hold the dead letters' keys"):
        payload_table(chunk_of(["a", "b"], [{"n": 1, "id": "a"}, {"n": 2, "id": "b"}]), "n")


def test_payload_rows_without_a_key_column_get_one() -> None:
    from acker_spark.executor_read.redrive_source import DEAD_LETTER_KEY, payload_table

    table, column = payload_table(chunk_of(["f.txt:3", "f.txt:9"], [{"value": "x"}, {"value": "y"}]), None)
    assert column == DEAD_LETTER_KEY and table.column(column).to_pylist() == ["f.txt:3", "f.txt:9"]


def test_values_that_are_not_rows_become_key_and_value() -> None:
    """Dead letters holding a plain value (as the removed GuaranteedPipeline wrote them) redrive as an in-memory source."""
    from acker_spark.executor_read.redrive_source import payload_table

    table, column = payload_table(chunk_of(["r1", "r2"], ["one line", "another"]), None)
    assert column == "key" and table.to_pylist() == [
        {"key": "r1", "value": "one line"},
        {"key": "r2", "value": "another"},
    ]


def test_rows_of_no_one_type_get_a_clear_error() -> None:
    from acker_spark.executor_read.redrive_source import payload_table

    with pytest.raises(TypeError, match="do not make one table"):
        payload_table(chunk_of(["a", "b"], [{"n": 1}, {"n": "x"}]), None)
