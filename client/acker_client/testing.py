"""Test helpers for users of the client: a throwaway acker cluster on free loopback ports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["local_cluster", "LocalCluster"]


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
    count: int = 1, *, message_timeout: float = 2.0, buckets: int = 3, processes: bool = False
) -> Iterator[Any]:
    """Run ``count`` acker shards on free 127.0.0.1 ports for the duration of a ``with`` block.

    In-process (the default) the ackers are :class:`acker_service.server.AckerServer`
    threads; with ``processes=True`` they are separate processes
    (:class:`acker_service.cluster.ProcessCluster`, which adds ``kill`` and
    ``restart``). Either way the yielded object has ``addresses``.

    >>> from acker_client import ClusterClient
    >>> with local_cluster(3) as ackers, ClusterClient(ackers.addresses) as client:  # doctest: +SKIP
    ...     ...
    """
    if processes:
        from acker_service.cluster import ProcessCluster

        with ProcessCluster(count=count, message_timeout=message_timeout, buckets=buckets) as cluster:
            yield cluster
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
            )
            cluster.servers.append(AckerServer(config).start())
        yield cluster
    finally:
        for server in cluster.servers:
            server.stop(0.5)
