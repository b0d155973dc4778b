"""Operating a running shard (Inspect, ForceFail): the checks and limits of Inspect and ForceFail, without gRPC.

The servicer hands the request's roots here; :func:`check_roots` refuses what
Apply would refuse (a zero root, a root another shard owns) plus too many roots
at once, so a refused call changes nothing and says what to do instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from acker_protocol.wire import MAX_ID, shard_of

from .batch import BatchTooLarge, InvalidBatch, WrongShard

__all__ = ["MAX_ROOTS", "MAX_OLDEST", "check_roots", "check_oldest", "AGE_BUCKETS"]

# Per call: an Inspect or ForceFail answer stays far below any message limit.
MAX_ROOTS = 10_000
MAX_OLDEST = 10_000

# Pending trees' ages in the metrics (seconds): a healthy tree is young; the upper
# buckets show trees kept alive by progress or resets toward a lifetime cap.
AGE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def check_roots(roots: Sequence[int], *, shard_index: int, shard_count: int, replicas: int = 1) -> None:
    """Raise a :class:`~acker_service.batch.BatchError` unless every root is valid and kept by this shard.

    Kept: owned, or with ``replicas`` 2 followed (the previous shard's), as Apply accepts them.
    """
    if len(roots) > MAX_ROOTS:
        raise BatchTooLarge(f"{len(roots)} roots in one call, more than {MAX_ROOTS}; split the call")
    for root in roots:
        if not 0 < root <= MAX_ID:
            raise InvalidBatch(f"root id {root} is not a non-zero 64-bit unsigned integer")
        owner = shard_of(root, shard_count)
        if (shard_index - owner) % shard_count >= replicas:
            raise WrongShard(
                f"root {root} belongs to shard {owner} of {shard_count}, not to this shard {shard_index}; "
                "send it to the acker that owns it (acker-ctl routes by root % shard_count)"
            )


def check_oldest(k: int) -> None:
    """Raise InvalidBatch unless ``k`` oldest trees may be listed in one answer."""
    if not 0 <= k <= MAX_OLDEST:
        raise InvalidBatch(f"oldest must be 0..{MAX_OLDEST}, got {k}")
