"""The one per-process cache of cluster clients: a reused Spark worker keeps its connections warm across tasks."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from .cluster import ClusterClient

__all__ = ["shared_client", "close_shared_clients"]

# By address list and security options. No pid in the key: a ClusterClient is itself fork-safe, so a
# forked child may use (or close) its parent's object.
_shared: dict[tuple[tuple[str, ...], Any], ClusterClient] = {}
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock at the moment of the fork.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_client(addresses: Sequence[str], **options: Any) -> ClusterClient:
    """This process's client for the cluster at ``addresses``, created with ``options`` on first use."""
    key = (tuple(addresses), options.get("security"))  # ChannelSecurity is frozen, so hashable
    with _lock:
        client = _shared.get(key)
        if client is None:
            client = _shared[key] = ClusterClient(list(addresses), **options)
        return client


def close_shared_clients() -> None:
    """Close the shared clients (tests, and drivers that ran bolts locally); the next use makes new ones."""
    with _lock:
        clients = list(_shared.values())
        _shared.clear()
    for client in clients:
        client.close()
