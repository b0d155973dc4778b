"""The acker's side of a layout change over gRPC: moved entries as a HandoffRequest, and sending them to their new owners.

The rules (what moves, when Apply is held) are in :mod:`acker_service.layout`
and the ledger engines (``export_moving`` / ``import_entries``); this module
only carries entries between ackers.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import grpc
import numpy as np
from acker_protocol.credentials import ChannelSecurity
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from .handoff import MovedEntries
from .layout import Layout
from .peers import open_peer_channel

__all__ = ["to_request", "from_request", "send_handoffs", "HANDOFF_DEADLINE", "HandoffFailed", "Chunk", "plan_handoffs"]

# One handoff carries at most this many entries: ~60 bytes each keeps a message far below 4 MiB.
ENTRIES_PER_MESSAGE = 50_000
HANDOFF_DEADLINE = 30.0


@dataclass(frozen=True)
class Chunk:
    """Entries for one new owner, named by ``key`` (the receiver merges each key once)."""

    shard: int
    key: int
    entries: MovedEntries


class HandoffFailed(Exception):
    """A new owner could not take its entries (UNAVAILABLE: the cut may be called again)."""


def to_request(epoch: int, moved: MovedEntries) -> acker_pb2.HandoffRequest:
    """Moved entries as a HandoffRequest of layout ``epoch``."""
    return acker_pb2.HandoffRequest(
        epoch=epoch,
        root_ids=moved.roots.tolist(),
        values=moved.values.tolist(),
        spouts=moved.spouts,
        spout_index=moved.spout_index.tolist(),
        ages_micros=moved.ages_us.tolist(),
        generations=moved.generations.tolist(),
        failed=moved.failed.tolist(),
        resets=moved.resets.tolist(),
        key_counts=moved.key_counts.tolist(),
        dedup_keys=moved.keys.tolist(),
    )


def from_request(request: acker_pb2.HandoffRequest) -> MovedEntries:
    """The moved entries of a HandoffRequest (ValueError, with the reason, when its columns disagree)."""
    return MovedEntries(
        np.array(request.root_ids, np.uint64),
        np.array(request.values, np.uint64),
        list(request.spouts),
        np.array(request.spout_index, np.int32),
        np.array(request.ages_micros, np.uint64),
        np.array(request.generations, np.uint8),
        np.array(request.failed, np.bool_),
        np.array(request.resets, np.uint32),
        np.array(request.key_counts, np.uint32),
        np.array(request.dedup_keys, np.uint64),
    )


def _chunks(moved: MovedEntries) -> list[MovedEntries]:
    n = len(moved)
    if n <= ENTRIES_PER_MESSAGE:
        return [moved]
    ids = np.arange(n)
    return [moved.select((ids >= lo) & (ids < lo + ENTRIES_PER_MESSAGE)) for lo in range(0, n, ENTRIES_PER_MESSAGE)]


def plan_handoffs(moved: MovedEntries, layout: Layout) -> list[Chunk]:
    """Split moved entries by new owner (``root % layout.count``) into named chunks, ready to send and to resend."""
    if not len(moved):
        return []
    owners = (moved.roots % np.uint64(layout.count)).astype(np.int64)
    return [
        Chunk(shard, secrets.randbits(64) or 1, chunk)
        for shard in np.unique(owners).tolist()
        for chunk in _chunks(moved.select(owners == shard))
    ]


async def send_handoffs(
    chunks: list[Chunk],
    layout: Layout,
    metadata: tuple[tuple[str, str], ...] = (),
    security: ChannelSecurity | None = None,
) -> list[Chunk]:
    """Send each chunk to its new owner; return the chunks not acknowledged (to be sent again by the next cut).

    ``security``: how to reach the other ackers (:func:`acker_service.peers.peer_security`;
    None: plaintext). ``metadata``: the caller's authorization, sent with each chunk.

    A chunk whose call failed may still have been merged (a lost answer): it is
    sent again unchanged, and its key makes the receiver acknowledge it without
    merging twice.
    """
    if chunks and not layout.addresses:
        raise HandoffFailed("the new layout names no addresses; PrepareLayout must carry every shard's address")
    left: list[Chunk] = []
    channels: dict[str, grpc.aio.Channel] = {}
    try:
        for chunk in chunks:
            address = layout.addresses[chunk.shard]
            if address not in channels:
                try:
                    channels[address] = open_peer_channel(address, security)
                except (OSError, ValueError) as exc:  # a peer TLS file went missing or is broken since the start
                    # The caller keeps every chunk (resent ones merge once): nothing is lost.
                    raise HandoffFailed(
                        f"cannot open a channel to {address}: {exc}; the moved entries are kept here, "
                        "fix the peer TLS files and call CutLayout again"
                    ) from exc
            stub = acker_pb2_grpc.AckerStub(channels[address])
            request = to_request(layout.epoch, chunk.entries)
            request.chunk_key = chunk.key
            try:
                await stub.Handoff(request, timeout=HANDOFF_DEADLINE, metadata=metadata)
            except grpc.aio.AioRpcError:
                left.append(chunk)
    finally:
        for channel in channels.values():
            await channel.close()
    return left
