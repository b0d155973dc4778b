"""The Shard without gRPC: apply, expiry, subscription and close on an injected clock."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from acker_protocol.packed import encode_apply_request
from acker_protocol.wire import OpKind, Outcome

from acker_service.batch import WrongShard
from acker_service.config import ServerConfig
from acker_service.shard import BadSpoutName, Shard, ShardClosing, Superseded

INIT, ACK = int(OpKind.INIT), int(OpKind.ACK)


def _request(kinds, roots, values, spouts=()) -> bytes:
    return encode_apply_request(np.asarray(kinds), np.asarray(roots), np.asarray(values), spouts=spouts)


def _shard(clock, **overrides) -> Shard:
    return Shard(ServerConfig(message_timeout=10.0, **overrides), clock)


async def _next(chunks):
    return await asyncio.wait_for(anext(chunks), 5)


def test_a_refused_batch_changes_nothing(clock):
    """A batch with a foreign root raises WrongShard and leaves no pending tree behind."""
    shard = _shard(clock, shard_index=0, shard_count=2)
    with pytest.raises(WrongShard):
        shard.apply_request(_request([INIT, INIT], [2, 3], [5, 5], spouts=["s"]))
    assert shard.pending_trees == 0


def test_apply_and_advance_route_outcomes_to_the_spout(clock):
    """An acked tree and a timed-out tree both reach the spout's subscription, in order."""
    shard = _shard(clock)

    async def run():
        shard.apply_request(_request([INIT, INIT, ACK], [1, 2, 1], [7, 9, 7], spouts=["s"]))
        clock.advance(100)
        assert shard.advance() == 1
        async with contextlib.aclosing(shard.subscribe("s", incarnation=0, after_sequence=0, limit=10)) as chunks:
            chunk = await _next(chunks)
        return list(zip(chunk.roots.tolist(), chunk.outcomes.tolist()))

    assert asyncio.run(run()) == [(1, Outcome.ACKED), (2, Outcome.TIMED_OUT)]
    assert shard.metrics.sample("acker_subscribers") == 0  # released by aclosing


def test_subscribe_refusals(clock):
    """A bad spout name is refused, a newer subscription supersedes, close ends the stream after what is retained."""
    shard = _shard(clock)

    async def run():
        with pytest.raises(BadSpoutName, match="1 to 256 bytes"):
            await _next(shard.subscribe("", incarnation=0, after_sequence=0, limit=10))
        shard.apply_request(_request([INIT, ACK], [1, 1], [7, 7], spouts=["s"]))
        first = shard.subscribe("s", incarnation=0, after_sequence=0, limit=10)
        assert (await _next(first)).roots.tolist() == [1]
        second = shard.subscribe("s", incarnation=0, after_sequence=0, limit=10)
        assert (await _next(second)).roots == [1]  # not acknowledged by a position: sent again
        with pytest.raises(Superseded):
            await _next(first)
        shard.close()
        with pytest.raises(ShardClosing, match="resubscribe with your position"):
            await _next(second)
        with pytest.raises(ShardClosing, match="subscribe again later"):
            await _next(shard.subscribe("s", incarnation=0, after_sequence=0, limit=10))

    asyncio.run(run())


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_expiry_in_slices_and_apply_collects_only_what_it_touches(clock, engine):
    """advance_slice expires at most its slice; an Apply during the expiry expires only the root it touches."""
    shard = _shard(clock, engine=engine)
    roots = list(range(1, 101))
    shard.apply_request(_request([INIT] * 100, roots, [7] * 100, spouts=["s"]))
    clock.advance(100)
    assert shard.advance_slice(10) == (10, True)
    # An ack for a due root: it times out first (one outcome), the Apply collects nothing else.
    untouched = shard.pending_trees
    shard.apply_request(_request([ACK], [roots[-1]], [7], spouts=["s"]))
    assert shard.pending_trees in (untouched - 1, untouched)  # the touched root may already be collected
    while True:
        n, more = shard.advance_slice(10)
        assert n <= 10
        if not more:
            break
    assert shard.pending_trees == 0
    assert shard.ledger.stats.timed_out == 100 and shard.ledger.stats.acked == 0
    assert shard.hub.retained_for("s") == 100
