"""One place for what every server interceptor does with a gRPC method handler: find its kind, wrap it.

A ``grpc.RpcMethodHandler`` holds its behaviour in one of four attributes
(unary-unary, unary-stream, stream-unary, stream-stream), each with its own
factory. :func:`rewrap` picks the kind once and builds the copy with the
wrapped behaviour and the same serializers (or a replaced request
deserializer); :func:`around` is the common wrapper "start, the behaviour,
finish", for behaviours that return a value and ones that yield; and
:class:`HandlerInterceptor` is the interceptor shell the three share
(metrics, the decode guard, authorization).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NamedTuple

import grpc

__all__ = ["HandlerKind", "HandlerInterceptor", "rewrap", "around", "call_behavior"]


class HandlerKind(NamedTuple):
    """A handler's kind: its name as gRPC's metrics conventions spell it, and which sides stream."""

    name: str  # UNARY, SERVER_STREAM, CLIENT_STREAM or BIDI_STREAM
    request_streaming: bool
    response_streaming: bool


_KINDS = (
    ("unary_unary", HandlerKind("UNARY", False, False), grpc.unary_unary_rpc_method_handler),
    ("unary_stream", HandlerKind("SERVER_STREAM", False, True), grpc.unary_stream_rpc_method_handler),
    ("stream_unary", HandlerKind("CLIENT_STREAM", True, False), grpc.stream_unary_rpc_method_handler),
    ("stream_stream", HandlerKind("BIDI_STREAM", True, True), grpc.stream_stream_rpc_method_handler),
)

Wrap = Callable[[Callable, HandlerKind], Callable]


def rewrap(
    handler: grpc.RpcMethodHandler, wrap: Wrap, request_deserializer: Callable[[bytes], Any] | None = None
) -> grpc.RpcMethodHandler:
    """A copy of ``handler`` whose behaviour is ``wrap(behaviour, kind)``, serializers kept.

    ``request_deserializer`` replaces the handler's own when given.
    """
    for attribute, kind, factory in _KINDS:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            return factory(
                wrap(behavior, kind),
                request_deserializer=request_deserializer or handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    raise ValueError(f"a method handler without a behaviour: {handler!r}")


async def call_behavior(behavior: Callable, request: Any, context: grpc.aio.ServicerContext) -> Any:
    """Call a behaviour that returns a value, a plain one or an awaitable (gRPC accepts both)."""
    result = behavior(request, context)
    return await result if inspect.isawaitable(result) else result


def around(
    behavior: Callable,
    start: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    finish: Callable[[Any, grpc.aio.ServicerContext, BaseException | None], None] | None = None,
) -> Callable:
    """``behavior`` run after ``state = await start(request, context)``, then ``finish(state, context, error)``.

    ``start`` refuses a call by aborting it (raising); ``finish`` runs however the
    behaviour ended (``error`` None when it returned or its stream ended), and the
    error is re-raised unchanged. Works for behaviours that return and ones that yield.
    """
    if inspect.isasyncgenfunction(behavior):

        async def stream(request, context):
            with _Finishing(finish, await start(request, context), context):
                async for response in behavior(request, context):
                    yield response

        return stream

    async def unary(request, context):
        with _Finishing(finish, await start(request, context), context):
            return await call_behavior(behavior, request, context)

    return unary


class _Finishing:
    """Calls ``finish(state, context, error)`` when the block ends, however it ends; the error propagates."""

    __slots__ = ("_finish", "_state", "_context")

    def __init__(self, finish: Callable | None, state: Any, context: grpc.aio.ServicerContext) -> None:
        self._finish, self._state, self._context = finish, state, context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> Literal[False]:
        if self._finish is not None:
            self._finish(self._state, self._context, error)
        return False  # never swallows: the error is re-raised unchanged


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that replaces each method's handler once it is known (None passes through)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.wrap_handler(handler, handler_call_details.method)

    def wrap_handler(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler to use for ``method`` (for example :func:`rewrap` of ``handler``)."""
        raise NotImplementedError
