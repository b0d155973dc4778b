"""ApplyStream: Apply's requests over one long-lived call, answered in order by one ApplyAck each.

A unary Apply pays grpc's per-call work (a new call, its metadata, its
status) for every batch; on a stream each batch costs one message each way.
Every request is applied exactly as Apply applies it (the shard decodes,
validates whole, applies or refuses), so the limits and error statuses are
Apply's. A refused request is answered with its status in the ack and the
stream goes on; the call ends with an error only for what concerns every
later request too (authentication, a message over the receive limit,
shutdown).

The server's authorization interceptor checks each request as it checks an
Apply and hands a refused one over as a :class:`RefusedRequest`, so the
refusal reaches the client in that request's ack.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple

import grpc
from acker_protocol.v1 import acker_pb2

from .batch import BatchError
from .shard import Shard

__all__ = ["RefusedRequest", "serve_apply_stream", "SHUTDOWN_MESSAGE"]

SHUTDOWN_MESSAGE = (
    "this acker is shutting down; send the requests not yet acknowledged again, to it once restarted or to its replica"
)


class RefusedRequest(NamedTuple):
    """A request an interceptor refused (not applied): the status and message its ack carries."""

    code: grpc.StatusCode
    message: str


def _refusal(sequence: int, code: grpc.StatusCode, message: str) -> acker_pb2.ApplyAck:
    # StatusCode values are (int code, name).
    return acker_pb2.ApplyAck(sequence=sequence, code=code.value[0], message=message)


async def serve_apply_stream(
    shard: Shard,
    status_of: Mapping[type[Exception], grpc.StatusCode],
    requests: AsyncIterator[bytes | RefusedRequest],
    context: grpc.aio.ServicerContext,
):
    """Apply each request of the call in order and yield its ApplyAck; end with UNAVAILABLE at shutdown.

    ``status_of`` maps the shard's :class:`~acker_service.batch.BatchError`
    types to the status Apply answers them with.
    """
    if shard.closing:
        await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTDOWN_MESSAGE)
    reading: asyncio.Future | None = None

    def end_reading() -> None:
        # Shutdown: a stream idle in a read would otherwise hold the server for its whole grace period.
        if reading is not None:
            reading.cancel()

    shard.closing_callbacks.add(end_reading)
    sequence = 0
    incoming = aiter(requests)
    try:
        while not shard.closing:
            # A task, not a plain await, so that shutdown can cancel just the read (and nothing else).
            reading = asyncio.ensure_future(anext(incoming))
            try:
                request = await reading
            except StopAsyncIteration:
                return  # the client closed its side: every request was answered
            except asyncio.CancelledError:
                if not (shard.closing and reading.cancelled()):
                    raise
                break
            finally:
                reading = None
            sequence += 1
            if isinstance(request, RefusedRequest):
                yield _refusal(sequence, request.code, request.message)
                continue
            try:
                result = shard.apply_request(request)
            except BatchError as exc:
                yield _refusal(sequence, status_of[type(exc)], str(exc))
                continue
            yield acker_pb2.ApplyAck(
                sequence=sequence,
                applied=result.applied,
                deduplicated=result.deduplicated,
                ignored=result.ignored,
                held=result.held,
            )
    finally:
        shard.closing_callbacks.discard(end_reading)
    await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTDOWN_MESSAGE)
