"""The acker's side of a layout change over gRPC: moved entries as a HandoffRequest, and sending them to their new owners.

The rules (what moves, what is held or refused meanwhile) are in
:mod:`acker_service.moving.layout` and the ledger engines (``export_moving`` /
``import_entries``); this module only carries entries between ackers. An old
owner hands every acker of the new layout at least one chunk, an empty one
too: the new owner applies the operations it held for the old owner's roots
once it has merged all of that old owner's chunks, so it must learn that
nothing (more) comes.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc
import numpy as np
from acker_protocol.credentials import ChannelSecurity
from acker_protocol.packed_handoff import HandoffColumns, decode_handoff, encode_handoff
from acker_protocol.v1 import acker_pb2

from ..handoff import MovedEntries
from .layout import Layout
from .peers import open_peer_channel

__all__ = [
    "to_request",
    "chunk_bytes",
    "from_bytes",
    "send_handoffs",
    "HANDOFF_DEADLINE",
    "HandoffFailed",
    "HandoffRefused",
    "Chunk",
    "Slice",
    "plan_slices",
]

# One snapshot chunk of a catch-up carries at most this many entries: ~60 bytes each keeps a message
# far below 4 MiB, and merging one holds the receiver's event loop for a few milliseconds only.
ENTRIES_PER_MESSAGE = 20_000
# A cut's first slice to each new owner: the youngest entries, the trees operations still arrive
# for. Small, so it is taken out, sent and merged within milliseconds of the cut.
FIRST_SLICE = 2_000
# The slices after it: each taken out of the ledger, and merged, in one event-loop step of a few
# milliseconds, with a pause between two of one sender, so Apply and the outcome streams go on.
SLICE_ENTRIES = 5_000
SLICE_PAUSE = 0.005
_HANDOFF_METHOD = "/acker_service.v1.Acker/Handoff"
HANDOFF_DEADLINE = 30.0


@dataclass(frozen=True)
class Chunk:
    """Entries for one new owner, named by ``key`` (the receiver merges each key once).

    ``source`` is the sender's shard index in the layout left, ``count`` how many
    chunks it hands this new owner in all; the first one to each new owner
    carries the ``manifest``, the roots of all of them.
    """

    shard: int
    key: int
    entries: MovedEntries
    source: int
    count: int
    manifest: np.ndarray | None = None
    # Why the new owner refused this chunk the last time it was sent ("" if it could not be reached):
    # a refusal is an answer, and the operator is told it, not that the acker was unreachable.
    refusal: str = ""


@dataclass
class Slice:
    """A chunk whose entries are still in the sender's ledger: ``roots`` (refused there since the cut) to take out.

    ``export(roots)`` removes their live entries from the ledger and returns them
    (one event-loop step); :meth:`taken` turns the slice into the :class:`Chunk` sent.
    The other fields are the chunk's.
    """

    shard: int
    key: int
    roots: np.ndarray
    source: int
    count: int
    export: Callable[[np.ndarray], MovedEntries]
    manifest: np.ndarray | None = None
    chunk: Chunk | None = None  # once taken: the entries left the ledger and live here until acknowledged

    def taken(self) -> Chunk:
        """The chunk to send: the slice's entries taken out of the ledger the first time (a root ended there is not in it).

        Later calls return the same chunk, so a cut interrupted after taking a
        slice out (its call cancelled) sends those entries, under the same key, again.
        """
        if self.chunk is None:
            self.chunk = Chunk(self.shard, self.key, self.export(self.roots), self.source, self.count, self.manifest)
        return self.chunk


class HandoffFailed(Exception):
    """A new owner could not take its entries (UNAVAILABLE: the cut may be called again)."""


class HandoffRefused(HandoffFailed):
    """A new owner answered and refused its entries (FAILED_PRECONDITION: calling the cut again will not help).

    For example an acker restarted after an earlier cut of the same move: it
    merged the chunks before its restart and refuses the new ones.
    """


# Codes that say a peer was not reached (or not in time): the chunk may go through at the next cut.
_NOT_REACHED = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNKNOWN,
    }
)


def to_request(epoch: int, moved: MovedEntries) -> acker_pb2.HandoffRequest:
    """Moved entries as a HandoffRequest message of layout ``epoch`` (tests and tools; a cut sends :func:`chunk_bytes`)."""
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


def chunk_bytes(epoch: int, chunk: Chunk) -> bytes:
    """A chunk as serialized HandoffRequest bytes, written from its columns (no Python object per entry)."""
    m = chunk.entries
    return encode_handoff(
        epoch,
        m.roots,
        m.values,
        m.spouts,
        m.spout_index,
        m.ages_us,
        m.generations,
        m.failed,
        m.resets,
        m.key_counts,
        m.keys,
        chunk_key=chunk.key,
        source=chunk.source,
        chunks=chunk.count,
        manifest=chunk.manifest,
    )


def from_bytes(data: bytes) -> tuple[HandoffColumns, MovedEntries]:
    """The header and moved entries of HandoffRequest bytes (ValueError, with the reason, when they are not valid)."""
    h = decode_handoff(data)
    if len(h.spout_index) and (int(h.spout_index.min()) < -1 or int(h.spout_index.max()) >= 2**31):
        raise ValueError("moved entries: a spout index is outside the spout names (-1: no init yet)")
    moved = MovedEntries(
        h.roots,
        h.values,
        h.spouts,
        h.spout_index.astype(np.int32),
        h.ages_us,
        h.generations.astype(np.uint8),
        h.failed,
        h.resets.astype(np.uint32),
        h.key_counts.astype(np.uint32),
        h.keys,
    )
    return h, moved


def from_request(request: acker_pb2.HandoffRequest) -> MovedEntries:
    """The moved entries of a HandoffRequest message (a catch-up's snapshot chunk): read as :func:`from_bytes` reads them."""
    return from_bytes(request.SerializeToString())[1]


def plan_slices(
    roots: np.ndarray,
    ages_us: np.ndarray,
    layout: Layout,
    source: int,
    export: Callable[[np.ndarray], MovedEntries],
    targets: np.ndarray | None = None,
) -> list[Slice]:
    """Split the roots a cut gives away by new owner into slices, youngest first, each taken out only when sent.

    ``targets``: the new shard index of each root instead of ``root % layout.count``
    (two replicas: the one new keeper each copy goes to,
    :meth:`~acker_service.moving.layout.LayoutMachine.handoff_targets`).
    Every shard of ``layout`` but the sender's own place in it gets at least one
    slice (an empty one when nothing moves there). The first slice to each new
    owner is small (:data:`FIRST_SLICE`, the youngest trees, the ones operations
    still arrive for) and carries the manifest, every root of all its slices:
    the new owner applies what it held for a root in it, or in no slice (a tree
    started after the cut), as soon as that slice is merged, while the old trees
    follow in slices of :data:`SLICE_ENTRIES`.
    """
    roots = np.asarray(roots, np.uint64)
    owners = (roots % np.uint64(layout.count)).astype(np.int64) if targets is None else np.asarray(targets, np.int64)
    slices = []
    for shard in range(layout.count):
        if shard == layout.index:
            continue
        mine = owners == shard
        part = roots[mine][np.argsort(np.asarray(ages_us)[mine], kind="stable")]
        bounds = [0] + list(range(min(FIRST_SLICE, len(part)), len(part), SLICE_ENTRIES)) + [len(part)]
        pieces = [part[lo:hi] for lo, hi in zip(bounds, bounds[1:]) if hi > lo] or [part]
        slices += [
            Slice(shard, secrets.randbits(64) or 1, piece, source, len(pieces), export, part if i == 0 else None)
            for i, piece in enumerate(pieces)
        ]
    return slices


async def send_handoffs(
    chunks: list[Chunk | Slice],
    layout: Layout,
    metadata: tuple[tuple[str, str], ...] = (),
    security: ChannelSecurity | None = None,
) -> list[Chunk | Slice]:
    """Send each chunk to its new owner (the new owners at once); return the chunks not acknowledged.

    A :class:`Slice` is taken out of the ledger just before it is sent (one
    event-loop step each), so a new owner's first slice leaves at once and the
    others follow; one not acknowledged comes back as a :class:`Chunk`.

    ``security``: how to reach the other ackers (:func:`acker_service.moving.peers.peer_security`;
    None: plaintext). ``metadata``: the caller's authorization, sent with each chunk.

    A chunk whose call failed may still have been merged (a lost answer): it is
    sent again unchanged by the next cut, and its key makes the receiver
    acknowledge it without merging twice.
    """
    if chunks and not layout.addresses:
        raise HandoffFailed("the new layout names no addresses; PrepareLayout must carry every shard's address")
    by_shard: dict[int, list[Chunk | Slice]] = {}
    for chunk in chunks:
        by_shard.setdefault(chunk.shard, []).append(chunk)
    channels: dict[int, grpc.aio.Channel] = {}
    try:
        for shard in by_shard:
            address = layout.addresses[shard]
            try:
                channels[shard] = open_peer_channel(address, security)
            except (OSError, ValueError) as exc:  # a peer TLS file went missing or is broken since the start
                # The caller keeps every chunk (resent ones merge once): nothing is lost.
                raise HandoffFailed(
                    f"cannot open a channel to {address}: {exc}; the moved entries are kept here, "
                    "fix the peer TLS files and call CutLayout again"
                ) from exc
    except HandoffFailed:
        for channel in channels.values():
            await channel.close()
        raise

    async def send(shard: int, mine: list[Chunk | Slice], pause: float = 0.0) -> list[Chunk | Slice]:
        # Bytes in (no request serializer): the chunk is encoded from its columns.
        call = channels[shard].unary_unary(_HANDOFF_METHOD, response_deserializer=acker_pb2.HandoffResponse.FromString)
        left: list[Chunk | Slice] = []
        for item in mine:
            if pause:
                await asyncio.sleep(pause)
            chunk = item.taken() if isinstance(item, Slice) else item
            if len(chunk.entries) <= FIRST_SLICE:
                data = chunk_bytes(layout.epoch, chunk)  # a millisecond or two: not worth a thread's queue
            else:
                data = await asyncio.to_thread(chunk_bytes, layout.epoch, chunk)  # off the event loop serving Apply
            try:
                await call(data, timeout=HANDOFF_DEADLINE, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                refusal = "" if exc.code() in _NOT_REACHED else f"{exc.code().name}: {exc.details()}"
                left.append(replace(chunk, refusal=refusal) if refusal != chunk.refusal else chunk)
        return left

    try:
        # Every new owner's first chunk (the youngest trees, and the manifest) before any other
        # slice is taken out: a later slice's export holds this event loop for milliseconds.
        firsts = await asyncio.gather(*(send(shard, mine[:1]) for shard, mine in by_shard.items()))
        rests = await asyncio.gather(*(send(shard, mine[1:], SLICE_PAUSE) for shard, mine in by_shard.items()))
    finally:
        for channel in channels.values():
            await channel.close()
    return [chunk for left in firsts + rests for chunk in left]
