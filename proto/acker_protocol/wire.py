"""The wire vocabulary both sides share: operation kinds, outcomes, id and spout-name limits, sharding.

Server and client check the same rules with the same words: the client refuses
a bad id or name before it can spoil a whole batch, and the server refuses it
again because it cannot trust its clients.

The enums are built from the generated proto enum, and :func:`check_mirrors`
(run at import) fails if the .proto gains or renumbers a value they lack.
"""

from __future__ import annotations

from enum import IntEnum

from google.protobuf.descriptor import EnumDescriptor

from .text import clip
from .v1 import acker_pb2

__all__ = [
    "OpKind",
    "Outcome",
    "MAX_ID",
    "MAX_SPOUT_NAME_BYTES",
    "shard_of",
    "MAX_REPLICAS",
    "replica_shards",
    "check_replicas",
    "owners_without_replica",
    "check_root",
    "check_id",
    "check_spout_name",
    "check_mirrors",
    "HELD_AT_BOUND",
    "held_at_bound",
]

# Ids are unsigned 64-bit (fixed64 on the wire); root id 0 means "no tree".
MAX_ID = (1 << 64) - 1
# Spout names are repeated in every Subscribe and retained per spout: keep them short.
MAX_SPOUT_NAME_BYTES = 256


class OpKind(IntEnum):
    """Ledger operation kinds, with the wire values of the proto enum ``OpKind``."""

    INIT = acker_pb2.OP_KIND_INIT
    ACK = acker_pb2.OP_KIND_ACK
    FAIL = acker_pb2.OP_KIND_FAIL
    RESET_TIMEOUT = acker_pb2.OP_KIND_RESET_TIMEOUT


class Outcome(IntEnum):
    """How a tree ended, with the wire values of the proto enum ``Outcome``.

    The one outcome vocabulary from the acker's stream to a spout's
    ``on_fail`` and a pipeline's ``on_outcome``; stored as ``outcome.name``.
    """

    ACKED = acker_pb2.OUTCOME_ACKED
    FAILED = acker_pb2.OUTCOME_FAILED
    TIMED_OUT = acker_pb2.OUTCOME_TIMED_OUT
    TIMEOUT_RESET = acker_pb2.OUTCOME_TIMEOUT_RESET  # a notification, not an end: the tree got a fresh timeout
    LOST = acker_pb2.OUTCOME_LOST  # never from an acker: the spout's verdict when no outcome can arrive
    # Never from an acker: the Spark pipeline's verdict for a tree that timed out or was
    # lost because a bolt's acks for it could not be delivered (executor cannot reach it).
    ACKS_UNDELIVERED = acker_pb2.OUTCOME_ACKS_UNDELIVERED
    # A timeout at the acker's --max-tree-lifetime cap: the tree was kept alive (by progress
    # or RESET_TIMEOUTs) and still did not finish. The spout fails it like TIMED_OUT.
    LIFETIME_EXCEEDED = acker_pb2.OUTCOME_LIFETIME_EXCEEDED


def check_mirrors(enum: type[IntEnum], proto_enum: EnumDescriptor, prefix: str) -> None:
    """Raise ImportError unless ``enum`` has exactly the proto enum's values (UNSPECIFIED = 0 aside)."""
    wire = {v.name.removeprefix(prefix): v.number for v in proto_enum.values if v.number != 0}
    ours = {member.name: int(member) for member in enum}
    if wire != ours:
        raise ImportError(
            f"{enum.__name__} is {ours} but the proto enum is {wire}; update acker_protocol.wire after changing the .proto"
        )


check_mirrors(OpKind, acker_pb2.DESCRIPTOR.enum_types_by_name["OpKind"], "OP_KIND_")
check_mirrors(Outcome, acker_pb2.DESCRIPTOR.enum_types_by_name["Outcome"], "OUTCOME_")


def shard_of(root: int, shard_count: int) -> int:
    """The index of the shard that owns ``root`` among ``shard_count`` shards."""
    return root % shard_count


# Replication factor: 1 (each tree on one acker) or 2 (on its shard and the next one).
MAX_REPLICAS = 2


def replica_shards(root: int, shard_count: int, replicas: int = 1) -> tuple[int, ...]:
    """The shards that keep ``root``: its owner ``root % shard_count`` first, then the next ``replicas - 1`` shards.

    >>> replica_shards(7, 3, 2)
    (1, 2)
    >>> replica_shards(8, 3, 2)
    (2, 0)
    """
    owner = root % shard_count
    return tuple((owner + k) % shard_count for k in range(replicas))


def owners_without_replica(down: set[int], shard_count: int, replicas: int = 1) -> set[int]:
    """The shards whose roots have no reachable replica when the shards in ``down`` are unreachable.

    >>> sorted(owners_without_replica({1}, 3, 2)), sorted(owners_without_replica({1, 2}, 3, 2))
    ([], [1])
    """
    return {s for s in range(shard_count) if all((s + k) % shard_count in down for k in range(replicas))}


def check_replicas(replicas: int, shard_count: int) -> None:
    """Raise ValueError unless ``replicas`` is 1, or 2 with at least two shards (a tree's copies on different ackers)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be 1 or {MAX_REPLICAS}, got {replicas}")
    if replicas > shard_count:
        raise ValueError(
            f"replicas {replicas} needs at least {replicas} shards (a tree's copies live on different ackers), "
            f"got a shard count of {shard_count}"
        )


def check_root(root: int) -> None:
    """Raise ValueError unless ``root`` is a non-zero 64-bit unsigned integer."""
    if not 0 < root <= MAX_ID:
        raise ValueError(f"root id {root!r} is not a non-zero 64-bit unsigned integer")


def check_id(root: int, value: int, what: str = "value") -> None:
    """Raise ValueError unless ``root`` is a valid root id and ``value`` (named ``what``) a 64-bit unsigned integer."""
    # A zero or out-of-range id would make the acker refuse the whole batch,
    # dropping other callers' operations with it: refuse it where it is made.
    check_root(root)
    if not 0 <= value <= MAX_ID:
        raise ValueError(f"{what} {value!r} for root {root} is not a 64-bit unsigned integer")


def check_spout_name(name: str) -> None:
    """Raise ValueError unless ``name`` is 1 to :data:`MAX_SPOUT_NAME_BYTES` bytes of UTF-8."""
    size = len(name.encode("utf-8"))
    if not 0 < size <= MAX_SPOUT_NAME_BYTES:
        # Clipped: the message travels in gRPC trailers, which a 64 KiB name would overflow.
        raise ValueError(
            f"spout name {clip(name)} is {size} bytes; spout names must be 1 to {MAX_SPOUT_NAME_BYTES} bytes"
        )


# Ends the message of an UNAVAILABLE refusal at an acker's bound of held operations (a layout change's or a
# catch-up's, --max-held-operations). The acker is alive and will need the operations once what it awaits is
# installed, so a client retries such a batch and never skips it as it may skip a copy for an unreachable
# replica (skipped after the partner's cut, the update would be missed: docs/acker-semantics.md).
HELD_AT_BOUND = "[held operations at their bound]"


def held_at_bound(detail: str) -> bool:
    """Whether a refusal's message says the acker refused at its bound of held operations (retry, never skip)."""
    return detail.endswith(HELD_AT_BOUND)
