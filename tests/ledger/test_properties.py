"""Property tests: simulated Storm clients build random tree/DAG forests, delivered shuffled.

The simulator follows the spec's "What each side sends" exactly (spout init with the xor
of its k edge ids; bolts anchor children to one or more live tuples, possibly of other
trees, and ack with ``id ^ out_ack_val``). Messages are shuffled, split into random
batches and applied through ``apply_batch`` of each ledger engine; the spec's invariants are checked
after every batch. ``ACKER_PROPERTY_TREES`` sets how many trees each property covers
(default 1000; the issue's on-demand configuration is 20000).
"""

from __future__ import annotations

import bisect
import math
import os
import random
from dataclasses import dataclass, field

import pytest
from acker_protocol.wire import OpKind, Outcome
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from acker_service.batch import Batch
from acker_service.reference_ledger import ReferenceLedger

TREES = int(os.environ.get("ACKER_PROPERTY_TREES", "1000"))
EXAMPLES = min(40, max(10, TREES // 20))
FOREST = math.ceil(TREES / EXAMPLES)  # trees per example: EXAMPLES * FOREST >= TREES
INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the simulated Storm client ---------------------------------------------------------


@dataclass
class Tup:
    """A tuple in flight: its MessageId (root -> xor of edge ids) and its out_ack_val."""

    ids: dict[int, int]
    out: int = 0


@dataclass(frozen=True)
class Msg:
    """One message to the acker."""

    kind: int
    root: int
    value: int
    spout: int  # index into the forest's spout names (used by INIT only)


@dataclass
class Shape:
    """How the random forest looks (drawn by hypothesis)."""

    max_targets: int  # spout fan-out k in 1..max_targets
    max_children: int  # children per processed tuple
    budget: int  # extra tuples allowed per tree beyond the spout's
    multi_anchor: float  # chance a child gets extra anchors (any live tuple, any tree)
    fail_rate: float  # chance a bolt fails a tuple instead of acking it
    doomed: float  # chance a tree is forced to contain at least one failed tuple
    reset_rate: float  # chance per tree of a reset_timeout sent at a random moment
    spouts: int


@dataclass
class Forest:
    """The messages a forest of trees produced, per root in emission order."""

    roots: list[int]
    spouts: int
    spout_of: dict[int, int]
    msgs: dict[int, list[Msg]] = field(default_factory=dict)
    cross_root_tuples: int = 0

    def all_messages(self) -> list[Msg]:
        return [m for r in self.roots for m in self.msgs[r]]

    def has_fail(self, root: int) -> bool:
        return any(m.kind == FAIL for m in self.msgs[root])


def new_id(rng: random.Random) -> int:
    """A random non-zero 64-bit id (the spec's CSPRNG, seeded here so hypothesis can replay)."""
    while True:
        if value := rng.getrandbits(64):
            return value


def build_forest(rng: random.Random, trees: int, shape: Shape) -> Forest:
    """Run spouts and bolts per the spec's client algorithm and collect what they send."""
    roots: list[int] = []
    seen = set()
    while len(roots) < trees:
        if (r := new_id(rng)) not in seen:
            seen.add(r)
            roots.append(r)
    spout_of = {r: rng.randrange(shape.spouts) for r in roots}
    forest = Forest(roots, shape.spouts, spout_of, {r: [] for r in roots})
    budget = {r: shape.budget for r in roots}
    doomed = {r for r in roots if rng.random() < shape.doomed}
    live: list[Tup] = []
    for r in roots:
        edges = [new_id(rng) for _ in range(rng.randint(1, shape.max_targets))]
        value = 0
        for e in edges:
            value ^= e
        forest.msgs[r].append(Msg(INIT, r, value, forest.spout_of[r]))
        live += [Tup({r: e}) for e in edges]
    while live:
        i = rng.randrange(len(live))
        live[i], live[-1] = live[-1], live[i]
        t = live.pop()
        for _ in range(rng.randint(0, shape.max_children)):
            if not all(budget[r] > 0 for r in t.ids):
                break
            anchors = [t]
            if live and rng.random() < shape.multi_anchor:
                anchors += rng.sample(live, min(len(live), rng.randint(1, 2)))
            child = emit(rng, anchors)
            for r in child.ids:
                budget[r] -= 1
            forest.cross_root_tuples += len(child.ids) > 1
            live.append(child)
        if rng.random() < shape.fail_rate or doomed & t.ids.keys():
            doomed -= t.ids.keys()
            for r in t.ids:  # bolt fails t: fail(r) for every root of t
                forest.msgs[r].append(Msg(FAIL, r, 0, 0))
        else:
            for r, tid in t.ids.items():  # bolt acks t: ack(r, id ^ out_ack_val)
                forest.msgs[r].append(Msg(ACK, r, tid ^ t.out, 0))
    for r in roots:
        if rng.random() < shape.reset_rate:
            forest.msgs[r].insert(rng.randint(0, len(forest.msgs[r])), Msg(RESET, r, 0, 0))
    return forest


def emit(rng: random.Random, anchors: list[Tup]) -> Tup:
    """Bolt emit anchored to ``anchors``: one fresh edge id per anchor (Storm's anchorsToIds)."""
    child = Tup({})
    for a in anchors:
        e = new_id(rng)
        a.out ^= e
        for r in a.ids:
            child.ids[r] = child.ids.get(r, 0) ^ e
    return child


# --- delivery and checking ----------------------------------------------------------------


def spout_name(i: int) -> str:
    return f"spout-{i}"


def to_batch(msgs: list[Msg], spouts: int) -> Batch:
    """Encode messages as one Batch with the forest's spout table."""
    return Batch.of(
        [m.kind for m in msgs],
        [m.root for m in msgs],
        [m.value for m in msgs],
        spouts=[spout_name(i) for i in range(spouts)],
        spout_index=[m.spout for m in msgs] if spouts > 1 else (),
    )


def splits(rng: random.Random, total: int, mean: int) -> list[tuple[int, int]]:
    """Cut [0, total) into consecutive batches of random sizes around ``mean``."""
    cuts, lo = [], 0
    while lo < total:
        hi = min(total, lo + 1 + int(rng.expovariate(1 / mean)) if mean > 1 else lo + 1)
        cuts.append((lo, hi))
        lo = hi
    return cuts


def assert_conserved(ledger: ReferenceLedger) -> None:
    """Spec invariant 3: inits = acked + failed + timed out + pending."""
    s = ledger.stats
    assert s.inits == s.acked + s.failed + s.timed_out + ledger.pending_trees, s


def assert_all_timed_out(ledger: ReferenceLedger, timed_out: list, roots: list[int], forest: Forest) -> None:
    """Exactly ``roots`` timed out, each to its own spout, and the ledger is empty and conserved."""
    assert sorted(res.root for res in timed_out) == sorted(roots)
    assert all(res.outcome == Outcome.TIMED_OUT for res in timed_out)
    assert all(res.spout == spout_name(forest.spout_of[res.root]) for res in timed_out)
    assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.timed_out) == (0, 0, len(roots))
    assert_conserved(ledger)


@dataclass
class Expected:
    """Where in the delivery order each tree must end, and how."""

    at: dict[int, tuple[int, Outcome]]  # root -> (position of the deciding message, outcome)

    def positions(self) -> list[int]:
        return sorted(p for p, _ in self.at.values())


def expected_outcomes(order: list[Msg], roots: list[int]) -> Expected:
    """Per the spec: ACKED at the last needed message; FAILED at max(first init, first fail)."""
    first_init: dict[int, int] = {}
    first_fail: dict[int, int] = {}
    last_needed: dict[int, int] = {}
    for i, m in enumerate(order):
        if m.kind == INIT:
            first_init.setdefault(m.root, i)
        elif m.kind == FAIL:
            first_fail.setdefault(m.root, i)
        if m.kind != RESET and (m.kind != INIT or first_init[m.root] == i):
            last_needed[m.root] = i  # a second init copy is never needed
    at = {}
    for r in roots:
        if r not in first_init:
            continue
        if r in first_fail:
            at[r] = (max(first_init[r], first_fail[r]), Outcome.FAILED)
        else:
            at[r] = (last_needed[r], Outcome.ACKED)
    return Expected(at)


def deliver(ledger, clock, order, cuts, forest: Forest, expected: Expected, dt=0.0):
    """Apply ``order`` batch by batch; check each outcome lands in the batch holding its message."""
    positions = expected.positions()
    resolved: dict[int, object] = {}
    init_time: dict[int, float] = {}
    for lo, hi in cuts:
        clock.advance(dt)
        chunk = order[lo:hi]
        for m in chunk:
            if m.kind == INIT:
                init_time.setdefault(m.root, clock.now)
        result = ledger.apply_batch(to_batch(chunk, forest.spouts))
        assert result.applied + result.deduplicated + result.ignored == hi - lo, result
        for res in result.resolutions:
            assert res.root not in resolved, f"second outcome {res.outcome.name} for root {res.root:#x}"
            resolved[res.root] = res
            want_at, want = expected.at.get(res.root, (None, None))
            assert res.outcome == want, f"root {res.root:#x}: got {res.outcome.name}, expected {want}"
            assert lo <= want_at < hi, f"{res.root:#x} {want.name} in batch [{lo}, {hi}), due at {want_at}"
            assert res.spout == spout_name(forest.spout_of[res.root])
            # Whole microseconds, as the wire carries them (the native engine keeps no finer time).
            assert res.latency_seconds == pytest.approx(clock.now - init_time[res.root], abs=1.5e-6)
        # Exactly at: every tree due in this batch or before has ended, and no other tree.
        assert len(resolved) == bisect.bisect_left(positions, hi), f"after batch [{lo}, {hi})"
        assert_conserved(ledger)
    return resolved


class Entries:
    """Which entries the spec's table leaves in the ledger, given where each tree ends.

    Outcomes are ``expected_outcomes``' job; this follows the rest of the table. An ended
    tree is forgotten, so a later ack or fail makes an entry without a spout (an orphan)
    and a later init a new tree. Also counts duplicate inits and applied resets.
    """

    def __init__(self, expected: Expected) -> None:
        self.end_at = {r: p for r, (p, _) in expected.at.items()}
        self.entries: dict[int, bool] = {}  # root -> init applied
        self.inits = self.duplicate_inits = self.resets = 0

    def feed(self, msgs: list[Msg], start: int = 0) -> None:
        """Messages at positions ``start``, ``start + 1``, ... of the delivery."""
        for i, m in enumerate(msgs, start):
            if m.kind == RESET:
                self.resets += m.root in self.entries  # otherwise ignored: no entry to refresh
            elif m.kind == INIT:
                if self.entries.get(m.root):
                    self.duplicate_inits += 1
                else:
                    self.entries[m.root] = True
                    self.inits += 1
            else:
                self.entries.setdefault(m.root, False)
            if self.end_at.get(m.root) == i:
                del self.entries[m.root]

    @property
    def pending(self) -> int:
        return sum(self.entries.values())

    @property
    def orphans(self) -> int:
        return len(self.entries) - self.pending


def check_entries(ledger: ReferenceLedger, model: Entries) -> None:
    """The ledger holds the trees and orphans the model says, with the model's counters."""
    s = ledger.stats
    assert (ledger.pending_trees, ledger.orphan_entries) == (model.pending, model.orphans)
    assert (s.inits, s.duplicate_inits, s.resets) == (model.inits, model.duplicate_inits, model.resets)


# --- strategies --------------------------------------------------------------------------


def shapes(fail_rate=st.just(0.0), doomed=st.just(0.0)) -> st.SearchStrategy[Shape]:
    return st.builds(
        Shape,
        max_targets=st.integers(1, 3),
        max_children=st.integers(0, 3),
        budget=st.integers(0, 12),
        multi_anchor=st.sampled_from([0.0, 0.15, 0.5]),
        fail_rate=fail_rate,
        doomed=doomed,
        reset_rate=st.sampled_from([0.0, 0.3]),
        spouts=st.integers(1, 3),
    )


seeds = st.integers(0, 2**64 - 1)
batch_means = st.sampled_from([1, 4, 32, 400])
timeouts = st.tuples(st.sampled_from([0.5, 2.0, 7.0, 30.0]), st.integers(2, 6))


def shuffled(rng: random.Random, msgs: list[Msg]) -> list[Msg]:
    order = list(msgs)
    rng.shuffle(order)
    return order


def new_ledger(factories, rng, T=1000.0, b=3):
    """A ledger whose rotation phase relative to the first message is random."""
    clock_cls, ledger_cls = factories
    clock = clock_cls(start=1000.0)
    ledger = ledger_cls(message_timeout=T, buckets=b, clock=clock)
    clock.advance(rng.random() * T / (b - 1))
    return ledger, clock


def deliver_all_acked(factories, rng, forest: Forest, msgs: list, mean, timeout):
    """Shuffle ``msgs``, deliver them in random batches within 0.9 T, and check every tree ended ACKED.

    Spread over 0.9 T, rotations happen mid-delivery, yet no entry can expire.
    Returns the ledger, its clock, the delivery order and the expected outcomes.
    """
    order = shuffled(rng, msgs)
    expected = expected_outcomes(order, forest.roots)
    T, b = timeout
    ledger, clock = new_ledger(factories, rng, T, b)
    cuts = splits(rng, len(order), mean)
    resolved = deliver(ledger, clock, order, cuts, forest, expected, 0.9 * T / len(cuts))
    assert sorted(resolved) == sorted(forest.roots)
    assert all(res.outcome == Outcome.ACKED for res in resolved.values())
    return ledger, clock, order, expected


# --- the properties ----------------------------------------------------------------------


@PROPERTY
@given(seed=seeds, shape=shapes(), mean=batch_means, timeout=timeouts)
def test_acked_exactly_at_last_message(factories, trees_checked, seed, shape, mean, timeout):
    """Complete trees end ACKED in the batch holding their last message, never before, once."""
    rng = random.Random(seed)
    forest = build_forest(rng, FOREST, shape)
    event(f"cross-root tuples: {'yes' if forest.cross_root_tuples else 'no'}")
    ledger, clock, order, expected = deliver_all_acked(factories, rng, forest, forest.all_messages(), mean, timeout)
    model = Entries(expected)
    model.feed(order)
    check_entries(ledger, model)
    assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)  # after the end: only resets, ignored
    check_messages_after_end(ledger, clock, rng, order, shape.spouts, model)
    trees_checked["acked_exactly_at_last_message"] += len(forest.roots)


def check_messages_after_end(ledger, clock, rng, order, spouts, model: Entries):
    """Re-deliver acks, fails and resets of a finished forest: no outcome, orphans that drain in one window."""
    extra = [rng.choice(order) for _ in range(rng.randint(1, len(order)))]
    extra = [m for m in extra if m.kind != INIT]  # our client never re-sends an init
    s = ledger.stats
    outcomes_before, orphaned_before = s.acked + s.failed + s.timed_out, s.orphaned
    orphans_before, pending_before = ledger.orphan_entries, ledger.pending_trees
    new_orphans = {m.root for m in extra if m.kind != RESET} - set(model.entries)
    event(f"late acks/fails made orphans: {'yes' if new_orphans else 'no'}")
    t = clock.now
    for lo, hi in splits(rng, len(extra), 16):
        result = ledger.apply_batch(to_batch(extra[lo:hi], spouts))
        assert result.resolutions == [], "a message after the end produced an outcome"
        model.feed(extra[lo:hi], len(order) + lo)  # past every end position
        check_entries(ledger, model)
        assert ledger.pending_trees == pending_before
        assert_conserved(ledger)
    assert ledger.orphan_entries == orphans_before + len(new_orphans)
    orphans = ledger.orphan_entries
    clock.set(t + ledger.message_timeout * (1 - 1e-9))
    assert ledger.advance() == []
    assert new_orphans <= set(ledger.pending_roots()), "a late orphan expired before t + T"
    clock.set(t + (ledger.message_timeout + ledger.rotation_period) * (1 + 1e-9))
    assert ledger.advance() == [], "an orphan made by a late message produced an outcome"
    assert s.acked + s.failed + s.timed_out == outcomes_before
    assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)
    assert s.orphaned == orphaned_before + orphans
    assert_conserved(ledger)


@PROPERTY
@given(seed=seeds, shape=shapes(), mean=batch_means, timeout=timeouts)
def test_dropped_ack_never_acks_and_times_out(factories, trees_checked, seed, shape, mean, timeout):
    """Dropping one ack of a tree: never ACKED; TIMED_OUT once, not before t+T, by t+T+T/(b-1)."""
    T, b = timeout
    rng = random.Random(seed)
    forest = build_forest(rng, FOREST, shape)
    dropped = set()
    msgs = []
    for r in forest.roots:
        acks = [i for i, m in enumerate(forest.msgs[r]) if m.kind == ACK]
        lose = rng.choice(acks) if rng.random() < 0.6 else None
        dropped |= {r} if lose is not None else set()
        msgs += [m for i, m in enumerate(forest.msgs[r]) if i != lose]
    order = shuffled(rng, msgs)
    expected = expected_outcomes(order, forest.roots)
    for r in dropped:
        del expected.at[r]  # incomplete: must not end during delivery
    ledger, clock = new_ledger(factories, rng, T, b)
    t0 = clock.now  # every entry is put at t0: the clock stands still during delivery
    resolved = deliver(ledger, clock, order, splits(rng, len(order), mean), forest, expected)
    assert not dropped & resolved.keys()
    assert ledger.pending_trees == len(dropped)
    slack = T * 1e-9  # float rounding of the rotation schedule
    clock.set(t0 + T - slack)
    assert ledger.advance() == [], "a tree timed out before t + T"
    clock.set(t0 + T + T / (b - 1) + slack)
    assert_all_timed_out(ledger, ledger.advance(), dropped, forest)
    trees_checked["dropped_ack_never_acks"] += len(forest.roots)


@PROPERTY
@given(seed=seeds, shape=shapes(), mean=batch_means, timeout=timeouts)
def test_duplicated_init_never_acks_early(factories, trees_checked, seed, shape, mean, timeout):
    """A second copy of each init, anywhere in the order, never makes a tree end early."""
    rng = random.Random(seed)
    forest = build_forest(rng, FOREST, shape)
    dup_inits = [m for r in forest.roots for m in forest.msgs[r] if m.kind == INIT]
    msgs = forest.all_messages() + dup_inits
    ledger, clock, order, expected = deliver_all_acked(factories, rng, forest, msgs, mean, timeout)
    T, b = timeout
    # A copy after the end is a new tree (the spec keeps no memory of ended roots).
    resent = {m.root for i, m in enumerate(order) if m.kind == INIT and i > expected.at[m.root][0]}
    event(f"init copies after the end: {'some' if resent else 'none'}")
    model = Entries(expected)
    model.feed(order)
    check_entries(ledger, model)
    assert ledger.stats.duplicate_inits + len(resent) == len(forest.roots)
    assert ledger.stats.inits == len(forest.roots) + len(resent)
    assert (ledger.pending_trees, ledger.orphan_entries) == (len(resent), 0)
    # Those new trees get a second outcome: TIMED_OUT, once, to the init's spout.
    clock.advance((T + T / (b - 1)) * (1 + 1e-9))
    assert_all_timed_out(ledger, ledger.advance(), resent, forest)
    trees_checked["duplicated_init_never_acks_early"] += len(forest.roots)


@PROPERTY
@given(
    seed=seeds,
    shape=shapes(fail_rate=st.sampled_from([0.0, 0.05, 0.3]), doomed=st.sampled_from([0.3, 0.7, 1.0])),
    mean=batch_means,
    timeout=timeouts,
)
def test_fail_anywhere_fails_exactly_once(factories, trees_checked, seed, shape, mean, timeout):
    """A tree with a failed tuple ends FAILED once, when its init and a fail have both arrived."""
    rng = random.Random(seed)
    forest = build_forest(rng, FOREST, shape)
    order = shuffled(rng, forest.all_messages())
    expected = expected_outcomes(order, forest.roots)
    T, b = timeout
    ledger, clock = new_ledger(factories, rng, T, b)
    cuts = splits(rng, len(order), mean)
    # Spread over 0.9 T: rotations happen mid-delivery, yet no entry can expire.
    resolved = deliver(ledger, clock, order, cuts, forest, expected, 0.9 * T / len(cuts))
    failing = {r for r in forest.roots if forest.has_fail(r)}
    event(f"failing trees: {'some' if failing else 'none'}")
    assert {r for r, res in resolved.items() if res.outcome == Outcome.FAILED} == failing
    assert sorted(resolved) == sorted(forest.roots)
    model = Entries(expected)
    model.feed(order)
    check_entries(ledger, model)  # acks and fails after a FAILED are orphans, no tree is pending
    assert ledger.pending_trees == 0
    check_messages_after_end(ledger, clock, rng, order, shape.spouts, model)
    trees_checked["fail_anywhere_fails_once"] += len(forest.roots)


@PROPERTY
@given(seed=seeds, shape=shapes(fail_rate=st.sampled_from([0.0, 0.2])), mean=batch_means, timeout=timeouts)
def test_no_traffic_drains_within_one_window(factories, trees_checked, seed, shape, mean, timeout):
    """Bounded memory: lost inits and late acks (orphans), lost acks (pending) all drain within T + T/(b-1)."""
    T, b = timeout
    rng = random.Random(seed)
    forest = build_forest(rng, FOREST, shape)
    msgs, lost_init, orphaned, stuck = [], set(), set(), set()
    for r in forest.roots:
        tree = forest.msgs[r]
        fate = rng.random()
        if fate < 0.3:  # the init is lost: its acks and fails make an orphan entry
            tree = [m for m in tree if m.kind != INIT]
            lost_init.add(r)
            if any(m.kind != RESET for m in tree):
                orphaned.add(r)
        elif fate < 0.6 and not forest.has_fail(r):  # one ack is lost: pending until timeout
            lose = rng.choice([i for i, m in enumerate(tree) if m.kind == ACK])
            tree = tree[:lose] + tree[lose + 1 :]
            stuck.add(r)
        msgs += tree
    order = shuffled(rng, msgs)
    ledger, clock = new_ledger(factories, rng, T, b)
    cuts = splits(rng, len(order), mean)
    dt = T / (2 * len(cuts))  # traffic spread over half a timeout
    for lo, hi in cuts:
        clock.advance(dt)
        ledger.apply_batch(to_batch(order[lo:hi], shape.spouts))
        assert_conserved(ledger)
    expected = expected_outcomes(order, forest.roots)
    for r in stuck:
        del expected.at[r]  # a lost ack: never ends during delivery
    model = Entries(expected)
    model.feed(order)  # orphans: lost inits, and acks or fails that came after a FAILED
    check_entries(ledger, model)
    assert model.pending == len(stuck) and model.orphans >= len(orphaned)
    # Then copies of acks, fails and resets of trees that ended (a Spark re-run after the
    # end), over a quarter timeout: each tree with a late ack or fail leaves one orphan.
    ended = [m for r in forest.roots if r not in lost_init | stuck for m in forest.msgs[r] if m.kind != INIT]
    late = [rng.choice(ended) for _ in range(rng.randint(0, len(ended)))]
    late_orphans = {m.root for m in late if m.kind != RESET} - set(model.entries)
    orphans_before = ledger.orphan_entries
    late_cuts = splits(rng, len(late), mean)
    for lo, hi in late_cuts:
        clock.advance(T / (4 * len(late_cuts)))
        assert ledger.apply_batch(to_batch(late[lo:hi], shape.spouts)).resolutions == []
        model.feed(late[lo:hi], len(order) + lo)  # past every end position
        check_entries(ledger, model)
        assert ledger.pending_trees == len(stuck)
        assert_conserved(ledger)
    assert ledger.orphan_entries == orphans_before + len(late_orphans) == model.orphans
    clock.advance(T + T / (b - 1) + T * 1e-9)  # one window after the last traffic, nothing sent
    ledger.advance()
    assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)
    assert ledger.stats.orphaned == model.orphans
    assert ledger.stats.acked + ledger.stats.failed == len(forest.roots) - len(lost_init) - len(stuck)
    assert ledger.stats.timed_out == len(stuck)
    assert ledger.stats.inits == len(forest.roots) - len(lost_init)
    assert_conserved(ledger)
    trees_checked["no_traffic_drains"] += len(forest.roots)


# --- the simulator itself must be right, or the properties prove nothing -----------------


def test_simulator_builds_cross_root_dags():
    """With multi-anchoring on, the simulator makes tuples anchored to tuples of several trees."""
    shape = Shape(3, 3, 12, 0.5, 0.0, 0.0, 0.0, 2)
    forest = build_forest(random.Random(7), 50, shape)
    assert forest.cross_root_tuples > 10
    assert max(len(forest.msgs[r]) for r in forest.roots) > 5


def test_simulator_messages_cancel_per_root():
    """Every edge is xored in exactly twice: each complete tree's init and acks xor to 0."""
    shape = Shape(3, 3, 12, 0.5, 0.0, 0.0, 0.3, 1)
    forest = build_forest(random.Random(11), 200, shape)
    for r in forest.roots:
        total = 0
        for m in forest.msgs[r]:
            total ^= m.value
        assert total == 0, f"tree {r:#x} does not cancel"
        assert sum(m.kind == INIT for m in forest.msgs[r]) == 1


def test_simulator_failed_tree_never_cancels():
    """A tree with a failed tuple never xors to 0, so only FAILED can end it."""
    shape = Shape(2, 2, 6, 0.3, 0.2, 0.5, 0.0, 1)
    forest = build_forest(random.Random(5), 200, shape)
    failing = [r for r in forest.roots if forest.has_fail(r)]
    assert len(failing) > 50
    for r in failing:
        total = 0
        for m in forest.msgs[r]:
            total ^= m.value
        assert total != 0
