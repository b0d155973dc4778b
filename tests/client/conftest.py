"""Fixtures for the client tests: real acker servers on 127.0.0.1 free ports, fake clocks, callback recorders."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from acker_client import ClusterClient, Spout
from acker_client.testing import ManualClock
from acker_protocol.wire import Outcome

from acker_service.config import ServerConfig
from acker_service.server import AckerServer


class Recorder:
    """Collects spout callbacks; every message id must be called back exactly once."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Outcome | None]] = []
        self._cond = threading.Condition()

    def on_ack(self, message_id: Any) -> None:
        """Spout on_ack."""
        with self._cond:
            self.calls.append((message_id, None))
            self._cond.notify_all()

    def on_fail(self, message_id: Any, reason: Outcome) -> None:
        """Spout on_fail."""
        with self._cond:
            self.calls.append((message_id, reason))
            self._cond.notify_all()

    def outcome(self, message_id: Any) -> Outcome | str | None:
        """'acked', a Outcome, or None if no callback yet; fails the test on a second callback."""
        found = [reason for mid, reason in self.calls if mid == message_id]
        assert len(found) <= 1, f"{message_id!r} got {len(found)} callbacks"
        if not found:
            return None
        return "acked" if found[0] is None else found[0]

    def by_reason(self) -> Counter:
        """How many callbacks of each kind ('acked' or a Outcome)."""
        return Counter("acked" if r is None else r for _, r in self.calls)

    def assert_exactly_once(self, message_ids) -> None:
        """Every id in ``message_ids`` got exactly one callback, and no other id got any."""
        counts = Counter(mid for mid, _ in self.calls)
        expected = set(message_ids)
        twice = {m: n for m, n in counts.items() if n != 1}
        assert not twice, f"ids called back more than once: {dict(list(twice.items())[:5])}"
        assert set(counts) == expected, (
            f"{len(expected - set(counts))} ids without a callback, {len(set(counts) - expected)} unexpected"
        )

    def wait_for(self, count: int, timeout: float = 30.0) -> bool:
        """Wait until ``count`` callbacks arrived."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.calls) >= count, timeout)


@pytest.fixture
def clock() -> ManualClock:
    """A fresh fake clock."""
    return ManualClock()


@pytest.fixture
def recorder() -> Recorder:
    """A fresh callback recorder."""
    return Recorder()


@pytest.fixture
def make_ackers() -> Iterator[Callable[..., list[AckerServer]]]:
    """Start n in-process acker shards on free ports (optionally on a fake clock); stopped at teardown."""
    servers: list[AckerServer] = []

    def make(count: int = 1, *, clock: Callable[[], float] | None = None, **overrides) -> list[AckerServer]:
        started = []
        for shard in range(count):
            config = ServerConfig(
                **{
                    "host": "127.0.0.1",
                    "port": 0,
                    "grace": 0.5,
                    "shard_index": shard,
                    "shard_count": count,
                    "message_timeout": 1.0,
                    **overrides,
                }
            )
            server = AckerServer(config, clock=clock)
            servers.append(server.start())
            started.append(server)
        return started

    yield make
    for server in servers:
        server.stop(0)


@pytest.fixture
def make_client() -> Iterator[Callable[..., ClusterClient]]:
    """Build ClusterClients that are closed at teardown."""
    clients: list[ClusterClient] = []

    def make(addresses, **kwargs) -> ClusterClient:
        client = ClusterClient(addresses, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def make_spout(recorder: Recorder) -> Iterator[Callable[..., Spout]]:
    """Build started spouts reporting to ``recorder``; closed at teardown."""
    spouts: list[Spout] = []

    def make(cluster, **kwargs) -> Spout:
        spout = Spout(cluster, on_ack=recorder.on_ack, on_fail=recorder.on_fail, **kwargs).start()
        spouts.append(spout)
        return spout

    yield make
    for spout in spouts:
        spout.close()
