"""The round watch and the running round's tally, without Spark: checks, the cancel, and what the files say.

The failure budget of SourcePipeline is checked while a round's job runs, from
the files its tasks write (the emission log, the causes); these tests write
those files as the executors would and drive the watch by hand with an
injected clock.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from acker_client.testing import ManualClock
from acker_spark.budget import FailureBudget
from acker_spark.causes import CauseWriter
from acker_spark.executor_read.round_watch import RoundWatch
from acker_spark.replay_policy import ReplayPolicy
from acker_spark.tracking.book import ReplayBook
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.emission_log import EmissionWriter, RoundFilter
from acker_spark.tracking.identity import derive_roots

SALT = 7
POLICY = ReplayPolicy(max_attempts=2)
ALL = RoundFilter("all", np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint16))


def test_the_first_verdict_cancels_once_and_is_kept_with_its_time() -> None:
    clock = ManualClock()
    cancels: list[str] = []
    verdicts: list[str | None] = [None, "past the budget"]
    watch = RoundWatch([lambda: verdicts.pop(0)], lambda: cancels.append("cancel"), clock=clock)
    assert watch.tick() is None and not cancels
    clock.advance(0.3)
    assert watch.tick() == "past the budget" and watch.decided_at == clock()
    assert watch.tick() == "past the budget" and cancels == ["cancel"]  # checks stop; one cancel


def test_without_checks_no_thread_runs_and_nothing_is_cancelled() -> None:
    with RoundWatch([], lambda: (_ for _ in ()).throw(AssertionError("cancelled"))) as watch:
        pass
    assert watch.verdict is None


def write_round(
    checkpoint: Path, round_no: int, idents: np.ndarray, attempt: int, partition: int, task: int = 0
) -> np.ndarray:
    """What one task attempt of a round writes to the emission log; returns the roots it started."""
    attempts = np.full(len(idents), attempt, dtype=np.uint16)
    roots = derive_roots(SALT, idents, attempts)
    writer = EmissionWriter(checkpoint, round_no, partition, task)
    writer.write(roots, idents, attempts)
    writer.close()
    return roots


def test_the_tally_counts_reads_and_poison_failures_as_the_tasks_write_them(tmp_path: Path) -> None:
    """200 records read by two tasks (one re-run), 12 ValueErrors and 3 TimeoutErrors: 12 failed for good."""
    book = ReplayBook(Checkpoint(tmp_path / "cp"), SALT, POLICY, ManualClock())
    tally = book.round_tally(0, ALL)
    budget = FailureBudget()  # 5% from 100 read
    assert book.budget_counts(tally) == (0, 0) and book.budget_error(budget, tally) is None
    first = write_round(book.checkpoint.path, 0, np.arange(1, 101, dtype=np.uint64), 1, partition=0)
    write_round(book.checkpoint.path, 0, np.arange(1, 101, dtype=np.uint64), 1, partition=0, task=1)  # a re-run
    second = write_round(book.checkpoint.path, 0, np.arange(101, 201, dtype=np.uint64), 1, partition=1)
    causes = CauseWriter(book.checkpoint.path, "bolt-p0-t0")
    causes.write(
        {int(r): f"ValueError: bad amount in record {i} (at job.py:3 in parse)" for i, r in enumerate(first[:5])}
    )
    causes.write({int(r): "TimeoutError: pricing service (at job.py:9 in call)" for r in second[:3]})
    assert book.budget_counts(tally) == (5, 200) and book.budget_error(budget, tally) is None  # 5 of 200: within
    causes.write({int(r): "ValueError: bad amount (at job.py:3 in parse)" for r in second[10:17]})
    causes.close()
    error = book.budget_error(budget, tally)
    assert error is not None and (error.dead, error.read) == (12, 200)
    assert [(c.kind, c.count) for c in error.causes] == [("ValueError", 12)]  # timeouts are retried: not dead
    assert error.causes[0].example_cause.startswith("ValueError: bad amount in record 0")


def test_a_replay_round_counts_every_failure_on_a_last_attempt_and_no_first_reads(tmp_path: Path) -> None:
    book = ReplayBook(Checkpoint(tmp_path / "cp"), SALT, POLICY, ManualClock())
    idents = np.arange(1, 11, dtype=np.uint64)
    rows = RoundFilter("select", idents, np.full(10, 2, dtype=np.uint16))  # their last attempt (max_attempts=2)
    tally = book.round_tally(3, rows)
    roots = write_round(book.checkpoint.path, 3, idents, 2, partition=0)
    causes = CauseWriter(book.checkpoint.path, "bolt-p0-t1")
    causes.write({int(r): "TimeoutError: pricing service" for r in roots[:4]})
    causes.close()
    assert book.budget_counts(tally) == (4, 0)


def test_a_round_hangs_once_one_tree_failed_from_outside_and_none_started_or_ended_for_the_grace(
    tmp_path: Path,
) -> None:
    from acker_protocol.wire import Outcome
    from acker_spark.executor_read.hung_round import HungRound, HungRoundCheck

    clock = ManualClock()
    checkpoint = tmp_path / "cp"
    acked = np.full(9, int(Outcome.ACKED), dtype=np.int8)
    failed = np.full(1, int(Outcome.FAILED), dtype=np.int8)
    # Round 0: its last tree failed by the job's own bolt (a cause written): no hang.
    check = HungRoundCheck(checkpoint, 0, clock, grace=2.0)
    roots = write_round(checkpoint, 0, np.arange(1, 11, dtype=np.uint64), 1, partition=0)
    check.observe(roots[:9], acked)
    clock.advance(5.0)
    assert check() is None  # one tree still pending: the job is working on it
    causes = CauseWriter(checkpoint, "bolt-p0-t0")
    causes.write({int(roots[9]): "ValueError: bad"})
    causes.close()
    check.observe(roots[9:], failed)
    assert check() is None
    # Round 1: its last tree failed at the acker (no cause): the job runs on for nothing.
    check = HungRoundCheck(checkpoint, 1, clock, grace=2.0)
    roots = write_round(checkpoint, 1, np.arange(21, 31, dtype=np.uint64), 1, partition=0)
    check.observe(roots[:9], acked)
    check.observe(roots[9:], failed)
    assert check() is None  # it just saw the emission log: the grace starts now
    clock.advance(2.0)
    assert check() == HungRound(1, 10, 1)
    write_round(checkpoint, 1, np.arange(31, 33, dtype=np.uint64), 1, partition=1)  # a task still reads
    assert check() is None
    # Round 2: the hung task's record failed at the acker, the rows it read behind it still
    # pending (its bolts lease them): the round hangs all the same once nothing moves.
    check = HungRoundCheck(checkpoint, 2, clock, grace=2.0)
    roots = write_round(checkpoint, 2, np.arange(41, 51, dtype=np.uint64), 1, partition=0)
    assert check() is None  # the emission log seen: the grace starts now
    check.observe(roots[:5], acked[:5])
    check.observe(roots[5:6], failed)
    clock.advance(1.5)
    check.observe(roots[6:7], acked[:1])  # a tree still ends: the job is working
    clock.advance(1.5)
    assert check() is None
    # The hung task's keeper renews the leases of the rows it holds: alive, and it reaches the ackers.
    check.observe(roots[7:], np.full(3, int(Outcome.TIMEOUT_RESET), dtype=np.int8))
    clock.advance(0.5)
    assert check() == HungRound(2, 10, 1)


def test_a_quiet_round_whose_tasks_are_not_heard_from_waits_for_them_until_the_backstop(tmp_path: Path) -> None:
    """Executors cut from the ackers: quiet, trees pending, no renewal arrives; a cut, not a hang, until silent_after."""
    from acker_protocol.wire import Outcome
    from acker_spark.executor_read.hung_round import HungRound, HungRoundCheck

    clock = ManualClock()
    checkpoint = tmp_path / "cp"
    check = HungRoundCheck(checkpoint, 0, clock, grace=2.0, silent_after=10.0)
    roots = write_round(checkpoint, 0, np.arange(1, 11, dtype=np.uint64), 1, partition=0)
    assert check() is None
    check.observe(roots[:4], np.full(4, int(Outcome.ACKED), dtype=np.int8))
    check.observe(roots[4:5], np.full(1, int(Outcome.FAILED), dtype=np.int8))  # no cause: failed from outside
    clock.advance(5.0)
    assert check() is None  # five trees pending, none of their tasks heard from: waiting out a cut
    clock.advance(4.9)
    assert check() is None
    clock.advance(0.2)
    verdict = check()
    assert verdict == HungRound(0, 10, 1, silent=True)
    assert "longer than the message timeout" in str(verdict)
    # Without a bound (silent_after None) such a round is never cancelled for being quiet.
    patient = HungRoundCheck(checkpoint, 0, clock, grace=2.0)
    assert patient() is None  # it reads the emission log
    patient.observe(roots[4:5], np.full(1, int(Outcome.FAILED), dtype=np.int8))
    clock.advance(100.0)
    assert patient() is None


def test_a_round_renewed_on_some_shards_only_waits_for_the_others(tmp_path: Path) -> None:
    """One acker paused: renewals of its trees do not arrive while the others' do; not a hang until they all do."""
    from acker_protocol.wire import Outcome
    from acker_spark.executor_read.hung_round import HungRound, HungRoundCheck

    clock = ManualClock()
    checkpoint = tmp_path / "cp"
    check = HungRoundCheck(checkpoint, 0, clock, grace=2.0, silent_after=60.0, shard_count=2)
    roots = write_round(checkpoint, 0, np.arange(1, 11, dtype=np.uint64), 1, partition=0)
    assert check() is None
    check.observe(roots[:1], np.full(1, int(Outcome.FAILED), dtype=np.int8))  # failed from outside
    reset = int(Outcome.TIMEOUT_RESET)
    shard0 = roots[1:][roots[1:] % np.uint64(2) == 0]
    shard1 = roots[1:][roots[1:] % np.uint64(2) == 1]
    assert len(shard0) and len(shard1)
    clock.advance(3.0)
    check.observe(shard0, np.full(len(shard0), reset, dtype=np.int8))
    assert check() is None  # shard 1's pending trees are not heard from: its acker may be paused
    check.observe(shard1[:1], np.full(1, reset, dtype=np.int8))
    assert check() == HungRound(0, 10, 1)


def test_a_round_with_no_failed_tree_is_watched_without_reading_its_emission_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hung-round check reads the round's roots only once a tree failed and the round went quiet, and once."""
    from acker_protocol.wire import Outcome
    from acker_spark.executor_read import hung_round
    from acker_spark.executor_read.hung_round import HungRound, HungRoundCheck

    reads: list[int] = []
    real = hung_round.read_round

    def counted(checkpoint: Path, round_no: int) -> object:
        reads.append(round_no)
        return real(checkpoint, round_no)

    monkeypatch.setattr(hung_round, "read_round", counted)
    clock = ManualClock()
    checkpoint = tmp_path / "cp"
    check = HungRoundCheck(checkpoint, 0, clock, grace=2.0)
    roots = write_round(checkpoint, 0, np.arange(1, 11, dtype=np.uint64), 1, partition=0)
    assert check() is None
    check.observe(roots[:5], np.full(5, int(Outcome.ACKED), dtype=np.int8))
    more = write_round(checkpoint, 0, np.arange(11, 21, dtype=np.uint64), 1, partition=1)  # the log grows
    for _ in range(3):
        clock.advance(3.0)
        assert check() is None
    assert reads == []  # nothing failed: no read of the round's log, however long it runs or grows
    check.observe(more[:1], np.full(1, int(Outcome.FAILED), dtype=np.int8))  # failed from outside
    assert check() is None and reads == []  # not quiet for the grace yet
    clock.advance(2.0)
    alive = np.concatenate((roots[5:], more[1:]))  # the tasks holding the pending trees renew their leases
    check.observe(alive, np.full(len(alive), int(Outcome.TIMEOUT_RESET), dtype=np.int8))
    assert check() == HungRound(0, 20, 1)
    assert check() == HungRound(0, 20, 1)
    assert reads == [0]  # read once, when it mattered; not again while the log did not grow
