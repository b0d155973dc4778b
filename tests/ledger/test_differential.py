"""Differential test: the native ledger agrees with the reference model after every batch.

Hypothesis draws a workload (how many spouts, timeout and buckets, how often
messages are duplicated, keyed, lost, late, reset, and how the clock moves);
a seeded generator turns it into tree-shaped XOR traffic plus noise, shuffled
and cut into batches. Both ledgers get the same batches at the same clock
times, with extra ``advance()`` calls and clock jumps in between. Every outcome,
every counter, ``pending_trees``, ``orphan_entries`` and the set of entries must
agree after every step. ``ACKER_PROPERTY_TREES`` sets how many trees the
property covers in total (default 1000; the issue's on-demand size is 20000).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from dataclasses import dataclass

import pytest
from acker_client.testing import ManualClock
from acker_protocol.wire import OpKind
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from acker_service.batch import Batch
from acker_service.native_ledger import NativeLedger
from acker_service.reference_ledger import ReferenceLedger

from .driver import Driver

TREES = int(os.environ.get("ACKER_PROPERTY_TREES", "1000"))
EXAMPLES = min(40, max(10, TREES // 20))
FOREST = math.ceil(TREES / EXAMPLES)
INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


@dataclass(frozen=True)
class Workload:
    """What the traffic looks like (drawn by hypothesis; the details come from ``seed``)."""

    seed: int
    spouts: int
    timeout: float
    buckets: int
    duplicate: float  # chance a message is sent twice (a Spark re-run)
    keyed: float  # chance a tree's acks carry dedup keys
    lose: float  # chance a message is lost (the tree then times out, or an orphan stays)
    fail: float  # chance a tree has a failed tuple
    reset: float  # chance of a reset_timeout per tree
    late: float  # share of extra copies of old messages sent after everything
    noise: float  # share of messages for roots that never had an init
    batch_mean: int
    dt_scale: float  # clock step between batches, in rotation periods
    jump: float  # chance a step is a jump past the whole window
    mode: str  # timeout mode: fixed, or progress (every applied ack restarts the timeout)
    cap: float  # lifetime cap in timeouts (0: none)
    force: float  # chance per step of a force-fail of some roots (or, rarely, of a spout)


workloads = st.builds(
    Workload,
    seed=st.integers(0, 2**64 - 1),
    spouts=st.integers(1, 3),
    timeout=st.sampled_from([0.5, 3.0, 30.0]),
    buckets=st.integers(2, 6),
    duplicate=st.sampled_from([0.0, 0.05, 0.3]),
    keyed=st.sampled_from([0.0, 0.5, 1.0]),
    lose=st.sampled_from([0.0, 0.02, 0.2]),
    fail=st.sampled_from([0.0, 0.1, 0.5]),
    reset=st.sampled_from([0.0, 0.2]),
    late=st.sampled_from([0.0, 0.1]),
    noise=st.sampled_from([0.0, 0.05]),
    batch_mean=st.sampled_from([1, 7, 64, 500]),
    dt_scale=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
    jump=st.sampled_from([0.0, 0.02]),
    mode=st.sampled_from(["fixed", "progress"]),
    cap=st.sampled_from([0.0, 0.7, 2.5]),
    force=st.sampled_from([0.0, 0.05]),
)


def new_id(rng: random.Random) -> int:
    while True:
        if value := rng.getrandbits(64):
            return value


def tree_messages(rng: random.Random, w: Workload, root: int, spout: int) -> list[tuple[int, int, int, int, int]]:
    """(kind, root, value, key, spout) messages of one random tree, per the spec's client algorithm."""
    edges = [new_id(rng) for _ in range(rng.randint(1, 3))]
    init_value = 0
    for e in edges:
        init_value ^= e
    msgs = [(INIT, root, init_value, 0, spout)]
    keyed = rng.random() < w.keyed
    live = list(edges)
    budget = rng.randint(0, 8)
    failed = rng.random() < w.fail
    while live:
        edge = live.pop(rng.randrange(len(live)))
        children = [new_id(rng) for _ in range(rng.randint(0, 2) if budget > 0 else 0)]
        budget -= len(children)
        out = 0
        for c in children:
            out ^= c
        live += children
        if failed and rng.random() < 0.5:
            msgs.append((FAIL, root, 0, 0, 0))
            failed = False
        else:
            msgs.append((ACK, root, edge ^ out, new_id(rng) if keyed else 0, 0))
    if failed:
        msgs.append((FAIL, root, 0, 0, 0))
    if rng.random() < w.reset:
        msgs.insert(rng.randint(0, len(msgs)), (RESET, root, 0, 0, 0))
    return msgs


def traffic(w: Workload, trees: int) -> list[tuple[int, int, int, int, int]]:
    """All messages of a workload: shuffled trees with duplicates and losses, then noise and late copies."""
    rng = random.Random(w.seed)
    msgs = []
    for _ in range(trees):
        for m in tree_messages(rng, w, new_id(rng), rng.randrange(w.spouts)):
            if rng.random() < w.lose:
                continue
            msgs.append(m)
            if rng.random() < w.duplicate:
                msgs.append(m)
    msgs += [(rng.choice([ACK, FAIL, RESET]), new_id(rng), 0, 0, 0) for _ in range(int(len(msgs) * w.noise))]
    rng.shuffle(msgs)
    msgs += [rng.choice(msgs) for _ in range(int(len(msgs) * w.late))] if msgs else []
    # FAIL and RESET carry no value; noise acks get a random one.
    return [(k, r, v if k in (INIT, ACK) else 0, key, s) for k, r, v, key, s in msgs]


def to_batch(msgs, spouts: int) -> Batch:
    names = [f"spout-{i}" for i in range(spouts)]
    return Batch.of(
        [m[0] for m in msgs],
        [m[1] for m in msgs],
        [m[2] for m in msgs],
        dedup_keys=[m[3] for m in msgs] if any(m[3] for m in msgs) else (),
        spouts=names,
        spout_index=[m[4] for m in msgs] if spouts > 1 else (),
    )


def comparable(resolutions) -> list[tuple]:
    """Resolutions in a canonical order; latency in whole microseconds (the native resolution)."""
    return sorted((r.spout, r.root, int(r.outcome), round(r.latency_seconds * 1e6)) for r in resolutions)


def assert_same_outcomes(ref, nat, what: str) -> None:
    a, b = comparable(ref), comparable(nat)
    assert [x[:3] for x in a] == [x[:3] for x in b], f"{what}: outcomes differ"
    # Rounding the difference and the difference of rounded times differ by at most 1 us.
    assert all(abs(x[3] - y[3]) <= 1 for x, y in zip(a, b)), f"{what}: latencies differ"


def assert_same_state(ref: Driver, nat: Driver, what: str, roots: bool) -> None:
    assert dataclasses.asdict(ref.stats) == dataclasses.asdict(nat.stats), what
    assert (ref.pending_trees, ref.orphan_entries) == (nat.pending_trees, nat.orphan_entries), what
    assert ref.seconds_until_rotation() == nat.seconds_until_rotation(), what
    if roots:
        assert sorted(ref.pending_roots()) == sorted(nat.pending_roots()), what
        sample = sorted(ref.pending_roots())[:50] + [1, 2**64 - 1]
        assert ref.inspect(sample) == nat.inspect(sample), what + " (inspect)"
        assert ref.oldest(5) == nat.oldest(5), what + " (oldest)"
        bounds = [ref.message_timeout / 4, ref.message_timeout]
        assert ref.age_histogram(bounds)[0] == nat.age_histogram(bounds)[0], what + " (age histogram)"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(w=workloads)
def test_native_ledger_agrees_with_reference(trees_checked, w: Workload):
    """Same outcomes, counters, pending trees, orphans and entries as the reference, whenever nothing is due.

    Then silence: everything left must drain identically within one window.
    """
    clock = ManualClock()
    rules = {"timeout_mode": w.mode, "max_tree_lifetime": w.cap * w.timeout}
    # Both through the one Ledger contract the server uses (Driver calls nothing else).
    ref = Driver(ReferenceLedger(w.timeout, w.buckets, clock, **rules))
    nat = Driver(NativeLedger(w.timeout, w.buckets, clock, **rules))
    rng = random.Random(w.seed ^ 0x5EED)
    msgs = traffic(w, FOREST)
    period = w.timeout / (w.buckets - 1)
    lo, step = 0, 0
    # Outcomes of each engine since both last had nothing due, and whether a limited collection happened since.
    since_sync: tuple[list, list] = ([], [])
    sliced = False
    while lo < len(msgs):
        hi = min(len(msgs), lo + 1 + int(rng.expovariate(1 / w.batch_mean)))
        if rng.random() < w.jump:
            clock.advance(w.timeout * rng.uniform(1.0, 3.0))
            event("clock jump past the window")
        elif rng.random() < 0.1:
            # Land exactly on a rotation boundary: both must round it the same way.
            clock.set(clock.now + ref.seconds_until_rotation())
        else:
            clock.advance(rng.random() * w.dt_scale * period)
        what = f"step {step}, messages [{lo}, {hi})"
        if rng.random() < 0.2:
            # Sliced as the server's ticker does it, or all at once.
            limit = rng.choice([None, None, 0, 1, 7])
            (x, _), (y, _) = ref.advance_some(limit), nat.advance_some(limit)
            since_sync[0].extend(x)
            since_sync[1].extend(y)
            sliced |= limit is not None
        batch = to_batch(msgs[lo:hi], w.spouts)
        # The server's Apply collects no due tree first (max_expired=0), except those the batch touches.
        expire_first = rng.choice([None, None, 0, 3])
        sliced |= expire_first is not None
        a, b = ref.apply_batch(batch, expire_first), nat.apply_batch(batch, expire_first)
        assert (a.applied, a.deduplicated, a.ignored) == (b.applied, b.deduplicated, b.ignored), what
        assert_same_outcomes(a.timeout_resets, b.timeout_resets, what + " (timeout resets)")
        since_sync[0].extend(a.resolutions)
        since_sync[1].extend(b.resolutions)
        if rng.random() < w.force:
            # Force-fail outcomes join the others since the last sync point: a due root
            # times out instead, and under sliced collection one engine may have collected it already.
            if rng.random() < 0.1:
                spout = f"spout-{rng.randrange(w.spouts)}"
                x, y = ref.force_fail_spout(spout), nat.force_fail_spout(spout)
            else:
                roots = [m[1] for m in rng.sample(msgs[lo:hi], min(3, hi - lo))]
                x, y = ref.force_fail(roots), nat.force_fail(roots)
            since_sync[0].extend(x)
            since_sync[1].extend(y)
            event("force-fail")
        if expire_first is None or not sliced:
            # Nothing due is left in either: same outcomes since the last such point, same state.
            # (Which due trees a limited collection takes first differs between the engines: the
            # reference pops its detached buckets, the core scans its table. A due tree a batch
            # touches expires first in both, so a client sees the same; latencies of trees
            # collected at different clock times differ, so only exact runs compare them.)
            if sliced:
                assert sorted(x[:3] for x in comparable(since_sync[0])) == sorted(
                    x[:3] for x in comparable(since_sync[1])
                ), what
            else:
                assert_same_outcomes(since_sync[0], since_sync[1], what)
            assert_same_state(ref, nat, what, roots=step % 8 == 0 or hi == len(msgs))
            since_sync, sliced = ([], []), False
        lo, step = hi, step + 1
    clock.advance(w.timeout + period + 1e-9)
    if w.cap:
        event(f"lifetime cap, {w.mode} mode: {ref.stats.outlived > 0} trees outlived")
    since_sync[0].extend(ref.advance())
    since_sync[1].extend(nat.advance())
    if sliced:
        assert sorted(x[:3] for x in comparable(since_sync[0])) == sorted(x[:3] for x in comparable(since_sync[1]))
    else:
        assert_same_outcomes(since_sync[0], since_sync[1], "final drain")
    assert_same_state(ref, nat, "after the final drain", roots=True)
    assert (nat.pending_trees, nat.orphan_entries) == (0, 0)
    trees_checked["native_agrees_with_reference"] += FOREST


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_both_refuse_the_same_timeouts(bad):
    """A zero, negative or NaN timeout is refused by both engines with the same message."""
    with pytest.raises(ValueError, match="message_timeout must be positive") as ref_error:
        ReferenceLedger(bad, clock=lambda: 0.0)
    with pytest.raises(ValueError, match="message_timeout must be positive") as nat_error:
        NativeLedger(bad, clock=lambda: 0.0)
    assert str(ref_error.value) == str(nat_error.value)
