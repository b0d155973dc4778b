"""The Acker gRPC servicer: translates between protobuf and a :class:`~acker_service.shard.Shard`, nothing more.

All methods run on the server's event loop, the only place the shard is
touched, so nothing here needs a lock.
"""

from __future__ import annotations

import contextlib
from typing import cast

import grpc
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from ._version import __version__
from .batch import Batch, BatchError, BatchTooLarge, InvalidBatch, WrongShard
from .shard import BadSpoutName, Shard, ShardClosing, SubscribeRefused, Superseded

__all__ = ["AckerServicer", "OUTCOMES_PER_MESSAGE"]

# Outcomes per OutcomeBatch message: ~20 bytes each, so well under any message limit.
OUTCOMES_PER_MESSAGE = 4096

_STATUS_OF = {
    InvalidBatch: grpc.StatusCode.INVALID_ARGUMENT,
    BatchTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WrongShard: grpc.StatusCode.FAILED_PRECONDITION,
    BadSpoutName: grpc.StatusCode.INVALID_ARGUMENT,
    ShardClosing: grpc.StatusCode.UNAVAILABLE,
    Superseded: grpc.StatusCode.ABORTED,
}


class AckerServicer(acker_pb2_grpc.AckerServicer):
    """Apply, Subscribe and Describe for one shard."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard

    async def Apply(self, request: acker_pb2.ApplyRequest, context: grpc.aio.ServicerContext):
        """Decode the batch, let the shard apply it, report the counts (or why nothing was applied)."""
        batch = Batch.of(
            request.kinds,
            request.root_ids,
            request.values,
            request.dedup_keys,
            request.spouts,
            request.spout_index,
        )
        try:
            result = self._shard.apply(batch)
        except BatchError as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            return acker_pb2.ApplyResponse(
                applied=result.applied, deduplicated=result.deduplicated, ignored=result.ignored
            )
        await context.abort(status, message)

    async def Subscribe(self, request: acker_pb2.SubscribeRequest, context: grpc.aio.ServicerContext):
        """Stream the spout's retained outcomes after the resume position, then live ones."""
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
                    yield acker_pb2.OutcomeBatch(
                        incarnation=incarnation,
                        first_sequence=chunk.first_sequence,
                        root_ids=chunk.roots,
                        # Plain ints from the (protobuf-free) hub are the enum's wire values.
                        outcomes=cast("list[acker_pb2.Outcome.ValueType]", chunk.outcomes),
                        latency_micros=chunk.latency_micros,
                        dropped=chunk.dropped,
                    )
        except SubscribeRefused as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            return
        await context.abort(status, message)

    async def Describe(self, request: acker_pb2.DescribeRequest, context: grpc.aio.ServicerContext):
        """Shard, timeouts, retention, pending trees and version."""
        c = self._shard.config
        return acker_pb2.DescribeResponse(
            shard_index=c.shard_index,
            shard_count=c.shard_count,
            message_timeout_seconds=c.message_timeout,
            buckets=c.buckets,
            pending_trees=self._shard.pending_trees,
            version=__version__,
            max_batch=c.max_batch,
            incarnation=self._shard.incarnation,
            retain_outcomes=c.retain_outcomes,
            retain_seconds=c.retain_seconds,
        )
