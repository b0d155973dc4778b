"""The Acker gRPC servicer: translates between protobuf and the ledger and outcome hub.

All methods run on the server's event loop, the only place the ledger and the
hub are touched, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
from operator import itemgetter
from typing import cast

import grpc

from ._version import __version__
from .batch import MAX_SPOUT_NAME_BYTES, Batch, BatchTooLarge, InvalidBatch, WrongShard, validate_batch
from .config import ServerConfig
from .ledger import Ledger, Resolution
from .metrics import AckerMetrics
from .outcome_hub import OutcomeHub
from .v1 import acker_pb2, acker_pb2_grpc

__all__ = ["AckerServicer", "OUTCOMES_PER_MESSAGE"]

# Outcomes per OutcomeBatch message: ~20 bytes each, so well under any message limit.
OUTCOMES_PER_MESSAGE = 4096

_LATENCY = itemgetter(3)  # Resolution.latency_seconds, without attribute lookups

_STATUS_OF = {
    InvalidBatch: grpc.StatusCode.INVALID_ARGUMENT,
    BatchTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WrongShard: grpc.StatusCode.FAILED_PRECONDITION,
}


class AckerServicer(acker_pb2_grpc.AckerServicer):
    """Apply, Subscribe and Describe for one shard."""

    def __init__(
        self, config: ServerConfig, ledger: Ledger, hub: OutcomeHub, metrics: AckerMetrics, incarnation: int
    ) -> None:
        self._config = config
        self._ledger = ledger
        self._hub = hub
        self._metrics = metrics
        self._incarnation = incarnation
        self._closing = False

    async def Apply(self, request: acker_pb2.ApplyRequest, context: grpc.aio.ServicerContext):
        """Validate the whole batch, apply it, route the outcomes it produced."""
        batch = Batch.of(
            request.kinds,
            request.root_ids,
            request.values,
            request.dedup_keys,
            request.spouts,
            request.spout_index,
        )
        config = self._config
        try:
            validate_batch(
                batch,
                shard_index=config.shard_index,
                shard_count=config.shard_count,
                max_batch=config.max_batch,
            )
        except (InvalidBatch, BatchTooLarge, WrongShard) as exc:
            status, message = _STATUS_OF[type(exc)], str(exc)
        else:
            result = self._ledger.apply_batch(batch)
            self.settle(result.resolutions)
            # Not ends, so no latency or outcome metrics: only the spout must know.
            self._hub.publish(result.timeout_resets)
            self._metrics.batch_operations.observe(len(batch))
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
            # Headers now, not with the first outcome: the client learns at once
            # that its stream is open again (its backstop pauses until then).
            await context.send_initial_metadata(())
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
        resolutions = self._ledger.advance()
        self.settle(resolutions)
        self._hub.expire()
        return len(resolutions)

    def settle(self, resolutions: list[Resolution]) -> None:
        """Record and route the outcomes of ended trees, refresh the scrape-time gauges."""
        if resolutions:
            self._metrics.complete_latency.observe_many(list(map(_LATENCY, resolutions)))
            self._hub.publish(resolutions)
        self._metrics.refresh_gauges(self._ledger.pending_trees, self._ledger.orphan_entries)

    def close_streams(self) -> None:
        """End every Subscribe stream once it has sent what is retained (shutdown)."""
        self._closing = True
        self._hub.wake_all()
