"""The calls acker-ctl makes: one stub per shard, roots routed to their owner, answers as plain dicts.

Everything here returns JSON-ready data (the ``--json`` output is exactly it);
:mod:`acker_ctl.cli` only parses flags and prints. A shard that cannot be
reached or refuses a call raises :class:`CtlError` naming the shard and the
gRPC status, so an operator sees which acker to look at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import check_root, shard_of

__all__ = ["Cluster", "CtlError"]

T = TypeVar("T")

_STATUS_NAMES = {v.number: v.name.removeprefix("TREE_STATUS_").lower() for v in acker_pb2.TreeStatus.DESCRIPTOR.values}


class CtlError(Exception):
    """A shard could not be reached, refused the call, or the address list does not match the cluster."""


def tree(state: acker_pb2.TreeState, shard: int) -> dict[str, Any]:
    """One root's state as JSON-ready data."""
    return {
        "root": state.root_id,
        "shard": shard,
        "status": _STATUS_NAMES.get(state.status, str(state.status)),
        "age_seconds": round(state.age_seconds, 3),
        "spout": state.spout or None,
        "failed": state.failed,
        "resets": state.resets,
        "dedup_keys": state.dedup_keys,
    }


class Cluster:
    """The ackers at ``addresses``, in shard order (as every client lists them)."""

    def __init__(self, addresses: Sequence[str], security: ChannelSecurity | None, deadline: float = 10.0) -> None:
        if not addresses:
            raise CtlError("no acker addresses: give --ackers host:port,... in shard order")
        self.addresses = list(addresses)
        self.deadline = deadline
        self._channels = [open_channel(a, security, grpc_options.client_options()) for a in self.addresses]
        self._stubs = [acker_pb2_grpc.AckerStub(c) for c in self._channels]

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, shard: int, method: str, fn: Callable[[acker_pb2_grpc.AckerStub], T]) -> T:
        try:
            return fn(self._stubs[shard])
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise CtlError(f"shard {shard} ({self.addresses[shard]}): {method} failed: {code}: {details}") from None

    def _describe(self, shard: int) -> acker_pb2.DescribeResponse:
        return self._call(shard, "Describe", lambda s: s.Describe(acker_pb2.DescribeRequest(), timeout=self.deadline))

    def _force_fail(self, shard: int, request: acker_pb2.ForceFailRequest) -> acker_pb2.ForceFailResponse:
        return self._call(shard, "ForceFail", lambda s: s.ForceFail(request, timeout=self.deadline))

    def _inspect(self, shard: int, roots: Sequence[int] = (), oldest: int = 0) -> acker_pb2.InspectResponse:
        request = acker_pb2.InspectRequest(root_ids=list(roots), oldest=oldest)
        return self._call(shard, "Inspect", lambda s: s.Inspect(request, timeout=self.deadline))

    def check_layout(self) -> list[acker_pb2.DescribeResponse]:
        """Describe every shard; raise CtlError unless shard i of len(addresses) answers at address i."""
        infos = [self._describe(shard) for shard in range(len(self.addresses))]
        for position, info in enumerate(infos):
            if (info.shard_index, info.shard_count) != (position, len(self.addresses)):
                raise CtlError(
                    f"{self.addresses[position]} is shard {info.shard_index} of {info.shard_count}, but it is "
                    f"listed as shard {position} of {len(self.addresses)}: list every acker, in shard order"
                )
        return infos

    def _by_shard(self, roots: Sequence[int]) -> dict[int, list[int]]:
        routed: dict[int, list[int]] = {}
        for root in roots:
            try:
                check_root(root)
            except ValueError as exc:
                raise CtlError(str(exc)) from None
            routed.setdefault(shard_of(root, len(self.addresses)), []).append(root)
        return routed

    def status(self, interval: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """Every shard's settings, pending trees, oldest tree and rates over ``interval`` seconds."""
        infos = self.check_layout()
        first = [self._inspect(shard, oldest=1) for shard in range(len(infos))]
        started = time.monotonic()
        sleep(interval)
        second = [self._inspect(shard, oldest=1) for shard in range(len(infos))]
        elapsed = max(time.monotonic() - started, 1e-9)
        shards = []
        for shard, (info, a, b) in enumerate(zip(infos, first, second)):
            same = a.incarnation == b.incarnation  # a restart in between makes rates meaningless

            def rate(field: str, a=a, b=b, same=same) -> float | None:
                return round((getattr(b, field) - getattr(a, field)) / elapsed, 1) if same else None

            oldest = tree(b.oldest[0], shard) if b.oldest else None
            shards.append(
                {
                    "shard": shard,
                    "address": self.addresses[shard],
                    "incarnation": f"{b.incarnation:016x}",
                    "version": info.version,
                    "pending_trees": b.pending_trees,
                    "oldest_root": oldest["root"] if oldest else None,
                    "oldest_age_seconds": oldest["age_seconds"] if oldest else None,
                    "oldest_spout": oldest["spout"] if oldest else None,
                    "started_per_s": rate("trees_initialized"),
                    "acked_per_s": rate("trees_acked"),
                    "failed_per_s": rate("trees_failed"),
                    "timed_out_per_s": rate("trees_timed_out"),
                    "message_timeout_seconds": info.message_timeout_seconds,
                    "timeout_mode": info.timeout_mode or "fixed",
                    "max_tree_lifetime_seconds": info.max_tree_lifetime_seconds,
                    "replicas": info.replicas or 1,  # 0: a server from before replication, which keeps one copy
                    # The layout epoch (0: as started) and a move in progress (prepared/cut: Apply held).
                    "layout_epoch": info.layout.epoch,
                    "move_state": info.move_state or "serving",
                    # A restarted replica copying its ranges from its partners (Apply held until caught up).
                    "catchup": info.catchup_state or "off",
                    "catchup_entries": info.catchup_entries,
                }
            )
        replicas = sorted({int(info.replicas or 1) for info in infos})
        return {
            "shards": shards,
            "pending_trees": sum(s["pending_trees"] for s in shards),
            "replicas": replicas[0] if len(replicas) == 1 else replicas,
        }

    def inspect(self, roots: Sequence[int]) -> list[dict[str, Any]]:
        """Each root's state, asked of the shard that owns it, in the order given."""
        found: dict[int, dict[str, Any]] = {}
        for shard, owned in self._by_shard(roots).items():
            for state in self._inspect(shard, roots=owned).trees:
                found[state.root_id] = tree(state, shard)
        return [found[root] for root in roots]

    def top(self, n: int) -> list[dict[str, Any]]:
        """The ``n`` oldest pending trees of the whole cluster, oldest first."""
        trees = [
            tree(state, shard)
            for shard in range(len(self.addresses))
            for state in self._inspect(shard, oldest=n).oldest
        ]
        trees.sort(key=lambda t: (-t["age_seconds"], t["root"]))
        return trees[:n]

    def fail_roots(self, roots: Sequence[int]) -> dict[str, Any]:
        """Fail the named pending trees now, each on its shard; the roots failed and those that were not."""
        failed: list[int] = []
        timed_out = 0
        for shard, owned in self._by_shard(roots).items():
            reply = self._force_fail(shard, acker_pb2.ForceFailRequest(root_ids=owned))
            failed += reply.failed_root_ids
            timed_out += reply.timed_out
        done = set(failed)
        given = list(dict.fromkeys(roots))  # in the order given, once each
        # Not failed: absent (ended already, or never started), awaiting their init, or due (timed out instead).
        return {
            "failed": [r for r in given if r in done],
            "timed_out": timed_out,
            "not_failed": [r for r in given if r not in done],
        }

    def fail_spout(self, spout: str) -> dict[str, Any]:
        """Fail every pending tree of ``spout`` on every shard now; how many per shard."""
        per_shard = []
        for shard in range(len(self.addresses)):
            reply = self._force_fail(shard, acker_pb2.ForceFailRequest(spout=spout))
            per_shard.append({"shard": shard, "failed": reply.failed, "timed_out": reply.timed_out})
        return {"spout": spout, "failed": sum(s["failed"] for s in per_shard), "shards": per_shard}
