"""Test helpers for users of the client: a throwaway acker cluster on free loopback ports, and a manual clock."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["local_cluster", "LocalCluster", "ManualClock", "unreachable_addresses"]


class ManualClock:
    """A monotonic clock a test moves by hand, so timeouts need no sleeping.

    Pass it wherever a ``clock=`` is accepted (``Spout``, ``local_cluster``,
    ``AckerServer``, ``Ledger``), then ``advance()`` it and let the acker
    expire what is due (``server.advance()``).

    >>> clock = ManualClock()
    >>> clock.advance(1.5); clock()
    1001.5
    """

    def __init__(self, start: float = 1000.0) -> None:
        # Not 0: nothing may rely on a monotonic clock starting at zero.
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never backwards: the clock is monotonic)."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back {seconds} seconds")
        self.now += seconds

    def set(self, t: float) -> None:
        """Move time forward to the absolute time ``t``."""
        self.advance(t - self.now)


@dataclass
class LocalCluster:
    """In-process ackers started by :func:`local_cluster`: ``addresses`` in shard order, and the servers."""

    servers: list[Any] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        """The ackers' addresses in shard order."""
        return [s.address for s in self.servers]


@contextlib.contextmanager
def local_cluster(
    count: int = 1,
    *,
    message_timeout: float = 2.0,
    buckets: int = 3,
    processes: bool = False,
    clock: Callable[[], float] | None = None,
    replicas: int = 1,
) -> Iterator[Any]:
    """Run ``count`` acker shards on free 127.0.0.1 ports for the duration of a ``with`` block.

    In-process (the default) the ackers are :class:`acker_service.server.AckerServer`
    threads; with ``processes=True`` they are separate processes
    (:class:`acker_service.process_cluster.ProcessCluster`, which adds ``kill`` and
    ``restart``). Either way the yielded object has ``addresses``. ``clock``
    (in-process only, e.g. a :class:`ManualClock`) drives the ackers' timeouts;
    call ``server.advance()`` on each of ``cluster.servers`` after moving it.
    ``replicas=2`` starts them with ``--replicas 2`` (every tree on two shards).

    >>> from acker_client import ClusterClient
    >>> with local_cluster(3) as ackers, ClusterClient(ackers.addresses) as client:  # doctest: +SKIP
    ...     ...
    """
    if processes:
        if clock is not None:
            raise ValueError("a clock can only drive in-process ackers (processes=False)")
        from acker_service.process_cluster import ProcessCluster

        extra = ("--replicas", str(replicas))
        with ProcessCluster(
            count=count, message_timeout=message_timeout, buckets=buckets, extra_args=extra
        ) as process_cluster:
            yield process_cluster
        return
    from acker_service.config import ServerConfig
    from acker_service.server import AckerServer

    cluster = LocalCluster()
    try:
        for shard in range(count):
            config = ServerConfig(
                host="127.0.0.1",
                port=0,
                shard_index=shard,
                shard_count=count,
                message_timeout=message_timeout,
                buckets=buckets,
                grace=0.5,
                replicas=replicas,
            )
            cluster.servers.append(AckerServer(config, clock=clock).start())
        yield cluster
    finally:
        for server in cluster.servers:
            server.stop(0.5)


def unreachable_addresses(count: int) -> list[str]:
    """``count`` loopback addresses where nothing listens (ports bound, read and released): misconfiguration tests."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    finally:
        for s in sockets:
            s.close()
