"""What both ledger engines report about single trees, and the timeout rules they share (progress timeouts, the lifetime cap).

:class:`TreeInfo` is one root's state as ``inspect`` and ``oldest`` return it;
:class:`TreeStatus` mirrors the proto enum of the same name.
:func:`check_timeout_rules` refuses a timeout mode or lifetime cap the engines
cannot honour, with the same words for both.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import NamedTuple

from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import check_mirrors

__all__ = ["TIMEOUT_MODES", "TreeInfo", "TreeStatus", "check_timeout_rules", "MAX_LIFETIME_RANGE"]

# fixed: a tree's timeout runs from its init or its last RESET_TIMEOUT (Storm's rule);
# progress: every applied ACK restarts it too (Storm's STORM-2359 proposal).
TIMEOUT_MODES = ("fixed", "progress")

# The native core keeps start times modulo 2^39 microseconds and tells an age from a
# later start by the half range: a cap plus one rotation period must stay below it.
MAX_LIFETIME_RANGE = 2**38 / 1e6


class TreeStatus(IntEnum):
    """Where a root stands on its acker (the proto enum ``TreeStatus``)."""

    ABSENT = acker_pb2.TREE_STATUS_ABSENT
    PENDING = acker_pb2.TREE_STATUS_PENDING
    AWAITING_INIT = acker_pb2.TREE_STATUS_AWAITING_INIT
    EXPIRING = acker_pb2.TREE_STATUS_EXPIRING


check_mirrors(TreeStatus, acker_pb2.DESCRIPTOR.enum_types_by_name["TreeStatus"], "TREE_STATUS_")


class TreeInfo(NamedTuple):
    """One root's state: ``age_seconds`` since its init (since its first message while awaiting it)."""

    root: int
    status: TreeStatus
    spout: str | None
    age_seconds: float
    failed: bool
    resets: int
    dedup_keys: int


def check_timeout_rules(mode: str, max_tree_lifetime: float, rotation_period: float) -> None:
    """Raise ValueError unless the mode is known and the cap (0: none) is one both engines can keep."""
    if mode not in TIMEOUT_MODES:
        raise ValueError(f"timeout_mode must be one of {', '.join(TIMEOUT_MODES)}, got {mode!r}")
    if not (max_tree_lifetime >= 0 and math.isfinite(max_tree_lifetime)):
        raise ValueError(
            f"max_tree_lifetime must be zero (no cap) or a positive number of seconds, got {max_tree_lifetime}"
        )
    if max_tree_lifetime + rotation_period >= MAX_LIFETIME_RANGE:
        raise ValueError(
            f"max_tree_lifetime plus one rotation period must stay below {MAX_LIFETIME_RANGE:.0f} seconds, "
            f"got {max_tree_lifetime}"
        )
