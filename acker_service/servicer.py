"""The Acker gRPC servicer: translates between protobuf and the ledger and outcome hub.

All methods run on the server's event loop, the only place the ledger and the
hub are touched, so nothing here needs a lock. Apply receives the request's raw
bytes (see :func:`add_acker_servicer`): the ledger engine decodes them, so the
native engine never builds a Python object per operation.
"""

from __future__ import annotations

import asyncio
from typing import cast

import grpc

from ._version import __version__
from .batch import MAX_SPOUT_NAME_BYTES, BatchTooLarge, InvalidBatch, WrongShard
from .config import ServerConfig
from .engines import Engine
from .metrics import AckerMetrics
from .outcome_columns import OutcomeColumns
from .outcome_hub import OutcomeHub
from .v1 import acker_pb2, acker_pb2_grpc

__all__ = ["AckerServicer", "OUTCOMES_PER_MESSAGE", "add_acker_servicer"]

# Outcomes per OutcomeBatch message: ~20 bytes each, so well under any message limit.
OUTCOMES_PER_MESSAGE = 4096

_STATUS_OF = {
    InvalidBatch: grpc.StatusCode.INVALID_ARGUMENT,
    BatchTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WrongShard: grpc.StatusCode.FAILED_PRECONDITION,
}


class AckerServicer(acker_pb2_grpc.AckerServicer):
    """Apply, Subscribe and Describe for one shard."""

    def __init__(
        self, config: ServerConfig, ledger: Engine, hub: OutcomeHub, metrics: AckerMetrics, incarnation: int
    ) -> None:
        self._config = config
        self._ledger = ledger
        self._hub = hub
        self._metrics = metrics
        self._incarnation = incarnation
        self._closing = False

    # The generated base class types the request as ApplyRequest; here it is its bytes (add_acker_servicer).
    async def Apply(self, request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[override]
        """Decode and validate the whole batch, apply it, route the outcomes it produced."""
        config = self._config
        try:
            result = self._ledger.apply_request(
                request,
                shard_index=config.shard_index,
                shard_count=config.shard_count,
                max_batch=config.max_batch,
            )
        except (InvalidBatch, BatchTooLarge, WrongShard) as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            self.settle(result.ended)
            # Not ends, so no latency or outcome metrics: only the spout must know.
            self._hub.publish_columns(result.timeout_resets)
            self._metrics.batch_operations.observe(result.operations)
            return acker_pb2.ApplyResponse(
                applied=result.applied, deduplicated=result.deduplicated, ignored=result.ignored
            )
        await context.abort(status, message)

    async def Subscribe(self, request: acker_pb2.SubscribeRequest, context: grpc.aio.ServicerContext):
        """Stream the spout's retained outcomes after the resume position, then live ones."""
        spout = request.spout
        size = len(spout.encode("utf-8"))
        if not 1 <= size <= MAX_SPOUT_NAME_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"spout name is {size} bytes; name the spout used in INIT operations (1 to "
                f"{MAX_SPOUT_NAME_BYTES} bytes)",
            )
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this acker is shutting down; subscribe again later")
        wakeup = asyncio.Event()
        subscription = self._hub.subscribe(
            spout, incarnation=request.incarnation, after_sequence=request.after_sequence, wake=wakeup.set
        )
        try:
            while True:
                if subscription.superseded:
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        f"a newer Subscribe for spout {spout!r} took over; one subscription per spout per acker",
                    )
                chunk = self._hub.take(subscription, OUTCOMES_PER_MESSAGE)
                if chunk is not None:
                    yield acker_pb2.OutcomeBatch(
                        incarnation=self._incarnation,
                        first_sequence=chunk.first_sequence,
                        root_ids=chunk.roots,
                        # Plain ints from the (protobuf-free) hub are the enum's wire values.
                        outcomes=cast("list[acker_pb2.Outcome.ValueType]", chunk.outcomes),
                        latency_micros=chunk.latency_micros,
                        dropped=chunk.dropped,
                    )
                elif self._closing:
                    # Everything retained was sent; the spout resumes from its position elsewhere.
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        "this acker is shutting down; resubscribe with your position",
                    )
                else:
                    wakeup.clear()
                    await wakeup.wait()
        finally:
            self._hub.unsubscribe(subscription)

    async def Describe(self, request: acker_pb2.DescribeRequest, context: grpc.aio.ServicerContext):
        """Shard, timeouts, retention, pending trees and version."""
        c = self._config
        return acker_pb2.DescribeResponse(
            shard_index=c.shard_index,
            shard_count=c.shard_count,
            message_timeout_seconds=c.message_timeout,
            buckets=c.buckets,
            pending_trees=self._ledger.pending_trees,
            version=__version__,
            max_batch=c.max_batch,
            incarnation=self._incarnation,
            retain_outcomes=c.retain_outcomes,
            retain_seconds=c.retain_seconds,
        )

    def advance(self) -> int:
        """Expire due trees and old retained outcomes; return how many trees timed out."""
        timed_out = self._ledger.advance_columns()
        self.settle(timed_out)
        self._hub.expire()
        return len(timed_out)

    def settle(self, ended: OutcomeColumns) -> None:
        """Record and route the outcomes of ended trees, refresh the scrape-time gauges."""
        if len(ended):
            self._metrics.complete_latency.observe_many(ended.latency_seconds())
            self._hub.publish_columns(ended)
        self._metrics.refresh_gauges(self._ledger.pending_trees, self._ledger.orphan_entries)

    def close_streams(self) -> None:
        """End every Subscribe stream once it has sent what is retained (shutdown)."""
        self._closing = True
        self._hub.wake_all()


def _raw_request(data: bytes) -> bytes:
    """Apply's request deserializer: none; the ledger engine decodes the bytes itself."""
    return data


def add_acker_servicer(servicer: AckerServicer, server: grpc.aio.Server) -> None:
    """Register the servicer like the generated ``add_AckerServicer_to_server``, but Apply gets raw bytes.

    The native engine decodes ``ApplyRequest`` in Rust; the reference engine decodes
    with protobuf. Either way a request that does not decode is INVALID_ARGUMENT
    (a failing deserializer would surface as a less helpful status).
    """
    handlers = {
        "Apply": grpc.unary_unary_rpc_method_handler(
            servicer.Apply,
            request_deserializer=_raw_request,
            response_serializer=acker_pb2.ApplyResponse.SerializeToString,
        ),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            servicer.Subscribe,
            request_deserializer=acker_pb2.SubscribeRequest.FromString,
            response_serializer=acker_pb2.OutcomeBatch.SerializeToString,
        ),
        "Describe": grpc.unary_unary_rpc_method_handler(
            servicer.Describe,
            request_deserializer=acker_pb2.DescribeRequest.FromString,
            response_serializer=acker_pb2.DescribeResponse.SerializeToString,
        ),
    }
    service = acker_pb2.DESCRIPTOR.services_by_name["Acker"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)
