"""Fixtures for the acker server tests: real servers on 127.0.0.1 free ports, a fake clock, stubs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import grpc
import pytest
from acker_client.testing import ManualClock
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.config import ServerConfig
from acker_service.server import AckerServer


@pytest.fixture
def clock() -> ManualClock:
    """A fresh fake clock."""
    return ManualClock()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``engine``, the ledger engine the test's servers run: native, plus reference for the smoke tests.

    tests/ledger/test_differential.py keeps the reference engine equal to the native one
    after every batch, so the server tests run on the native engine; the few marked
    ``reference_engine`` also run on the reference engine, to show it serves over gRPC.
    A test that parametrizes ``engine`` itself keeps its own values.
    """
    if "engine" not in metafunc.fixturenames:
        return
    if any("engine" in _argnames(mark) for mark in metafunc.definition.iter_markers("parametrize")):
        return
    both = metafunc.definition.get_closest_marker("reference_engine") is not None
    metafunc.parametrize("engine", ["native", "reference"] if both else ["native"])


def _argnames(mark: pytest.Mark) -> list[str]:
    """The argument names of a ``parametrize`` mark."""
    names = mark.args[0] if mark.args else mark.kwargs["argnames"]
    return [name.strip() for name in names.split(",")] if isinstance(names, str) else list(names)


@pytest.fixture
def make_server(engine) -> Iterator[Callable[..., AckerServer]]:
    """Start servers with ServerConfig overrides (port 0 on 127.0.0.1); all are stopped at teardown."""
    servers: list[AckerServer] = []

    def make(clock: Callable[[], float] | None = None, **overrides) -> AckerServer:
        config = ServerConfig(**{"host": "127.0.0.1", "port": 0, "grace": 0.5, "engine": engine, **overrides})
        server = AckerServer(config, clock=clock)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(0)


@pytest.fixture
def connect() -> Iterator[Callable[..., acker_pb2_grpc.AckerStub]]:
    """Open a channel to a server and return an Acker stub; channels are closed at teardown.

    ``local_pool=True`` gives the channel a connection of its own (by default
    channels with equal options share one).
    """
    channels: list[grpc.Channel] = []

    def open_stub(server: AckerServer, local_pool: bool = False, **options) -> acker_pb2_grpc.AckerStub:
        extra = [("grpc.use_local_subchannel_pool", 1)] if local_pool else []
        channel = grpc.insecure_channel(server.address, options=grpc_options.client_options(**options) + extra)
        channels.append(channel)
        return acker_pb2_grpc.AckerStub(channel)

    yield open_stub
    for channel in channels:
        channel.close()


def _ledger_state(server: AckerServer) -> tuple:
    """Everything observable about a server's ledger, read on its event loop."""

    def read() -> tuple:
        ledger = server.ledger
        return (
            ledger.pending_trees,
            ledger.orphan_entries,
            sorted(ledger.pending_roots()),
            dataclasses.asdict(ledger.stats),
        )

    return server.call(read)


def _apply(
    stub: acker_pb2_grpc.AckerStub,
    ops: list[tuple[int, int, int]],
    spout: str = "s",
    dedup_keys: list[int] | None = None,
) -> acker_pb2.ApplyResponse:
    """Send one Apply with (kind, root, value) operations and a single spout."""
    kinds, roots, values = (list(column) for column in zip(*ops)) if ops else ([], [], [])
    return stub.Apply(
        acker_pb2.ApplyRequest(kinds=kinds, root_ids=roots, values=values, dedup_keys=dedup_keys or [], spouts=[spout]),
        timeout=10,
    )


@pytest.fixture
def ledger_state() -> Callable[[AckerServer], tuple]:
    """Function reading (pending, orphans, roots, stats) of a server's ledger on its loop."""
    return _ledger_state


@pytest.fixture
def apply() -> Callable[..., acker_pb2.ApplyResponse]:
    """Function sending one Apply of (kind, root, value) operations for spout 's'."""
    return _apply
