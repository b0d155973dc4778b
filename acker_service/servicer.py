"""The Acker gRPC servicer: translates between protobuf and a :class:`~acker_service.shard.Shard`, nothing more.

All methods run on the server's event loop, the only place the shard is
touched, so nothing here needs a lock. Apply receives the request's raw bytes
(see :func:`add_acker_servicer`): the shard's ledger engine decodes them, so the
native engine never builds a Python object per operation. Subscribe streams
``OutcomeBatch`` bytes written straight from the hub's columns
(:func:`~acker_protocol.packed.encode_outcome_batch`), never a Python object per
outcome either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import cast

import grpc
from acker_protocol.packed import encode_outcome_batch
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import Outcome

from ._version import __version__
from .apply_stream import RefusedRequest, serve_apply_stream
from .batch import BatchError, BatchTooLarge, InvalidBatch, WrongShard
from .moving.catchup_peer import snapshot_chunks
from .moving.layout import CUT, ApplyHeld, Layout, LayoutMachine, LayoutRefused
from .moving.layout_file import LayoutNotRecorded
from .moving.reshard import HandoffFailed, HandoffRefused, from_bytes
from .shard import BadSpoutName, Shard, ShardClosing, SubscribeRefused, Superseded, TooManySubscriptions
from .tree_info import TreeInfo

__all__ = ["AckerServicer", "OUTCOMES_PER_MESSAGE", "add_acker_servicer"]

# Outcomes per OutcomeBatch message: ~20 bytes each, so well under any message limit.
OUTCOMES_PER_MESSAGE = 4096
# A Handoff up to this size is decoded on the event loop (about a millisecond): a cut's first chunk
# to each new owner (its youngest entries and the manifest of every root coming) is this small.
_DECODE_INLINE_BYTES = 1 << 20

_STATUS_OF = {
    InvalidBatch: grpc.StatusCode.INVALID_ARGUMENT,
    BatchTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WrongShard: grpc.StatusCode.FAILED_PRECONDITION,
    ApplyHeld: grpc.StatusCode.UNAVAILABLE,
    LayoutRefused: grpc.StatusCode.FAILED_PRECONDITION,
    HandoffFailed: grpc.StatusCode.UNAVAILABLE,
    HandoffRefused: grpc.StatusCode.FAILED_PRECONDITION,
    LayoutNotRecorded: grpc.StatusCode.UNAVAILABLE,
    BadSpoutName: grpc.StatusCode.INVALID_ARGUMENT,
    ShardClosing: grpc.StatusCode.UNAVAILABLE,
    TooManySubscriptions: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Superseded: grpc.StatusCode.ABORTED,
}


class AckerServicer(acker_pb2_grpc.AckerServicer):
    """Apply, ApplyStream, Subscribe, Describe, Inspect and ForceFail for one shard."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard
        self._membership = shard.membership  # the layout, its changes and the catch-up

    # The generated base class types the request as ApplyRequest; here it is its bytes (add_acker_servicer).
    async def Apply(self, request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[override]
        """Let the shard decode, validate and apply the request; report the counts (or why nothing was applied)."""
        try:
            result = self._shard.apply_request(request)
        except BatchError as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            return acker_pb2.ApplyResponse(
                applied=result.applied, deduplicated=result.deduplicated, ignored=result.ignored, held=result.held
            )
        await context.abort(status, message)

    # The generated base class types the requests as ApplyRequest; here they are their bytes (add_acker_servicer).
    async def ApplyStream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[bytes | RefusedRequest], context: grpc.aio.ServicerContext
    ):
        """Apply each request of the stream as Apply would and answer it with an ApplyAck, in order."""
        # An async generator itself (not one returned): interceptors tell streaming behaviours by that.
        async for ack in serve_apply_stream(self._shard, _STATUS_OF, request_iterator, context):
            yield ack

    # The generated base class types the responses as OutcomeBatch; here they are its bytes (add_acker_servicer).
    async def Subscribe(self, request: acker_pb2.SubscribeRequest, context: grpc.aio.ServicerContext):  # type: ignore[override]
        """Stream the spout's retained outcomes after the resume position, then live ones, as OutcomeBatch bytes."""
        incarnation = self._shard.incarnation
        chunks = self._shard.subscribe(
            request.spout,
            incarnation=request.incarnation,
            after_sequence=request.after_sequence,
            limit=OUTCOMES_PER_MESSAGE,
        )
        try:
            # Headers now, not with the first outcome: the client learns at once
            # that its stream is open again (its backstop pauses until then).
            await context.send_initial_metadata(())
            # aclosing: a cancelled stream releases its subscription now, not at garbage collection.
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield encode_outcome_batch(
                        incarnation,
                        chunk.first_sequence,
                        chunk.roots,
                        chunk.outcomes,
                        chunk.latency_micros,
                        chunk.dropped,
                    )
        except SubscribeRefused as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            return
        await context.abort(status, message)

    async def Inspect(self, request: acker_pb2.InspectRequest, context: grpc.aio.ServicerContext):
        """The state of the requested roots and the oldest pending trees (read-only)."""
        try:
            trees, oldest = self._shard.inspect(list(request.root_ids), request.oldest)
        except BatchError as exc:
            await context.abort(_STATUS_OF[type(exc)], str(exc))
        stats = self._shard.ledger.stats
        return acker_pb2.InspectResponse(
            trees=[_tree_state(t) for t in trees],
            oldest=[_tree_state(t) for t in oldest],
            shard_index=self._shard.config.shard_index,
            incarnation=self._shard.incarnation,
            pending_trees=self._shard.pending_trees,
            trees_initialized=stats.inits,
            trees_acked=stats.acked,
            trees_failed=stats.failed,
            trees_timed_out=stats.timed_out,
        )

    async def ForceFail(self, request: acker_pb2.ForceFailRequest, context: grpc.aio.ServicerContext):
        """End the named pending trees, or all of one spout's, FAILED now."""
        roots = list(request.root_ids)
        if bool(roots) == bool(request.spout):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "give either root_ids or spout (not both, not neither); nothing failed",
            )
        try:
            ended = self._shard.force_fail(roots) if roots else self._shard.force_fail_spout(request.spout)
        except (BatchError, SubscribeRefused) as exc:
            await context.abort(_STATUS_OF[type(exc)], str(exc))
        failed = ended.outcomes == int(Outcome.FAILED)
        return acker_pb2.ForceFailResponse(
            failed=int(failed.sum()),
            timed_out=int(len(ended) - failed.sum()),
            failed_root_ids=ended.roots[failed].tolist() if roots else [],
        )

    async def Describe(self, request: acker_pb2.DescribeRequest, context: grpc.aio.ServicerContext):
        """Shard, timeouts, retention, pending trees and version."""
        c = self._shard.config
        layout = self._membership.layout.current
        return acker_pb2.DescribeResponse(
            # The current layout's place (a drained acker, index -1, keeps its last one).
            shard_index=layout.index if layout.index >= 0 else c.shard_index,
            shard_count=layout.count,
            message_timeout_seconds=c.message_timeout,
            buckets=c.buckets,
            pending_trees=self._shard.pending_trees,
            version=__version__,
            max_batch=c.max_batch,
            incarnation=self._shard.incarnation,
            retain_outcomes=c.retain_outcomes,
            retain_seconds=c.retain_seconds,
            timeout_mode=c.timeout_mode,
            max_tree_lifetime_seconds=c.max_tree_lifetime,
            replicas=c.replicas,
            apply_stream=True,
            layout=_layout_message(self._membership.layout.current),
            move_state=self._membership.layout.state,
            catchup_state=self._membership.catchup.state,
            catchup_entries=self._membership.catchup.copied_entries,
            # Only once cut: before, this acker refuses no moving root, and a client that routed by the
            # next layout could reach an acker not prepared for it yet.
            next_layout=_layout_message(self._membership.layout.next if self._membership.layout.state == CUT else None),
            tree_counts=_tree_counts(self._shard),
        )

    # -- layout changes (the rules are in moving/layout.py and the ledger engines) --

    async def PrepareLayout(self, request: acker_pb2.PrepareLayoutRequest, context: grpc.aio.ServicerContext):
        """Learn this acker's place in the next layout (and in the one left): hold the roots moving here."""
        m, p = request.layout, request.previous
        previous = (
            Layout(p.epoch, p.shard_count, p.shard_index, tuple(p.addresses)) if request.HasField("previous") else None
        )
        try:
            self._membership.prepare_layout(Layout(m.epoch, m.shard_count, m.shard_index, tuple(m.addresses)), previous)
        except (LayoutRefused, LayoutNotRecorded) as exc:
            await context.abort(_STATUS_OF[type(exc)], str(exc))
        return _layout_response(self._membership.layout)

    async def CutLayout(self, request: acker_pb2.CutLayoutRequest, context: grpc.aio.ServicerContext):
        """Take out the entries the next layout gives away, refuse their roots, and hand them to their new owners."""
        # The handoffs carry the caller's credentials: an operator allowed to cut may hand over.
        metadata = tuple((k, v) for k, v in context.invocation_metadata() or () if k == "authorization")
        try:
            trees, entries = await self._membership.cut_layout(request.epoch, metadata)
        except (LayoutRefused, HandoffFailed) as exc:
            await context.abort(_STATUS_OF[type(exc)], str(exc))
        return acker_pb2.CutLayoutResponse(moved_trees=trees, moved_entries=entries)

    async def CommitLayout(self, request: acker_pb2.CommitLayoutRequest, context: grpc.aio.ServicerContext):
        """Make the next layout the current one."""
        try:
            self._membership.commit_layout(request.epoch)
        except LayoutRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return _layout_response(self._membership.layout)

    # The generated base class types the request as HandoffRequest; here it is its bytes (add_acker_servicer).
    async def Handoff(self, request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[override]
        """Merge the entries another acker hands over in a cut."""
        try:
            # Off the event loop serving Apply (only the merge itself must run on it), but for a
            # small chunk, a cut's first one, whose held operations wait for it: a thread's queue costs more.
            if len(request) <= _DECODE_INLINE_BYTES:
                h, moved = from_bytes(request)
            else:
                h, moved = await asyncio.to_thread(from_bytes, request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc}; nothing merged")
        try:
            imported = self._membership.take_handoff(h.epoch, h.source, h.chunks, h.chunk_key, moved, h.manifest)
        except (LayoutRefused, BatchError) as exc:
            await context.abort(_STATUS_OF.get(type(exc), grpc.StatusCode.FAILED_PRECONDITION), str(exc))
        return acker_pb2.HandoffResponse(imported=imported)

    # -- a restarted replica's catch-up (--replicas 2; moving/catchup.py) --

    async def Snapshot(self, request: acker_pb2.SnapshotRequest, context: grpc.aio.ServicerContext):
        """Copy one of this acker's ranges for a restarted partner (in one step) and stream it in chunks."""
        try:
            moved = self._membership.snapshot(request.shard_count, request.range)
        except BatchError as exc:
            await context.abort(_STATUS_OF[type(exc)], str(exc))
        for chunk in snapshot_chunks(moved, self._shard.incarnation):
            yield chunk


def _layout_message(layout: Layout | None) -> acker_pb2.Layout | None:
    if layout is None:
        return None
    return acker_pb2.Layout(
        epoch=layout.epoch, shard_count=layout.count, shard_index=layout.index, addresses=list(layout.addresses)
    )


def _layout_response(machine: LayoutMachine) -> acker_pb2.LayoutResponse:
    return acker_pb2.LayoutResponse(
        layout=_layout_message(machine.current), move_state=machine.state, next_layout=_layout_message(machine.next)
    )


def _tree_state(info: TreeInfo) -> acker_pb2.TreeState:
    """One root's state on the wire."""
    return acker_pb2.TreeState(
        root_id=info.root,
        status=cast("acker_pb2.TreeStatus.ValueType", int(info.status)),
        age_seconds=info.age_seconds,
        spout=info.spout or "",
        failed=info.failed,
        resets=info.resets,
        dedup_keys=info.dedup_keys,
    )


def _raw(data: bytes) -> bytes:
    """Apply's and ApplyStream's request deserializer, Subscribe's response serializer: none, the bytes are the message."""
    return data


def add_acker_servicer(servicer: AckerServicer, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated ``add_AckerServicer_to_server``, but with bytes where it pays.

    Apply, ApplyStream and Handoff get raw request bytes; Subscribe yields serialized OutcomeBatch bytes.

    The native engine decodes ``ApplyRequest`` in Rust; the reference engine decodes
    with protobuf. Either way a request that does not decode is INVALID_ARGUMENT
    (a failing deserializer would surface as a less helpful status).
    """
    handlers = {
        "Apply": grpc.unary_unary_rpc_method_handler(
            servicer.Apply,
            request_deserializer=_raw,
            response_serializer=acker_pb2.ApplyResponse.SerializeToString,
        ),
        "ApplyStream": grpc.stream_stream_rpc_method_handler(
            servicer.ApplyStream,
            request_deserializer=_raw,
            response_serializer=acker_pb2.ApplyAck.SerializeToString,
        ),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            servicer.Subscribe,
            request_deserializer=acker_pb2.SubscribeRequest.FromString,
            response_serializer=_raw,
        ),
        "Snapshot": grpc.unary_stream_rpc_method_handler(
            servicer.Snapshot,
            request_deserializer=acker_pb2.SnapshotRequest.FromString,
            response_serializer=acker_pb2.SnapshotChunk.SerializeToString,
        ),
        "Describe": grpc.unary_unary_rpc_method_handler(
            servicer.Describe,
            request_deserializer=acker_pb2.DescribeRequest.FromString,
            response_serializer=acker_pb2.DescribeResponse.SerializeToString,
        ),
        "Inspect": grpc.unary_unary_rpc_method_handler(
            servicer.Inspect,
            request_deserializer=acker_pb2.InspectRequest.FromString,
            response_serializer=acker_pb2.InspectResponse.SerializeToString,
        ),
        "ForceFail": grpc.unary_unary_rpc_method_handler(
            servicer.ForceFail,
            request_deserializer=acker_pb2.ForceFailRequest.FromString,
            response_serializer=acker_pb2.ForceFailResponse.SerializeToString,
        ),
        # The steps of a layout change (prepare, cut, handoff, commit), plain protobuf both ways.
        **{
            name: grpc.unary_unary_rpc_method_handler(
                getattr(servicer, name),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
            for name, request, response in (
                ("PrepareLayout", acker_pb2.PrepareLayoutRequest, acker_pb2.LayoutResponse),
                ("CutLayout", acker_pb2.CutLayoutRequest, acker_pb2.CutLayoutResponse),
                ("CommitLayout", acker_pb2.CommitLayoutRequest, acker_pb2.LayoutResponse),
            )
        },
        # Bytes in: moved entries decode into columns (acker_protocol.packed_handoff), never an object per entry.
        "Handoff": grpc.unary_unary_rpc_method_handler(
            servicer.Handoff,
            request_deserializer=_raw,
            response_serializer=acker_pb2.HandoffResponse.SerializeToString,
        ),
    }
    service = acker_pb2.DESCRIPTOR.services_by_name["Acker"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def _tree_counts(shard: Shard) -> acker_pb2.TreeCounts:
    """The terms of the conservation identity for this acker lifetime (acker_service.moving.transfers)."""
    stats, t = shard.ledger.stats, shard.metrics.transfers
    return acker_pb2.TreeCounts(
        trees_initialized=stats.inits,
        acked=stats.acked,
        failed=stats.failed,
        timed_out=stats.timed_out,
        trees_copied_in_handoff=t.handoff_in_trees,
        trees_copied_in_catchup=t.catchup_in_trees,
        trees_copied_out_handoff=t.handoff_out_trees,
        trees_copied_out_snapshot=t.snapshot_out_trees,
    )
