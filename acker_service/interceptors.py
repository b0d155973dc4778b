"""A grpc.aio server interceptor recording the standard grpc_server_* Prometheus metrics."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import grpc

from .metrics import AckerMetrics

__all__ = ["MetricsInterceptor"]


def _split(full_method: str) -> tuple[str, str]:
    """'/pkg.Service/Method' -> ('pkg.Service', 'Method')."""
    parts = full_method.split("/")
    if len(parts) != 3:
        return "unknown", full_method
    return parts[1], parts[2]


def _final_code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    """The status the call ends with: set by abort/set_code, or implied by how the handler ended."""
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)) or context.cancelled():
        # The client went away (or the server stopped past its grace): the stream never finished.
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN


class _Call:
    """Records one call: started now, handled (with its code and duration) at finish."""

    __slots__ = ("_metrics", "_labels", "_t0")

    def __init__(self, metrics: AckerMetrics, labels: tuple[str, str, str]) -> None:
        self._metrics = metrics
        self._labels = labels
        self._t0 = time.perf_counter()
        metrics.grpc_started.labels(*labels).inc()

    def finish(self, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
        code = _final_code(context, error)
        self._metrics.grpc_handled.labels(*self._labels, code.name).inc()
        self._metrics.grpc_seconds.labels(*self._labels).observe(time.perf_counter() - self._t0)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts started and handled RPCs by method and code, and times them (streams until they end)."""

    def __init__(self, metrics: AckerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        service, method = _split(handler_call_details.method)
        if handler.unary_unary:
            wrap, kind, factory = handler.unary_unary, "UNARY", grpc.unary_unary_rpc_method_handler
        elif handler.unary_stream:
            wrap, kind, factory = handler.unary_stream, "SERVER_STREAM", grpc.unary_stream_rpc_method_handler
        elif handler.stream_unary:
            wrap, kind, factory = handler.stream_unary, "CLIENT_STREAM", grpc.stream_unary_rpc_method_handler
        else:
            wrap, kind, factory = handler.stream_stream, "BIDI_STREAM", grpc.stream_stream_rpc_method_handler
        behavior = self._wrap(wrap, (kind, service, method))
        return factory(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap(self, behavior: Callable, labels: tuple[str, str, str]) -> Callable:
        metrics = self._metrics
        if inspect.isasyncgenfunction(behavior):

            async def stream(request_or_iterator, context):
                call = _Call(metrics, labels)
                error = None
                try:
                    async for response in behavior(request_or_iterator, context):
                        yield response
                except BaseException as exc:  # recorded, then re-raised unchanged
                    error = exc
                    raise
                finally:
                    call.finish(context, error)

            return stream

        async def unary(request_or_iterator, context):
            call = _Call(metrics, labels)
            error = None
            try:
                result = behavior(request_or_iterator, context)
                return await result if inspect.isawaitable(result) else result
            except BaseException as exc:  # recorded, then re-raised unchanged
                error = exc
                raise
            finally:
                call.finish(context, error)

        return unary
