"""Undecodable requests end with INVALID_ARGUMENT and a short message, not UNKNOWN and a traceback.

grpc.aio deserializes a request before the servicer runs; when the bytes are
not a valid message the exception escapes into grpc's own handler, which
answers UNKNOWN ("Unexpected <class 'DecodeError'>") and logs a full
traceback for every such request. A client sending garbage could flood the
log and, with stderr on a slow pipe, stall the server. This interceptor wraps
the request deserializer of every registered method: a decoding failure
becomes a marker object, and the wrapped behaviour aborts the call with
INVALID_ARGUMENT before the servicer sees it. Failures are logged at most
once per interval, as a count.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from acker_protocol.text import clip

from .handlers import HandlerInterceptor, HandlerKind, around, call_behavior, rewrap

__all__ = ["DecodeGuardInterceptor", "RateLimitedLog", "Undecodable"]

log = logging.getLogger("acker_service")

# At most one summary line about undecodable requests per this many seconds.
LOG_INTERVAL_SECONDS = 60.0


class Undecodable:
    """Stands in for a request whose bytes did not decode; carries the (short) reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class RateLimitedLog:
    """Counts events and logs one summary line per ``interval`` seconds at most."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self.unlogged = 0  # events since the last line
        self.lines = 0  # lines written (tests read this)

    def note(self, what: str) -> None:
        """Record one event; log a line if the last one is ``interval`` seconds old."""
        self.unlogged += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return
        log.warning("%d undecodable request(s) refused with INVALID_ARGUMENT; latest: %s", self.unlogged, what)
        self._last = now
        self.unlogged = 0
        self.lines += 1


def _guarded_deserializer(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # untrusted bytes: any decoder failure is the client's error
            return Undecodable(clip(str(exc) or type(exc).__name__, 120))

    return deserialize


class DecodeGuardInterceptor(HandlerInterceptor):
    """Turns request decoding failures into INVALID_ARGUMENT for every method of the server."""

    def __init__(self, log_limiter: RateLimitedLog | None = None) -> None:
        self.log_limiter = log_limiter or RateLimitedLog()
        # Method -> (registered handler, its guarded copy). The registered handlers
        # never change, so the copy is built once per method, not on every call
        # (Apply is the hot path).
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap_handler(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler with a guarded deserializer (built once per method and handler)."""
        cached = self._guarded.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(handler, method)
        self._guarded[method] = (handler, guarded)
        return guarded

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """A copy of ``handler`` whose deserializer failures abort with INVALID_ARGUMENT."""

        def wrap(behavior: Callable, kind: HandlerKind) -> Callable:
            if kind.request_streaming:
                return self._stream_request(behavior, method)
            return self._unary_request(behavior, method)

        return rewrap(handler, wrap, _guarded_deserializer(handler.request_deserializer))

    async def _refuse(self, context: grpc.aio.ServicerContext, method: str, request: Undecodable) -> None:
        self.log_limiter.note(f"{method}: {request.reason}")
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request to {method} is not a valid protobuf message of its type ({request.reason})",
        )

    def _unary_request(self, behavior: Callable, method: str) -> Callable:
        async def check(request, context) -> None:
            if isinstance(request, Undecodable):
                await self._refuse(context, method, request)

        return around(behavior, check)

    def _stream_request(self, behavior: Callable, method: str) -> Callable:
        guard = self

        async def checked(requests, context):
            async for request in requests:
                if isinstance(request, Undecodable):
                    await guard._refuse(context, method, request)
                yield request

        if inspect.isasyncgenfunction(behavior):

            async def stream(requests, context):
                async for response in behavior(checked(requests, context), context):
                    yield response

            return stream

        async def unary(requests, context):
            return await call_behavior(behavior, checked(requests, context), context)

        return unary
