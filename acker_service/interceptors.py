"""A grpc.aio server interceptor recording the standard grpc_server_* Prometheus metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc

from .handlers import HandlerInterceptor, around, rewrap
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


class MetricsInterceptor(HandlerInterceptor):
    """Counts started and handled RPCs by method and code, and times them (streams until they end)."""

    def __init__(self, metrics: AckerMetrics) -> None:
        self._metrics = metrics

    def wrap_handler(self, handler: grpc.RpcMethodHandler, full_method: str) -> grpc.RpcMethodHandler:
        """The handler, counted and timed under its kind, service and method."""
        service, method = _split(full_method)
        return rewrap(handler, lambda behavior, kind: self._wrap(behavior, (kind.name, service, method)))

    def _wrap(self, behavior: Callable, labels: tuple[str, str, str]) -> Callable:
        metrics = self._metrics

        async def start(request_or_iterator, context) -> _Call:
            return _Call(metrics, labels)

        return around(behavior, start, _Call.finish)
