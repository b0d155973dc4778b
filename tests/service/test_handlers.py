"""The one handler-kind dispatch (acker_service.handlers) the three interceptors share."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from acker_service.handlers import around, rewrap


async def _unary(request, context):
    return request * 2


async def _stream(request, context):
    for i in range(request):
        yield i


def _ser(x):
    return b"s"


def _de(b):
    return 1


@pytest.mark.parametrize(
    ("factory", "attribute", "kind", "behavior"),
    [
        (grpc.unary_unary_rpc_method_handler, "unary_unary", "UNARY", _unary),
        (grpc.unary_stream_rpc_method_handler, "unary_stream", "SERVER_STREAM", _stream),
        (grpc.stream_unary_rpc_method_handler, "stream_unary", "CLIENT_STREAM", _unary),
        (grpc.stream_stream_rpc_method_handler, "stream_stream", "BIDI_STREAM", _stream),
    ],
)
def test_rewrap_keeps_the_kind_and_the_serializers(factory, attribute, kind, behavior):
    """Each of the four kinds comes back as the same kind, wrapped, with its serializers (or a new deserializer)."""
    handler = factory(behavior, request_deserializer=_de, response_serializer=_ser)
    seen = []

    def wrap(inner, handler_kind):
        seen.append(handler_kind)
        return inner

    copy = rewrap(handler, wrap)
    assert (
        getattr(copy, attribute) is behavior and copy.response_serializer is _ser and copy.request_deserializer is _de
    )
    assert [k.name for k in seen] == [kind]
    assert seen[0].request_streaming == attribute.startswith("stream_")
    assert seen[0].response_streaming == attribute.endswith("_stream")

    def other(b):
        return 2

    assert rewrap(handler, wrap, other).request_deserializer is other


def test_around_starts_runs_and_finishes_unary_and_streaming_behaviours():
    """start runs first (a raise refuses the call), finish sees how the behaviour ended, errors pass unchanged."""
    calls = []

    async def start(request, context):
        calls.append(("start", request))
        if request < 0:
            raise PermissionError("refused")
        return request

    def finish(state, context, error):
        calls.append(("finish", state, type(error).__name__ if error else None))

    async def failing(request, context):
        raise KeyError(request)

    async def run():
        assert await around(_unary, start, finish)(3, None) == 6
        assert [x async for x in around(_stream, start, finish)(2, None)] == [0, 1]
        with pytest.raises(KeyError):
            await around(failing, start, finish)(5, None)
        with pytest.raises(PermissionError):
            await around(_unary, start, finish)(-1, None)
        with pytest.raises(PermissionError):
            [x async for x in around(_stream, start)(-1, None)]

    asyncio.run(run())
    assert calls == [
        ("start", 3),
        ("finish", 3, None),
        ("start", 2),
        ("finish", 2, None),
        ("start", 5),
        ("finish", 5, "KeyError"),
        ("start", -1),
        ("start", -1),
    ]
