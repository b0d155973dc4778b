"""Executor side: check once per process that a step's acker addresses are in shard order, as the driver does.

The driver's ``ClusterClient`` verifies its address list (Describe) when it is
created; the executors' clients used to skip that, so Bolts given the right
ackers in the wrong order only failed later, on the ackers' refusals, with the
cause in executor logs alone. :func:`check_layout` asks every shard for its
index and count and raises :class:`~acker_client.ClusterMisconfigured` on a
mismatch: the task fails with it, and the driver's pipeline stops the run
with that cause. A shard that cannot be reached is not an error here (it may
be restarting): its acks are reported as undelivered at commit instead, unless it
answers again by then (the commit asks it again).
"""

from __future__ import annotations

import threading

import grpc
from acker_client import AckerError, ClusterClient, ClusterMisconfigured, ShardFailure, ShardUnavailable

__all__ = ["check_layout"]

_checked: set[tuple[str, ...]] = set()  # address lists found in order by this process
_lock = threading.Lock()


def check_layout(client: ClusterClient, step: str) -> dict[int, ShardFailure]:
    """Raise ClusterMisconfigured if a reachable shard of ``client`` is not at its position; once per address list.

    Returns the shards that refused the connection (index -> failure): the task
    withholds their operations at commit instead of waiting on them, so an
    unreachable shard delays only the trees it owns; each commit asks those
    shards again first (``TrackedStep._still_refused``), so a blip at the task's
    start costs nothing.
    """
    addresses = client.addresses
    with _lock:
        if addresses in _checked:
            return {}
    count = len(addresses)
    reachable = 0
    refused: dict[int, ShardFailure] = {}
    for position, address in enumerate(addresses):
        try:
            info = client.describe(position)
        except ShardUnavailable as err:
            # Unreachable now: checked again next task. Only a refused connection (UNAVAILABLE)
            # counts as down; a slow answer (a deadline) may still take the commit.
            refused.update((f.shard, f) for f in err.failures if f.code is grpc.StatusCode.UNAVAILABLE)
            continue
        except AckerError:
            continue
        reachable += 1
        if info.shard_count != count or info.shard_index != position:
            raise ClusterMisconfigured(
                f"step {step!r}: address {position} ({address}) is acker shard {info.shard_index} of "
                f"{info.shard_count}, but the step was given {count} addresses with it at position {position}; "
                "give each Bolt the driver's address list, every acker once, in shard order (shard i at position i)"
            )
    if reachable == count:
        with _lock:
            _checked.add(addresses)
    return refused
