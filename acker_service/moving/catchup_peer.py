"""A restarted replica's catch-up over gRPC: a range's copy as SnapshotChunk messages, and asking partners for theirs.

The rules (what is held, when the copy is installed) are in
:mod:`acker_service.moving.catchup`; this module only carries copies between ackers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc
import numpy as np
from acker_protocol.credentials import ChannelSecurity
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from ..handoff import MovedEntries
from .peers import open_peer_channel
from .reshard import ENTRIES_PER_MESSAGE, from_request, to_request

__all__ = ["snapshot_chunks", "fetch_snapshot", "catch_up", "peer_channel", "SNAPSHOT_DEADLINE"]

log = logging.getLogger(__name__)

# One copy, all its chunks: a million entries travel in a few seconds.
SNAPSHOT_DEADLINE = 120.0
# Pauses between attempts on a partner that does not answer (doubling, with jitter).
RETRY_INITIAL, RETRY_MAX = 0.2, 5.0


def snapshot_chunks(moved: MovedEntries | None, incarnation: int) -> Iterator[acker_pb2.SnapshotChunk]:
    """A copy as chunks of at most ENTRIES_PER_MESSAGE entries, the last one marked; None (lost): one lost chunk.

    Built one at a time as the stream is read: between two chunks the partner's
    event loop serves Apply again, so a large copy does not stall its clients.
    """
    if moved is None:
        yield acker_pb2.SnapshotChunk(last=True, lost=True, incarnation=incarnation)
        return
    n = len(moved)
    if n <= ENTRIES_PER_MESSAGE:
        yield acker_pb2.SnapshotChunk(entries=to_request(0, moved), last=True, incarnation=incarnation)
        return
    ids = np.arange(n)
    for lo in range(0, n, ENTRIES_PER_MESSAGE):
        part = moved.select((ids >= lo) & (ids < lo + ENTRIES_PER_MESSAGE))
        yield acker_pb2.SnapshotChunk(
            entries=to_request(0, part), last=lo + ENTRIES_PER_MESSAGE >= n, incarnation=incarnation
        )


async def fetch_snapshot(
    stub: acker_pb2_grpc.AckerStub, shard_count: int, range_index: int, timeout: float = SNAPSHOT_DEADLINE
) -> MovedEntries | None:
    """Ask a partner for its copy of ``range_index``; the entries, or None if it lost the range too.

    Raises ``grpc.aio.AioRpcError`` when the partner cannot be reached or the
    stream breaks, and ValueError for a copy whose columns disagree or that
    ends without its last chunk: the caller asks again.
    """
    parts: list[MovedEntries] = []
    call = stub.Snapshot(acker_pb2.SnapshotRequest(shard_count=shard_count, range=range_index), timeout=timeout)
    async for chunk in call:
        if chunk.lost:
            return None
        parts.append(from_request(chunk.entries))
        if chunk.last:
            return MovedEntries.concat(parts)
    raise ValueError("the partner's copy ended before its last chunk")


Install = Callable[[int, "MovedEntries | None"], bool]


def peer_channel(security: ChannelSecurity | None) -> Callable[[str], grpc.aio.Channel]:
    """How to open a channel to a partner: plaintext, or TLS with the token ``security`` names."""
    return lambda address: open_peer_channel(address, security)


async def catch_up(
    waiting: dict[int, int],
    peers: tuple[str, ...],
    shard_count: int,
    install: Install,
    *,
    delay: float,
    give_up_after: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    channel: Callable[[str], grpc.aio.Channel] | None = None,
) -> None:
    """Copy every range of ``waiting`` (range -> partner shard) from its partner and ``install`` it, asking until one comes.

    Waits ``delay`` first (see ``--catchup-delay``). A partner that is down or
    refuses is asked again after a growing pause (0.2 s doubling to 5 s). One
    that stays unreachable for ``give_up_after`` seconds (the message timeout)
    counts as having lost the range: both copies of its trees are gone, and the
    spouts' backstop has declared them LOST by then, so holding Apply longer
    would only delay the trees started since. Runs on the server's event loop
    until every range is installed or it is cancelled.
    """
    open_channel = channel or peer_channel(None)
    await sleep(delay)
    channels: dict[str, grpc.aio.Channel] = {}

    async def copy_range(range_index: int, partner: int) -> None:
        address = peers[partner]
        if address not in channels:
            channels[address] = open_channel(address)
        stub = acker_pb2_grpc.AckerStub(channels[address])
        pause = RETRY_INITIAL
        attempt = 0
        first_failure: float | None = None
        while True:
            attempt += 1
            try:
                moved = await fetch_snapshot(stub, shard_count, range_index)
            except (grpc.aio.AioRpcError, ValueError) as exc:
                first_failure = clock() if first_failure is None else first_failure
                if clock() - first_failure >= give_up_after:
                    log.warning(
                        "catch-up: shard %d (%s) unreachable for %.0f s: range %d counts as lost there too",
                        partner,
                        address,
                        give_up_after,
                        range_index,
                    )
                    install(range_index, None)
                    return
                if attempt == 1 or attempt % 10 == 0:
                    reason = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                    log.warning(
                        "catch-up: range %d not copied from shard %d (%s) yet: %s; asking again",
                        range_index,
                        partner,
                        address,
                        reason,
                    )
                await sleep(pause * random.uniform(0.5, 1.0))
                pause = min(RETRY_MAX, pause * 2)
                continue
            caught_up = install(range_index, moved)
            what = "lost there too" if moved is None else f"{len(moved)} entries, {moved.trees} trees"
            log.info(
                "catch-up: range %d copied from shard %d: %s; caught up: %s", range_index, partner, what, caught_up
            )
            return

    try:
        # Both ranges at once: a partner that is down does not delay the copy of the other range.
        await asyncio.gather(*(copy_range(r, p) for r, p in sorted(waiting.items())))
    finally:
        for ch in channels.values():
            await ch.close()
