"""Following a layout change of the ackers (a reshard or a drain): learn the new layout, re-route a refused batch.

During ``acker-ctl reshard`` or ``drain``, an acker refuses a batch holding a
root it no longer serves (FAILED_PRECONDITION; nothing of it was applied): a
root that moved away at its cut, or one the layout gives another acker. The
client then asks that acker's Describe for the layout being moved to
(``next_layout``; after the change, ``layout``); when it is newer than the one
the client routes by, the client adopts it and sends the refused batch's
operations again, split by ``root % new count``, each with the dedup key it
already carried, so an operation applied before the move (and moved with its
tree) is dropped as a repeat, never applied twice. Every request names the
layout epoch it was routed by (``layout_epoch``; the ackers' routing no longer
reads it). With two replicas each re-sent operation goes to *both* keepers of
its root in the new layout, whatever the other copy's answer was: the keeper
that refused it left the root and handed its copy to one of the new keepers,
which one the client does not know, and that one needs the operation; the
other has it already or gets it now, and a repeat is absorbed there (dedup
key, set-once init, idempotent fail; docs/simulation.md, "Reshard with two
replicas"). The new owner of a root
still on its way holds the operation until the tree's entry arrives; every
other root is served at once. An acker past its bound of held operations
answers UNAVAILABLE, which the client retries as it retries any blip.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from acker_protocol.apply_codec import split_by_holders, split_by_owner, with_layout_epoch

__all__ = ["split_request", "send_until_applied", "with_layout_epoch"]


def split_request(request: bytes, shard_count: int, replicas: int = 1) -> dict[int, bytes]:
    """A serialized ApplyRequest's operations regrouped by ``root % shard_count``, every field of each kept.

    With ``replicas`` 2 each operation is in the part of both shards that keep its
    root (``root % shard_count`` and the next one). The acker splits a request it
    holds in parts with the same codec (:mod:`acker_protocol.apply_codec`).
    """
    if replicas > 1:
        return split_by_holders(request, shard_count, replicas)
    return split_by_owner(request, shard_count)


def send_until_applied(
    call: Callable[..., Any], request: bytes, *, deadline: float, give_up_at: float, sleep: Callable[[float], None]
) -> grpc.RpcError | None:
    """Send until applied, retrying UNAVAILABLE (an acker at its bound of held operations) until ``give_up_at``; the last error or None."""
    pause = 0.05
    while True:
        try:
            call(request, timeout=max(0.01, min(deadline, give_up_at - time.monotonic())), wait_for_ready=True)
            return None
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= give_up_at:
                return exc
            sleep(pause)
            pause = min(pause * 2, 1.0)
