"""The executor-read drivers' shared parts without Spark: the replay book, the manifest, the tree start, the run report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from acker_client.testing import ManualClock
from acker_protocol.wire import Outcome
from acker_spark import AcksUndelivered, CommitErrors, DeadLetterStore, RunStats, SourceStats
from acker_spark.replay_policy import ReplayPolicy
from acker_spark.steps.frames import decode_ids
from acker_spark.tracking.book import ReplayBook
from acker_spark.tracking.checkpoint import Checkpoint, Manifest, SourceSection, StreamSection, WrongCheckpoint
from acker_spark.tracking.emission_log import Emissions, EmissionWriter, read_round
from acker_spark.tracking.identity import derive_roots, first_edges
from acker_spark.tracking.record_table import ACKED, DEAD, FAILED, PENDING, REPLAYED
from acker_spark.tracking.tree_start import start_trees

SALT = 7
POLICY = ReplayPolicy(max_attempts=2, backoff_base=1.0)


def emissions(idents: list[int], attempt: int = 1) -> Emissions:
    """A round's emission log as read_round gives it: sorted by root."""
    ids = np.array(idents, dtype=np.uint64)
    attempts = np.full(len(ids), attempt, dtype=np.uint16)
    roots = derive_roots(SALT, ids, attempts)
    order = np.argsort(roots)
    return Emissions(roots[order], ids[order], attempts[order], 0)


class Feed:
    """An outcome feed the test fills by hand (what OutcomeFeed journals)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[np.ndarray, np.ndarray]] = []
        self.recorded: list[tuple[np.ndarray, Outcome]] = []

    def push(self, roots: np.ndarray, outcome: Outcome) -> None:
        self.waiting.append((roots, np.full(len(roots), int(outcome), dtype=np.int8)))

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        roots = np.concatenate([r for r, _ in self.waiting] or [np.zeros(0, np.uint64)])
        outcomes = np.concatenate([o for _, o in self.waiting] or [np.zeros(0, np.int8)])
        self.waiting = []
        return roots, outcomes

    def record(self, roots: np.ndarray, outcome: Outcome) -> None:
        self.recorded.append((roots, outcome))


def open_book(tmp_path: Path, clock: ManualClock) -> tuple[ReplayBook, Feed]:
    book, feed = ReplayBook(Checkpoint(tmp_path / "checkpoint"), SALT, POLICY, clock), Feed()
    book.attach(feed)
    return book, feed


def test_a_failed_delivery_waits_its_backoff_then_its_replay_supersedes_it(tmp_path: Path) -> None:
    """FAILED is due after the policy's backoff; adding attempt 2 marks attempt 1 REPLAYED."""
    clock = ManualClock()
    book, feed = open_book(tmp_path, clock)
    first = emissions([1, 2])
    book.add_round(first, 0)
    feed.push(derive_roots(SALT, np.array([1], np.uint64), np.ones(1, np.uint16)), Outcome.FAILED)
    feed.push(derive_roots(SALT, np.array([2], np.uint64), np.ones(1, np.uint16)), Outcome.ACKED)
    book.settle_feed()
    assert not len(book.due_replays()) and book.busy()
    assert book.wait_time(5.0) == pytest.approx(1.0)  # the backoff, not the limit
    clock.advance(1.0)
    (due,) = book.due_replays()
    assert book.table.idents[due] == 1 and book.table.state[due] == FAILED
    book.add_round(emissions([1], attempt=2), 1)
    table = book.table
    states = {(i, a): s for i, a, s in zip(table.idents.tolist(), table.attempts.tolist(), table.state.tolist())}
    assert states == {(1, 1): REPLAYED, (2, 1): ACKED, (1, 2): PENDING}
    assert not len(book.due_replays())


def test_an_outcome_before_its_round_is_read_waits_for_it_as_a_stray(tmp_path: Path) -> None:
    """An outcome whose root is not in the table yet is matched when the round is added (not lost)."""
    book, feed = open_book(tmp_path, ManualClock())
    round_one = emissions([5])
    feed.push(round_one.roots, Outcome.ACKED)
    book.settle_feed()
    book.add_round(round_one, 0)
    assert book.table.state.tolist() == [ACKED]


def test_late_rounds_expire_as_lost_and_the_last_attempt_is_dead_lettered_once(tmp_path: Path) -> None:
    """Pending trees past the backstop are journaled LOST; after max_attempts the dead letter is written and final."""
    clock = ManualClock()
    book, feed = open_book(tmp_path, clock)
    book.add_round(emissions([9], attempt=2), 3)
    book.start_deadline(3, 10.0)
    clock.advance(9.0)
    book.expire()
    assert not feed.recorded
    clock.advance(1.0)
    book.expire()
    ((roots, outcome),) = feed.recorded
    assert outcome is Outcome.LOST and roots.tolist() == book.table.roots.tolist()
    store = DeadLetterStore(tmp_path / "dead.sqlite")
    letters = lambda dead: [("k9", "payload", Outcome(int(reason)), 2) for reason in dead.reasons]  # noqa: E731
    book.write_dead_letters(store, letters)
    book.write_dead_letters(store, letters)  # final: not written twice
    assert [(d.key, d.reason) for d in store.all()] == [("k9", Outcome.LOST)]
    assert book.table.state.tolist() == [DEAD] and not book.busy()
    assert book.checkpoint.read_dead().tolist() == [9]


def test_restore_rebuilds_the_book_from_the_checkpoint(tmp_path: Path) -> None:
    """A new book over the same checkpoint: outcomes, dead letters and undelivered roots as the first one left them."""
    clock = ManualClock()
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    writer = EmissionWriter(checkpoint.path, 0, 0, 0)
    ids, attempts = np.array([1, 2, 3], np.uint64), np.full(3, 2, np.uint16)
    roots = derive_roots(SALT, ids, attempts)
    writer.write(roots, ids, attempts)
    writer.close()
    journal = checkpoint.outcome_journal()
    journal.append(roots, np.array([int(Outcome.ACKED), int(Outcome.TIMED_OUT), int(Outcome.TIMED_OUT)], np.int8))
    journal.close()
    checkpoint.add_undelivered(roots[1:2])
    book = ReplayBook(checkpoint, SALT, POLICY, clock)
    book.restore([0])
    reason = dict(zip(book.table.idents.tolist(), book.table.reason.tolist()))
    assert reason == {1: int(Outcome.ACKED), 2: int(Outcome.ACKS_UNDELIVERED), 3: int(Outcome.TIMED_OUT)}
    stats = RunStats()
    book.fill_stats(stats)
    assert (stats.acked, stats.acks_undelivered, stats.timed_out, stats.awaiting_replay) == (1, 1, 1, 2)
    assert (stats.emitted, stats.replayed, stats.attempts) == (0, 3, 3)


def test_a_checkpoint_of_the_other_driver_is_refused(tmp_path: Path) -> None:
    """The manifest names its driver: a SourcePipeline refuses a stream's checkpoint and the other way round."""
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    assert checkpoint.manifest("source") is None
    checkpoint.save_manifest(Manifest("stream", "acker-stream-1", 42, stream=StreamSection("/in")))
    with pytest.raises(WrongCheckpoint, match="belongs to an acker_spout stream, not a SourcePipeline"):
        checkpoint.manifest("source")
    assert checkpoint.manifest("stream") == Manifest("stream", "acker-stream-1", 42, stream=StreamSection("/in"))
    other = Checkpoint(tmp_path / "other")
    source = Manifest("source", "acker-source-1", 43, source=SourceSection({"kind": "key"}, next_round=2))
    other.save_manifest(source)
    assert other.manifest("source") == source
    with pytest.raises(WrongCheckpoint, match="not an acker_spout stream"):
        other.manifest("stream")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "pipeline.json").write_text(json.dumps({"version": 1}))
    with pytest.raises(WrongCheckpoint, match="older format"):
        Checkpoint(tmp_path / "old").manifest("source")


class InitRecorder:
    """A client that records the inits sent to it."""

    def __init__(self) -> None:
        self.inits: list[tuple[list[int], list[int], str]] = []

    def init_columns(self, roots: np.ndarray, edges: np.ndarray, spout: str) -> None:
        self.inits.append((roots.tolist(), edges.tolist(), spout))


def test_start_trees_logs_then_inits_the_derived_roots_and_anchors_each_row(tmp_path: Path) -> None:
    """Roots from (salt, identity, attempt), in the emission log and the inits alike; each row names its tree."""
    idents, attempts = np.array([4, 5, 6], np.uint64), np.array([1, 1, 3], np.uint16)
    writer, client = EmissionWriter(tmp_path, 2, 0, 0), InitRecorder()
    started = start_trees(SALT, idents, attempts, log=writer, client=client, spout="s")
    writer.close()
    roots = derive_roots(SALT, idents, attempts)
    assert started.roots.tolist() == roots.tolist() and started.edges.tolist() == first_edges(roots).tolist()
    assert client.inits == [(roots.tolist(), first_edges(roots).tolist(), "s")]
    assert sorted(read_round(tmp_path, 2).roots.tolist()) == sorted(roots.tolist())
    assert [tuple(m.roots) for m in decode_ids(started.ids).message_ids()] == [(int(r),) for r in roots]
    untracked = start_trees(SALT, idents, attempts, log=None, client=None, spout="s")
    assert all(not m.roots for m in decode_ids(untracked.ids).message_ids())


def test_one_run_report_for_every_driver() -> None:
    """SourceStats is the one RunStats; rounds reads its jobs; commit errors are summed in its dict."""
    assert SourceStats is RunStats
    stats = RunStats(jobs=3, acks_undelivered=2, commit_errors={"store": 2, "split": 1})
    assert stats.rounds == 3
    data = stats.as_dict()
    assert data["commit_errors"] == 3 and data["jobs"] == 3
    error = AcksUndelivered(stats, {"store": CommitErrors("store", 2, frozenset(), ("shard 0: down",))})
    assert error.stats is stats and "2 deliveries failed" in str(error) and "shard 0: down" in str(error)


def test_a_restored_dead_record_counts_once_whatever_its_deliveries(tmp_path: Path) -> None:
    """Restoring a record dead after 2 failed deliveries: its first delivery is REPLAYED, only the last is DEAD."""
    clock = ManualClock()
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    ids = np.array([4], np.uint64)
    for round_no, attempt in ((0, 1), (1, 2)):
        writer = EmissionWriter(checkpoint.path, round_no, 0, 0)
        writer.write(derive_roots(SALT, ids, np.full(1, attempt, np.uint16)), ids, np.full(1, attempt, np.uint16))
        writer.close()
        journal = checkpoint.outcome_journal()
        journal.append(
            derive_roots(SALT, ids, np.full(1, attempt, np.uint16)), np.full(1, int(Outcome.FAILED), np.int8)
        )
        journal.close()
    dead = checkpoint.dead_journal()
    dead.append(ids)
    dead.close()
    book = ReplayBook(checkpoint, SALT, POLICY, clock)
    book.restore([0, 1])
    stats = RunStats()
    book.fill_stats(stats)
    assert sorted(book.table.state.tolist()) == sorted([REPLAYED, DEAD]) and stats.dead_lettered == 1
