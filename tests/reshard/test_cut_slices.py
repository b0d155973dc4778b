"""A cut hands its entries over in slices, youngest first: the first slice leaves before the others are taken out.

The old owner lists and refuses every moving root at its cut, in one step, but
takes each slice's entries out of its ledger only as that slice is sent: the
first (the youngest trees, the ones operations still arrive for) goes at once,
the old trees follow. Meanwhile their entries stay untouched (refused) here.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from acker_protocol.packed import encode_apply_request
from acker_protocol.wire import OpKind

from acker_service.batch import WrongShard
from acker_service.config import ServerConfig
from acker_service.moving import membership as membership_module
from acker_service.moving import reshard
from acker_service.moving.layout import Layout
from acker_service.moving.reshard import Chunk, Slice
from acker_service.shard import Shard

OLD = list(range(1, 41))  # started at t=0; the odd ones move to shard 1 of 2
YOUNG = [101, 103, 105]  # started at t=10, 11, 12: they move too


def _inits(roots: list[int]) -> bytes:
    n = len(roots)
    return encode_apply_request(
        np.full(n, int(OpKind.INIT)), np.asarray(roots, np.uint64), np.full(n, 7, np.uint64), spouts=("s",)
    )


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_the_youngest_slice_leaves_first_while_the_old_entries_wait_refused_in_the_ledger(engine, monkeypatch):
    monkeypatch.setattr(reshard, "FIRST_SLICE", len(YOUNG))
    monkeypatch.setattr(reshard, "SLICE_ENTRIES", 8)
    now = [0.0]
    shard = Shard(ServerConfig(shard_index=0, shard_count=1, message_timeout=60.0, engine=engine), lambda: now[0])
    shard.apply_request(_inits(OLD))
    for i, root in enumerate(YOUNG):
        now[0] = 10.0 + i
        shard.apply_request(_inits([root]))
    now[0] = 20.0
    moving = {r for r in OLD + YOUNG if r % 2 == 1}
    staying = len(OLD + YOUNG) - len(moving)

    sent: list[tuple[Chunk, int]] = []  # each chunk as sent, with the trees still in the ledger then
    refused_meanwhile: list[bool] = []

    async def send(chunks, layout, metadata=(), security=None):
        for item in chunks:
            assert isinstance(item, Slice), "a cut's slices are taken out as they are sent, not before"
            chunk = item.taken()
            sent.append((chunk, shard.pending_trees))
            if len(sent) == 1:
                try:
                    shard.apply_request(_inits([OLD[0]]))  # root 1: moving, its entry still here
                    refused_meanwhile.append(False)
                except WrongShard:
                    refused_meanwhile.append(True)
        return []

    monkeypatch.setattr(membership_module, "send_handoffs", send)
    shard.membership.prepare_layout(Layout(1, 2, 0))
    trees, entries = asyncio.run(shard.membership.cut_layout(1))

    first, pending_then = sent[0]
    assert sorted(first.entries.roots.tolist()) == YOUNG, "the first slice holds the youngest trees"
    assert first.manifest is not None and set(first.manifest.tolist()) == moving
    assert pending_then == staying + len(moving) - len(YOUNG), "the old entries were still in the ledger"
    assert refused_meanwhile == [True], "a moving root is refused from the cut on, its entry not yet taken out"
    assert all(c.manifest is None for c, _ in sent[1:]) and {c.count for c, _ in sent} == {len(sent)}
    assert sorted(r for c, _ in sent for r in c.entries.roots.tolist()) == sorted(moving)
    assert (trees, entries) == (len(moving), len(moving))
    assert shard.pending_trees == staying
    assert shard.metrics.transfers.handoff_out_trees == len(moving)


def test_a_slice_taken_out_by_a_cut_cut_short_is_sent_again_with_its_entries(monkeypatch):
    """CutLayout's call cancelled after the first slice left the ledger: the next cut sends those entries, same key."""
    now = [0.0]
    shard = Shard(ServerConfig(shard_index=0, shard_count=1, message_timeout=60.0), lambda: now[0])
    shard.apply_request(_inits(OLD + YOUNG))
    moving = sorted(r for r in OLD + YOUNG if r % 2 == 1)

    async def cut_short(chunks, layout, metadata=(), security=None):
        chunks[0].taken()  # out of the ledger, then the call is cancelled before the answer
        raise asyncio.CancelledError

    sent: list[Chunk] = []

    async def deliver(chunks, layout, metadata=(), security=None):
        sent.extend(item.taken() if isinstance(item, Slice) else item for item in chunks)
        return []

    shard.membership.prepare_layout(Layout(1, 2, 0))
    monkeypatch.setattr(membership_module, "send_handoffs", cut_short)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(shard.membership.cut_layout(1))
    monkeypatch.setattr(membership_module, "send_handoffs", deliver)
    asyncio.run(shard.membership.cut_layout(1))

    assert sorted(r for c in sent for r in c.entries.roots.tolist()) == moving, "no entry lost with the cut short"
    assert len({c.key for c in sent}) == len(sent)
    assert shard.metrics.transfers.handoff_out_trees == len(moving)


OLD3 = ("a:1", "b:1", "c:1")
NEW4 = ("a:1", "b:1", "c:1", "d:1")


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_a_two_replica_cut_slices_its_copies_youngest_first_and_serves_the_rest_between_slices(engine, monkeypatch):
    """Two replicas, shard c of a, b, c growing to a, b, c, d: the cut lists and refuses the roots c leaves in one
    step, then takes each slice out only as it is sent, youngest first, each copy to its one new keeper; a root c
    keeps (moving or not) is applied between slices, and a root it leaves is refused while its entry still waits."""
    monkeypatch.setattr(reshard, "FIRST_SLICE", 2)
    monkeypatch.setattr(reshard, "SLICE_ENTRIES", 5)
    now = [0.0]
    config = ServerConfig(shard_index=2, shard_count=3, replicas=2, message_timeout=60.0, engine=engine)
    shard = Shard(config, lambda: now[0])
    kept_here = [r for r in range(1, 200) if r % 3 in (1, 2)]  # c keeps r % 3 == 2 (owner) and == 1 (follower)
    old, young = kept_here[:-6], kept_here[-6:]
    shard.apply_request(_inits(old))
    for i, root in enumerate(young):
        now[0] = 10.0 + i
        shard.apply_request(_inits([root]))
    now[0] = 20.0
    shard.membership.prepare_layout(Layout(1, 4, 2, NEW4), Layout(0, 3, 2, OLD3))
    machine = shard.membership.layout
    plan = machine.cut_plan(np.asarray(kept_here, np.uint64))
    leaving = set(plan.leave.tolist())
    target_of = dict(zip(plan.leave.tolist(), plan.targets.tolist()))
    stays = [r for r in kept_here if r not in leaving]
    staying_moving = [r for r in stays if machine.moves(np.array([r], np.uint64))[0]]
    assert leaving and stays and staying_moving, "c leaves some roots, keeps others, among them moving ones"
    young_leaving = [r for r in reversed(young) if r in leaving]

    sent: list[tuple[Slice, Chunk, int]] = []  # each slice with its chunk as sent, and the trees still here then
    served_between: list[int] = []
    refused_between: list[bool] = []
    late = max(leaving, key=lambda r: -kept_here.index(r))  # an old root: in a late slice

    async def send(chunks, layout, metadata=(), security=None):
        assert {c.shard for c in chunks} == {0, 1, 3}, "every new shard but c's own place gets a slice, empty too"
        firsts = [c for c in chunks if c.manifest is not None]
        for item in firsts + [c for c in chunks if c.manifest is None]:
            assert isinstance(item, Slice), "a two-replica cut's copies are taken out as they are sent, not before"
            sent.append((item, item.taken(), shard.pending_trees))
            # Between two slices: roots c keeps are applied (one that moves too), one it leaves is refused.
            acks = encode_apply_request(
                np.full(2, int(OpKind.ACK)),
                np.array([stays[0], staying_moving[0]], np.uint64),
                np.full(2, 3, np.uint64),
            )
            served_between.append(shard.apply_request(acks).applied)
            try:
                shard.apply_request(_inits([late]))
                refused_between.append(False)
            except WrongShard:
                refused_between.append(True)
        return []

    monkeypatch.setattr(membership_module, "send_handoffs", send)
    trees, entries = asyncio.run(shard.membership.cut_layout(1))

    assert len(sent) > 3, "the copies went in several slices"
    first_roots = [r for s, c, _ in sent if s.manifest is not None for r in c.entries.roots.tolist()]
    assert set(young_leaving) <= set(first_roots), "the first slices hold the youngest trees"
    assert sent[0][2] == len(kept_here) - len(sent[0][1].entries), "the other copies were still in the ledger"
    assert served_between == [2] * len(sent), "roots c keeps were applied between slices"
    assert refused_between[0] and all(refused_between), "a root c leaves is refused while its entry waits"
    for s, c, _ in sent:
        assert all(target_of[r] == s.shard for r in c.entries.roots.tolist()), "each copy to its one new keeper"
        assert c.count == sum(1 for t, _, _ in sent if t.shard == s.shard)
    assert sorted(r for _, c, _ in sent for r in c.entries.roots.tolist()) == sorted(leaving), "each copy once"
    assert (trees, entries) == (len(leaving), len(leaving))
    assert shard.pending_trees == len(stays), "c keeps its own copy of every root it stays a keeper of"
    assert shard.metrics.transfers.handoff_out_trees == len(leaving)
