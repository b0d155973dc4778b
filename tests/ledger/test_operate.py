"""Operating a ledger (issue 21), on both engines: progress timeouts, the lifetime cap, inspect, force-fail."""

from __future__ import annotations

import pytest
from acker_protocol.wire import OpKind, Outcome

from acker_service.batch import Batch
from acker_service.tree_info import TreeStatus

INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


def ends(resolutions) -> list[tuple[int, Outcome]]:
    """(root, outcome) of resolutions, sorted."""
    return sorted((r.root, r.outcome) for r in resolutions)


def test_progress_mode_restarts_the_timeout_on_every_applied_ack(ledger_cls, clock):
    """Fixed mode times the tree out from its init; progress mode from its last ack."""
    fixed = ledger_cls(4.0, clock=clock)
    progress = ledger_cls(4.0, clock=clock, timeout_mode="progress", max_tree_lifetime=100.0)
    for ledger in (fixed, progress):
        ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    for _ in range(5):  # acks every 3 s: each one inside the 4 s timeout of the previous
        clock.advance(3.0)
        for ledger in (fixed, progress):
            ledger.apply_batch(Batch.of([ACK], [7], [0]))
    assert [r.outcome for r in fixed.advance()] == [] and fixed.pending_trees == 0
    assert fixed.stats.timed_out == 1, "fixed mode: the tree timed out while acks kept coming"
    assert progress.pending_trees == 1 and progress.stats.timed_out == 0
    clock.advance(7.0)
    assert [r.outcome for r in progress.advance()] == [Outcome.TIMED_OUT], "no progress: it times out"


def test_a_deduplicated_ack_is_not_progress(ledger_cls, clock):
    """Only an applied ack restarts the timeout: a repeated keyed ack (a Spark re-run) does not."""
    ledger = ledger_cls(4.0, clock=clock, timeout_mode="progress", max_tree_lifetime=100.0)
    ledger.apply_batch(Batch.of([INIT, ACK], [7, 7], [3, 1], dedup_keys=[0, 9], spouts=["s"]))
    clock.advance(3.0)
    assert ledger.apply_batch(Batch.of([ACK], [7], [1], dedup_keys=[9])).deduplicated == 1
    clock.advance(3.1)
    assert [r.outcome for r in ledger.advance()] == [Outcome.TIMED_OUT]


@pytest.mark.parametrize("mode", ["fixed", "progress"])
def test_no_tree_outlives_the_cap(ledger_cls, clock, mode):
    """Kept alive by resets (fixed) or acks (progress), a tree still ends at the cap, with its own outcome."""
    ledger = ledger_cls(4.0, clock=clock, timeout_mode=mode, max_tree_lifetime=10.0)
    ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    keep_alive = Batch.of([RESET], [7], [0]) if mode == "fixed" else Batch.of([ACK], [7], [0])
    ended, waited = [], 0.0
    while not ended and waited < 30:
        clock.advance(1.0)
        waited += 1.0
        ended = ledger.apply_batch(keep_alive).resolutions + ledger.advance()
    assert [(r.root, r.outcome) for r in ended] == [(7, Outcome.LIFETIME_EXCEEDED)]
    assert 10.0 <= waited <= 10.0 + ledger.rotation_period, "within one rotation period after the cap"
    assert (ledger.stats.timed_out, ledger.stats.outlived, ledger.pending_trees) == (1, 1, 0)


def test_a_timeout_collected_after_a_later_rotation_keeps_its_outcome(ledger_cls, clock):
    """Sliced expiry changes no outcome: a tree due under the cap ends TIMED_OUT even if collected past it."""
    ledger = ledger_cls(2.0, clock=clock, max_tree_lifetime=3.5)  # a rotation each second
    ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    clock.advance(3.0)  # due now, at age 3 s: under the cap
    assert ledger.advance_some(0) == ([], True)
    clock.advance(1.0)  # collected after the next rotation, at age 4 s: over the cap
    assert ends(ledger.advance()) == [(7, Outcome.TIMED_OUT)]
    assert (ledger.stats.timed_out, ledger.stats.outlived) == (1, 0)


def test_inspect_reports_every_field(ledger_cls, clock):
    """Status, spout, age, failed flag, resets and dedup keys of each root; absent roots say so."""
    ledger = ledger_cls(30.0, clock=clock)
    ledger.apply_batch(
        Batch.of(
            [INIT, ACK, ACK, RESET, RESET, FAIL, ACK],
            [7, 7, 7, 7, 7, 7, 9],
            [3, 1, 8, 0, 0, 0, 5],
            dedup_keys=[0, 11, 12, 0, 0, 0, 0],
            spouts=["orders"],
        )
    )
    assert ledger.pending_trees == 0, "the fail ended tree 7"
    ledger.apply_batch(Batch.of([INIT, ACK, RESET], [5, 5, 5], [3, 1, 0], dedup_keys=[0, 4, 0], spouts=["orders"]))
    clock.advance(2.5)
    tree, orphan, absent = ledger.inspect([5, 9, 7])
    assert tree.status is TreeStatus.PENDING and tree.spout == "orders"
    assert (tree.age_seconds, tree.failed, tree.resets, tree.dedup_keys) == (2.5, False, 1, 1)
    assert orphan.status is TreeStatus.AWAITING_INIT and orphan.spout is None
    assert absent.status is TreeStatus.ABSENT


def test_inspect_shows_a_due_tree_as_expiring(ledger_cls, clock):
    """A tree a rotation made due, not yet collected, is EXPIRING: the next slice ends it."""
    ledger = ledger_cls(2.0, clock=clock)
    ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    clock.advance(3.1)
    ledger.advance_some(0)
    assert ledger.inspect([7])[0].status is TreeStatus.EXPIRING
    assert ledger.oldest(5) == [], "a due tree is no longer pending"


def test_oldest_lists_pending_trees_oldest_first(ledger_cls, clock):
    """The k oldest by time since init, ties by root; orphans are not trees."""
    ledger = ledger_cls(30.0, clock=clock)
    for root in (50, 60):
        ledger.apply_batch(Batch.of([INIT], [root], [1], spouts=["s"]))
        clock.advance(1.0)
    ledger.apply_batch(Batch.of([INIT, INIT, ACK], [70, 40, 99], [1, 1, 1], spouts=["s"]))
    clock.advance(1.0)
    assert [i.root for i in ledger.oldest(3)] == [50, 60, 40]
    assert [i.age_seconds for i in ledger.oldest(10)] == [3.0, 2.0, 1.0, 1.0]
    assert ledger.oldest(0) == []


def test_age_histogram_counts_pending_trees(ledger_cls, clock):
    """Counts per bucket (ages <= bound), then above every bound, and the sum of ages."""
    ledger = ledger_cls(30.0, clock=clock)
    for root in (1, 2, 3):
        ledger.apply_batch(Batch.of([INIT], [root], [1], spouts=["s"]))
        clock.advance(2.0)
    assert ledger.age_histogram([2.0, 4.0]) == ([1, 1, 1], 12.0)


def test_force_fail_ends_pending_trees_failed_and_leaves_the_rest(ledger_cls, clock):
    """Named pending trees end FAILED now; absent roots and roots awaiting their init are untouched."""
    ledger = ledger_cls(30.0, clock=clock)
    ledger.apply_batch(Batch.of([INIT, INIT, ACK], [1, 2, 3], [5, 5, 5], spouts=["s"]))
    clock.advance(1.5)
    ended = ledger.force_fail([1, 3, 4, 1])
    assert ends(ended) == [(1, Outcome.FAILED)]
    assert [r.latency_seconds for r in ended] == [1.5]
    assert (ledger.pending_trees, ledger.orphan_entries) == (1, 1)
    stats = ledger.stats
    assert (stats.failed, stats.force_failed, stats.inits) == (1, 1, 2)


def test_force_fail_of_a_due_tree_reports_its_timeout(ledger_cls, clock):
    """A tree whose timeout already passed ends TIMED_OUT (its one outcome), not FAILED."""
    ledger = ledger_cls(2.0, clock=clock)
    ledger.apply_batch(Batch.of([INIT], [7], [3], spouts=["s"]))
    clock.advance(3.1)
    assert ends(ledger.force_fail([7])) == [(7, Outcome.TIMED_OUT)]
    assert ledger.pending_trees == 0 and ledger.advance() == []


def test_force_fail_spout_ends_only_that_spouts_trees(ledger_cls, clock):
    """Every pending tree of the spout, none of another's; an unknown spout fails nothing."""
    ledger = ledger_cls(30.0, clock=clock)
    roots = list(range(1, 2001))
    ledger.apply_batch(
        Batch.of([INIT] * 2000, roots, [1] * 2000, spouts=["a", "b"], spout_index=[r % 2 for r in roots])
    )
    ended = ledger.force_fail_spout("b")
    assert ends(ended) == [(r, Outcome.FAILED) for r in roots if r % 2]
    assert ledger.pending_trees == 1000
    assert len(ledger.force_fail_spout("nobody")) == 0
    assert sorted(ledger.pending_roots()) == [r for r in roots if r % 2 == 0]


@pytest.mark.parametrize(
    ("mode", "cap", "message"),
    [("sometimes", 0.0, "timeout_mode must be one of"), ("fixed", -1.0, "zero"), ("fixed", 1e9, "below")],
)
def test_bad_timeout_rules_are_refused(ledger_cls, mode, cap, message):
    """Unknown modes, negative and out-of-range caps are refused at construction."""
    with pytest.raises(ValueError, match=message):
        ledger_cls(30.0, clock=lambda: 0.0, timeout_mode=mode, max_tree_lifetime=cap)
