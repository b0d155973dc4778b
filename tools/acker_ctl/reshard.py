"""``acker-ctl reshard`` and ``drain``: move a running cluster to a new layout, prepare -> cut -> commit on every acker.

Every acker of the old and the new layout is prepared (from then on a new
owner holds the operations on roots still moving to it; every other root is
served throughout), then every one is cut at once (each takes out the
entries it gives away, refuses their roots from then on, and hands them to
their new owners, which apply what they held), then every one commits.
Clients learn the new layout from a refusal and Describe. Running the same
command again after a failure finishes the same change: each step is safe to
repeat. Why nothing is lost, replayed or acked falsely:
docs/acker-semantics.md, "Moving trees".

With ``--replicas 2`` both copies of a tree move: a tree moves when the set of
two ackers keeping it changes, and each old copy moves to exactly one new
keeper: a keeper that stays keeps its own, one that leaves hands its copy to a
new keeper (old owner -> new owner, old follower -> new follower when both
change; docs/simulation.md, "Reshard with two replicas"). Every acker must run with
the same ``--replicas``, and the new layout needs at least that many ackers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from acker_protocol.credentials import ChannelSecurity
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from .cluster import Cluster, CtlError

__all__ = ["reshard", "drain_addresses"]


def drain_addresses(current: Sequence[str], shard: int) -> list[str]:
    """The layout without ``shard`` (CtlError when it is not one of them or is the last)."""
    if not 0 <= shard < len(current):
        raise CtlError(f"shard {shard} is not one of the {len(current)} listed ackers (0..{len(current) - 1})")
    if len(current) == 1:
        raise CtlError("the last acker cannot be drained: a cluster needs at least one")
    return [a for i, a in enumerate(current) if i != shard]


def reshard(
    current: Sequence[str],
    new: Sequence[str],
    security: ChannelSecurity | None,
    deadline: float = 30.0,
    wait_leaving: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Move the cluster from ``current`` to ``new`` (addresses in shard order); what moved and how long it took.

    ``wait_leaving`` seconds: wait for the ackers that leave to end their last
    due trees (they time out there, as they would have without the move).
    """
    if not new:
        raise CtlError("the new layout needs at least one acker address")
    if len(set(new)) != len(new):
        raise CtlError("an address is listed twice in the new layout")
    everyone = list(dict.fromkeys([*current, *new]))
    started = clock()
    with Cluster(everyone, security, deadline) as cluster:
        infos = [cluster._describe(i) for i in range(len(everyone))]
        factors = {address: info.replicas or 1 for address, info in zip(everyone, infos)}
        replicas = max(factors.values())
        if len(set(factors.values())) > 1:
            listing = ", ".join(f"{a}: {r}" for a, r in factors.items())
            raise CtlError(f"the ackers disagree on --replicas ({listing}); start every acker with the same one")
        if len(new) < replicas:
            raise CtlError(
                f"with --replicas {replicas} the new layout needs at least {replicas} ackers, got {len(new)}"
            )
        epoch = max(info.layout.epoch for info in infos) + 1
        for i, address in enumerate(everyone):
            index = new.index(address) if address in new else -1
            layout = acker_pb2.Layout(epoch=epoch, shard_count=len(new), shard_index=index, addresses=list(new))
            # Its place in the layout left (-1: new): it awaits a handoff from every other old shard.
            before = current.index(address) if address in current else -1
            previous = acker_pb2.Layout(
                epoch=epoch - 1, shard_count=len(current), shard_index=before, addresses=list(current)
            )
            request = acker_pb2.PrepareLayoutRequest(layout=layout, previous=previous)

            def prepare(s: acker_pb2_grpc.AckerStub, r: acker_pb2.PrepareLayoutRequest = request) -> object:
                return s.PrepareLayout(r, timeout=deadline)

            cluster._call(i, "PrepareLayout", prepare)
        cut_at = clock()
        cut = acker_pb2.CutLayoutRequest(epoch=epoch)

        def cut_call(s: acker_pb2_grpc.AckerStub) -> acker_pb2.CutLayoutResponse:
            return s.CutLayout(cut, timeout=deadline)

        # Every acker at once: a root moving here waits for its old owner's cut, not for every other one.
        with ThreadPoolExecutor(max_workers=len(everyone)) as pool:
            answers = list(pool.map(lambda i: cluster._call(i, "CutLayout", cut_call), range(len(everyone))))
        moved_trees = sum(a.moved_trees for a in answers)
        moved_entries = sum(a.moved_entries for a in answers)
        for i in range(len(everyone)):
            commit = acker_pb2.CommitLayoutRequest(epoch=epoch)

            def commit_call(s: acker_pb2_grpc.AckerStub, r: acker_pb2.CommitLayoutRequest = commit) -> object:
                return s.CommitLayout(r, timeout=deadline)

            cluster._call(i, "CommitLayout", commit_call)
        committed_at = clock()
        leaving = [i for i, a in enumerate(everyone) if a not in new]
        left_pending = {}
        give_up = clock() + wait_leaving
        for i in leaving:
            while True:
                pending = cluster._describe(i).pending_trees
                if pending == 0 or clock() >= give_up:
                    break
                sleep(0.2)
            left_pending[everyone[i]] = pending
    return {
        "epoch": epoch,
        "replicas": replicas,
        "from_shards": len(current),
        "to_shards": len(new),
        "addresses": list(new),
        "moved_trees": moved_trees,
        "moved_entries": moved_entries,
        "cut_seconds": round(committed_at - cut_at, 4),
        "move_seconds": round(committed_at - started, 4),
        "leaving": left_pending,
    }
