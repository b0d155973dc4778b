"""Moving entries between ledgers (issue 29): a stream of updates split at any cut between two ledgers ends as in one.

The old owner applies every message before the cut; at the cut the layout
becomes two shards, the old owner exports the roots it no longer owns and the
new owner imports them before it applies anything; after the cut each message
goes to the owner of its root. Every outcome (with its latency) and every
counter must match a single ledger that saw the whole stream, for either
engine on either side, so the handoff columns mean the same to both.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from acker_client.testing import ManualClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acker_service.batch import Batch
from acker_service.handoff import MovedEntries
from acker_service.native_ledger import NativeLedger
from acker_service.reference_ledger import ReferenceLedger

from .driver import ENGINES, Driver
from .test_differential import ACK, INIT, Workload, comparable, to_batch, traffic, workloads

PAIRS = [(a, b) for a in ENGINES for b in ENGINES]
SPLIT = {"reference": ReferenceLedger, "native": NativeLedger}


def _summed(*drivers: Driver) -> dict[str, int]:
    keys = ("inits", "acked", "failed", "timed_out", "orphaned", "deduplicated", "duplicate_inits", "outlived")
    return {k: sum(getattr(d.stats, k) for d in drivers) for k in keys}


@pytest.mark.parametrize(("old_engine", "new_engine"), PAIRS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads, cut=st.floats(0.0, 1.0))
def test_a_split_stream_ends_as_one(old_engine, new_engine, w: Workload, cut: float):
    """Same outcomes, latencies and counters as one ledger, whatever the cut and the engines on each side."""
    clock = ManualClock()
    rules = {"timeout_mode": w.mode, "max_tree_lifetime": w.cap * w.timeout}
    one = Driver(ReferenceLedger(w.timeout, w.buckets, clock, **rules))
    old = Driver(SPLIT[old_engine](w.timeout, w.buckets, clock, **rules))
    new = Driver(SPLIT[new_engine](w.timeout, w.buckets, clock, **rules))
    rng = random.Random(w.seed ^ 0xC07)
    msgs = traffic(w, 40)
    cut_at = int(len(msgs) * cut)
    period = w.timeout / (w.buckets - 1)
    expected, got = [], []
    lo, moved = 0, False
    while lo < len(msgs) or not moved:
        if lo >= cut_at and not moved:
            exported = old.ledger.export_moving(2, 0)
            assert all(int(r) % 2 == 1 for r in exported.roots), "only the roots the old owner gives up move"
            got.extend(new.ledger.import_entries(exported).resolutions())
            moved = True
            continue
        hi = min(len(msgs), cut_at if lo < cut_at else len(msgs), lo + 1 + int(rng.expovariate(1 / w.batch_mean)))
        clock.advance(rng.random() * w.dt_scale * period)
        # Collect what is due everywhere first (the server's ticker does): a due tree then ends at the same time in each.
        expected.extend(one.advance())
        got.extend(old.advance() + new.advance())
        part = msgs[lo:hi]
        expected.extend(one.apply_batch(to_batch(part, w.spouts)).resolutions)
        if not moved:
            got.extend(old.apply_batch(to_batch(part, w.spouts)).resolutions)
        else:
            for owner, shard in ((old, 0), (new, 1)):
                mine = [m for m in part if m[1] % 2 == shard]
                if mine:
                    got.extend(owner.apply_batch(to_batch(mine, w.spouts)).resolutions)
        lo = hi
    clock.advance(w.timeout + period + 1e-9)
    expected.extend(one.advance())
    got.extend(old.advance() + new.advance())
    a, b = comparable(expected), comparable(got)
    assert [x[:3] for x in a] == [x[:3] for x in b], "outcomes differ from one ledger's"
    assert all(abs(x[3] - y[3]) <= 1 for x, y in zip(a, b)), "latencies differ from one ledger's"
    assert _summed(one) == _summed(old, new)
    assert old.stats.moved_out == new.stats.moved_in
    for d in (old, new):
        s = d.stats
        assert s.inits + s.moved_in == s.acked + s.failed + s.timed_out + d.pending_trees + s.moved_out, "conservation"


@pytest.mark.parametrize(("old_engine", "new_engine"), PAIRS)
def test_disjoint_halves_of_a_tree_merge_by_xor(old_engine, new_engine):
    """Each side holds part of a tree's updates (the init on one, acks on both): the merge ends it ACKED, once."""
    clock = ManualClock()
    old = Driver(SPLIT[old_engine](30.0, 3, clock))
    new = Driver(SPLIT[new_engine](30.0, 3, clock))
    root, a, b = 7, 0x0F, 0xF0
    old.apply_batch(Batch.of([INIT, ACK], [root, root], [a ^ b, a], dedup_keys=[0, 11], spouts=["s"]))
    clock.advance(1.5)
    new.apply_batch(Batch.of([ACK], [root], [b], dedup_keys=[12], spouts=["s"]))
    assert new.orphan_entries == 1
    moved = old.ledger.export_moving(1, -1)
    assert moved.rows() == [(root, b, "s", 1_500_000, 0, False, 0, (11,))]
    ended = new.ledger.import_entries(moved).resolutions()
    assert [(r.root, r.outcome.name, round(r.latency_seconds, 6)) for r in ended] == [(root, "ACKED", 1.5)]
    assert (new.pending_trees, new.orphan_entries, old.pending_trees) == (0, 0, 0)


@pytest.mark.parametrize(("old_engine", "new_engine"), PAIRS)
def test_moved_entry_keeps_keys_failure_resets_and_timeout_place(old_engine, new_engine):
    """Dedup keys still drop a re-sent batch at the new owner; failed, resets and the timeout window travel too."""
    clock = ManualClock()
    old = Driver(SPLIT[old_engine](4.0, 3, clock))
    new = Driver(SPLIT[new_engine](4.0, 3, clock))
    old.apply_batch(Batch.of([INIT, ACK, ACK], [5, 5, 5], [7, 1, 2], dedup_keys=[0, 21, 22], spouts=["s"]))
    old.apply_batch(Batch.of([4], [5], [0], spouts=["s"]))  # one RESET_TIMEOUT
    clock.advance(2.0)  # one rotation: the entry is one generation old
    moved = old.ledger.export_moving(3, 0)
    assert moved.rows() == [(5, 4, "s", 2_000_000, 1, False, 1, (21, 22))]
    new.ledger.import_entries(moved)
    again = new.apply_batch(Batch.of([ACK], [5], [2], dedup_keys=[22], spouts=["s"]))
    assert again.deduplicated == 1
    assert new.inspect([5])[0].resets == 1
    clock.advance(2.0)  # a second rotation: still inside the window at the old owner's pace
    assert new.advance() == []
    clock.advance(2.0)  # the third: due, as it would have been at the old owner
    assert [r.outcome.name for r in new.advance()] == ["TIMED_OUT"]


def test_bad_moved_columns_are_refused_with_a_reason():
    """Columns that disagree are refused when made, not half imported."""
    with pytest.raises(ValueError, match="one per root"):
        MovedEntries(np.array([1, 2], np.uint64), np.array([1], np.uint64))
    with pytest.raises(ValueError, match="spout index"):
        MovedEntries([1], [1], [], [0], [0], [0], [False], [0], [0], [])
    with pytest.raises(ValueError, match="root id 0"):
        MovedEntries([0], [1], [], [-1], [0], [0], [False], [0], [0], [])


def test_concat_and_select_keep_each_entry_whole():
    """Splitting one export between owners and joining exports keep keys and spout names with their entries."""
    a = MovedEntries([3, 4], [1, 2], ["x"], [0, -1], [5, 6], [0, 1], [True, False], [0, 2], [2, 1], [9, 8, 7])
    b = MovedEntries([10], [3], ["y"], [0], [1], [0], [False], [0], [0], [])
    both = MovedEntries.concat([a, b])
    assert both.rows() == sorted(a.rows() + b.rows())
    odd = both.select(both.roots % 2 == 1)
    assert odd.rows() == [(3, 1, "x", 5, 0, True, 0, (8, 9))]


@pytest.mark.parametrize(("old_engine", "new_engine"), PAIRS)
def test_a_fail_that_overtook_its_init_moves_with_the_orphan(old_engine, new_engine):
    """A FAIL before the init leaves an entry without a spout; moved, its init at the new owner ends the tree FAILED."""
    clock = ManualClock()
    old = Driver(SPLIT[old_engine](30.0, 3, clock))
    new = Driver(SPLIT[new_engine](30.0, 3, clock))
    old.apply_batch(Batch.of([3], [9], [0], spouts=["s"]))
    moved = old.ledger.export_moving(2, 0)
    assert moved.rows() == [(9, 0, None, 0, 0, True, 0, ())]
    assert new.ledger.import_entries(moved).resolutions() == []
    ended = new.apply_batch(Batch.of([INIT], [9], [5], spouts=["s"])).resolutions
    assert [(r.root, r.outcome.name) for r in ended] == [(9, "FAILED")]
