"""A restarted replica's catch-up (docs/acker-semantics.md, "Replicated trees"): a snapshot copied out of the
partner's ledger, then the operations the replica held meanwhile, end every copied tree as the partner ends it.

The partner applies every message. The replica restarts empty at a random
point, holds every message from then on, and at a later random point (the cut)
installs the partner's snapshot and applies what it held; after the cut both
get every message. ACKs carry dedup keys, as the replicated client sends them.
Whatever the points and the engines on each side:

- the snapshot changes nothing at the partner (its outcomes and counters are
  those of a ledger that was never copied);
- every tree in the snapshot ends on the replica exactly as on the partner
  (outcome and latency);
- the replica acks no tree the partner did not ack.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from acker_client.testing import ManualClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acker_service.batch import Batch
from acker_service.native_ledger import NativeLedger
from acker_service.reference_ledger import ReferenceLedger

from .driver import ENGINES, Driver
from .test_differential import ACK, INIT, Workload, comparable, to_batch, traffic, workloads

PAIRS = [(a, b) for a in ENGINES for b in ENGINES]
MAKE = {"reference": ReferenceLedger, "native": NativeLedger}
ACKED = 1  # Outcome.ACKED


def _keyed(msgs: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int, int, int]]:
    """Every ACK with a dedup key, as a replicated client sends it: every copy of a message shares it."""
    return [(k, r, v, key or _key_of(r, v) if k == ACK else key, s) for k, r, v, key, s in msgs]


def _key_of(root: int, value: int) -> int:
    return ((root * 0x9E3779B97F4A7C15) ^ value) % 2**64 or 1


def _complete(msgs: list[tuple[int, int, int, int, int]]) -> set[int]:
    """Roots whose init and every distinct ack XOR to 0: the only trees any ledger may ack."""
    inits: dict[int, int] = {}
    acks: dict[int, dict[int, int]] = {}
    for k, r, v, key, _ in msgs:
        if k == INIT:
            inits.setdefault(r, v)
        elif k == ACK:
            acks.setdefault(r, {})[key] = v
    done = set()
    for root, value in inits.items():
        for v in acks.get(root, {}).values():
            value ^= v
        if value == 0:
            done.add(root)
    return done


def _stats(d: Driver) -> tuple[int, ...]:
    s = d.stats
    return (s.inits, s.acked, s.failed, s.timed_out, s.deduplicated, s.duplicate_inits, d.pending_trees)


@pytest.mark.parametrize(("partner_engine", "replica_engine"), PAIRS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads, restart=st.floats(0.0, 1.0), cut=st.floats(0.0, 1.0), expiring=st.booleans())
def test_a_caught_up_replica_ends_every_copied_tree_as_its_partner(
    partner_engine, replica_engine, w: Workload, restart: float, cut: float, expiring: bool
):
    """Snapshot, then the held operations: the replica's outcomes for the copied trees are the partner's.

    With ``expiring`` trees also time out while messages still come, and late
    copies of an INIT start a root again after it ended: then a message the
    partner applied to an entry that ended since is applied again by the
    replica to the copied tree, so only the two safety rules are checked, not
    every outcome.
    """
    w = dataclasses.replace(w, reset=0.0)  # a held RESET_TIMEOUT re-applied later only delays a replica's timeout
    timeout = w.timeout if expiring else w.timeout * 1000  # not expiring: nothing is due before the end
    if not expiring:
        # Nor does a late copy of an INIT start a tree again after it ended (the replica, applying the
        # held messages after the snapshot, would see that tree's acks, which the partner spent on the first).
        w = dataclasses.replace(w, duplicate=0.0, late=0.0)
    clock = ManualClock()
    rules = {"timeout_mode": w.mode, "max_tree_lifetime": w.cap * timeout}
    one = Driver(ReferenceLedger(timeout, w.buckets, clock, **rules))
    partner = Driver(MAKE[partner_engine](timeout, w.buckets, clock, **rules))
    replica = Driver(MAKE[replica_engine](timeout, w.buckets, clock, **rules))
    rng = random.Random(w.seed ^ 0x5AA)
    msgs = _keyed(traffic(w, 40))
    restart_at = int(len(msgs) * restart)
    cut_at = restart_at + int((len(msgs) - restart_at) * cut)
    period = w.timeout / (w.buckets - 1)
    alone, copied, held = [], [], []
    partner_after, replica_after = [], []
    installed = False
    lo = 0
    while lo < len(msgs) or not installed:
        if lo >= cut_at and not installed:
            alone.extend(one.advance())
            partner_after.extend(partner.advance())
            snapshot = partner.ledger.export_snapshot(1, 0)
            copied = [int(root) for root, spout in zip(snapshot.roots, snapshot.spout_index) if spout >= 0]
            replica_after.extend(replica.ledger.import_entries(snapshot).resolutions())
            for batch in held:
                replica_after.extend(replica.apply_batch(batch).resolutions)
            installed = True
            continue
        hi = min(len(msgs), cut_at if lo < cut_at else len(msgs), lo + 1 + int(rng.expovariate(1 / w.batch_mean)))
        clock.advance(rng.random() * w.dt_scale * period)
        alone.extend(one.advance())
        (partner_after if installed else []).extend(partner.advance())
        if installed:
            replica_after.extend(replica.advance())
        batch = to_batch(msgs[lo:hi], w.spouts)
        alone.extend(one.apply_batch(batch).resolutions)
        ended = partner.apply_batch(batch).resolutions
        if installed:
            partner_after.extend(ended)
            replica_after.extend(replica.apply_batch(batch).resolutions)
        elif lo >= restart_at:
            held.append(batch)
        lo = hi
    clock.advance(timeout * (1 + w.cap) + 2 * timeout / (w.buckets - 1))
    alone.extend(one.advance())
    partner_after.extend(partner.advance())
    replica_after.extend(replica.advance())

    assert _stats(partner) == _stats(one), "copying a snapshot changed the partner"
    acked = {r.root for r in replica_after if int(r.outcome) == ACKED}
    assert acked <= _complete(msgs), "the replica acked a tree whose tuples were not all acked"
    if expiring:
        return
    mine = set(copied)
    theirs = comparable(r for r in partner_after if r.root in mine)
    ours = comparable(r for r in replica_after if r.root in mine)
    assert [x[:3] for x in ours] == [x[:3] for x in theirs], "a copied tree ended otherwise on the replica"
    assert all(abs(x[3] - y[3]) <= 1 for x, y in zip(ours, theirs)), "a copied tree's latency differs"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_snapshot_copies_one_range_with_keys_and_timeout_place(engine):
    """Only the asked range is copied, with its dedup keys, resets, age and generation; nothing leaves."""
    clock = ManualClock()
    ledger = Driver(MAKE[engine](4.0, 3, clock))
    ledger.apply_batch(Batch.of([INIT, ACK, ACK], [5, 5, 5], [7, 1, 2], dedup_keys=[0, 21, 22], spouts=["s"]))
    ledger.apply_batch(Batch.of([4], [5], [0], spouts=["s"]))  # a RESET_TIMEOUT
    ledger.apply_batch(Batch.of([INIT], [6], [9], spouts=["s"]))  # the other range
    ledger.apply_batch(Batch.of([ACK], [8], [3], dedup_keys=[31], spouts=["s"]))  # an orphan in the range
    clock.advance(2.0)  # one rotation
    snapshot = ledger.ledger.export_snapshot(3, 2)
    assert snapshot.rows() == [
        (5, 4, "s", 2_000_000, 1, False, 1, (21, 22)),
        (8, 3, None, 2_000_000, 1, False, 0, (31,)),
    ]
    assert (ledger.pending_trees, ledger.orphan_entries) == (2, 1), "a snapshot removes nothing"
    assert ledger.stats.moved_out == 0
    again = ledger.apply_batch(Batch.of([ACK], [5], [2], dedup_keys=[22], spouts=["s"]))
    assert again.deduplicated == 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("count", "index"), [(0, 0), (3, 3), (3, -1)])
def test_a_snapshot_of_no_shard_is_refused(engine, count, index):
    """A shard count below 1 or an index outside it is a ValueError, not an empty copy."""
    ledger = MAKE[engine](4.0, 3, ManualClock())
    with pytest.raises(ValueError, match="shard"):
        ledger.export_snapshot(count, index)
