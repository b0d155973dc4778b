"""Expiry in bounded slices: ``advance_some(max_expired)`` against the acker-semantics spec.

A rotation detaches its expired bucket at once (the expiry window is unchanged);
the entries are collected at most ``max_expired`` at a time, and an operation on
a tree that is due but not collected yet expires it first: exactly one outcome.
Every test runs against both engines (``ledger_cls`` in conftest).
"""

from __future__ import annotations

import pytest
from acker_protocol.wire import OpKind, Outcome

from acker_service.batch import Batch

SPOUT = "spout-a"
T = 6.0


def _inits(roots: list[int]) -> Batch:
    return Batch.of([int(OpKind.INIT)] * len(roots), roots, [0xABCD] * len(roots), spouts=[SPOUT])


def _start(ledger_cls, clock, n: int):
    ledger = ledger_cls(message_timeout=T, buckets=3, clock=clock)
    roots = list(range(1, n + 1))
    assert ledger.apply_batch(_inits(roots)).resolutions == []
    clock.advance(T + ledger.rotation_period)  # every tree is due now
    return ledger, roots


def test_slices_are_bounded_and_collect_every_tree_once(ledger_cls, clock):
    ledger, roots = _start(ledger_cls, clock, 1000)
    seen: list[int] = []
    more = True
    slices = 0
    while more:
        resolutions, more = ledger.advance_some(64)
        assert len(resolutions) <= 64
        assert {r.outcome for r in resolutions} <= {Outcome.TIMED_OUT}
        seen += [r.root for r in resolutions]
        slices += 1
        assert ledger.pending_trees == len(roots) - len(seen)
    assert sorted(seen) == roots, "every tree times out exactly once"
    assert slices >= 1000 // 64
    assert ledger.pending_trees == 0 and ledger.stats.timed_out == 1000
    assert ledger.advance_some(64) == ([], False)


def test_nothing_due_means_nothing_more(ledger_cls, clock):
    ledger = ledger_cls(message_timeout=T, buckets=3, clock=clock)
    ledger.apply_batch(_inits([1, 2, 3]))
    assert ledger.advance_some(1) == ([], False)
    assert ledger.pending_trees == 3


def test_a_zero_slice_detaches_but_collects_nothing(ledger_cls, clock):
    ledger, roots = _start(ledger_cls, clock, 10)
    resolutions, more = ledger.advance_some(0)
    assert resolutions == [] and more
    assert ledger.pending_trees == 10, "a detached tree is pending until collected"
    clock.advance(100 * T)  # later rotations do not lose the detached trees
    assert sorted(r.root for r in ledger.advance()) == roots


@pytest.mark.parametrize("kind", [OpKind.ACK, OpKind.FAIL, OpKind.RESET_TIMEOUT, OpKind.INIT])
def test_operation_on_a_due_uncollected_tree_expires_it_first(ledger_cls, clock, kind):
    ledger, roots = _start(ledger_cls, clock, 100)
    ledger.advance_some(0)  # detached, none collected
    root = roots[50]
    # The ack would complete the tree (0xABCD ^ 0xABCD == 0) if it had not expired.
    value = 0xABCD if kind in (OpKind.ACK, OpKind.INIT) else 0
    result = ledger.apply_batch(Batch.of([int(kind)], [root], [value], spouts=[SPOUT]), max_expired=0)
    assert [(r.root, r.outcome) for r in result.resolutions] == [(root, Outcome.TIMED_OUT)]
    rest: list[int] = []
    more = True
    while more:
        resolutions, more = ledger.advance_some(7)
        rest += [r.root for r in resolutions]
    assert root not in rest, "a tree got two outcomes"
    assert sorted(rest + [root]) == roots
    if kind == OpKind.INIT:
        assert ledger.pending_trees == 1, "an init after expiry starts a new tree"
    else:
        assert ledger.pending_trees == 0


def test_apply_collects_at_most_its_slice(ledger_cls, clock):
    ledger, roots = _start(ledger_cls, clock, 500)
    result = ledger.apply_batch(_inits([10_001]), max_expired=100)
    assert len(result.resolutions) == 100
    assert ledger.pending_trees == 401
    assert len(ledger.advance()) == 400
    assert ledger.pending_trees == 1


def test_orphans_in_a_detached_bucket_are_counted_not_reported(ledger_cls, clock):
    ledger = ledger_cls(message_timeout=T, buckets=3, clock=clock)
    ledger.apply_batch(Batch.of([int(OpKind.ACK)] * 5, [1, 2, 3, 4, 5], [9] * 5, spouts=[SPOUT]))
    clock.advance(T + ledger.rotation_period)
    collected: list = []
    more = True
    while more:
        resolutions, more = ledger.advance_some(2)
        collected += resolutions
    assert collected == [] and ledger.stats.orphaned == 5 and ledger.orphan_entries == 0


@pytest.mark.parametrize("b", [2, 3, 5])
def test_sliced_expiry_keeps_the_window(ledger_cls, clock, b):
    """A tree put at t expires inside [t + T, t + T + T/(b-1)] however small the slices are."""
    ledger = ledger_cls(message_timeout=T, buckets=b, clock=clock)
    step = T / (b - 1) / 8
    put_at = clock()
    ledger.apply_batch(_inits([42]))
    expired_at = None
    while expired_at is None:
        clock.advance(step)
        resolutions, _ = ledger.advance_some(1)
        if resolutions:
            expired_at = clock()
    assert put_at + T <= expired_at <= put_at + T + T / (b - 1) + step
