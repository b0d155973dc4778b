"""Ledger entries copied out of and into a :class:`~acker_service.reference_ledger.ReferenceLedger`.

The simulation moves entries by reading the reference engine's buckets here,
in one place, not through the ledger contract's export and import (the
server's handoffs use those). Importing goes through the ledger's own
``apply`` only: an entry is re-created by the operations that rebuild it, so
every rule of the ledger (set-once init, dedup keys, settling) applies to
imported entries as to any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from acker_protocol.wire import OpKind

from ..batch import Batch
from ..outcome_columns import Resolution
from ..reference_ledger import ReferenceLedger
from ..tree_info import TreeStatus

__all__ = ["EntryCopy", "Op", "apply_op", "collect_due", "copy_entries", "import_ops", "xor_merge_ops"]


@dataclass(frozen=True)
class Op:
    """One ledger operation as a client sends it (``key``: the ACK's dedup key, 0 for none)."""

    kind: OpKind
    root: int
    value: int = 0
    key: int = 0
    spout: str = ""


@dataclass(frozen=True)
class EntryCopy:
    """One ledger entry, as a handoff or a snapshot carries it."""

    root: int
    val: int
    spout: str | None
    failed: bool
    keys: tuple[int, ...]


def apply_op(ledger: ReferenceLedger, op: Op) -> list[Resolution]:
    """Apply one operation by the ledger's own rules; the trees it ended (and any that expired first).

    This enters the reference engine behind its wire edge (decoding and
    validation, which the server tests cover): a simulated acker checks
    ownership itself, and thousands of runs must stay fast.
    """
    batch = Batch(
        kinds=np.array([int(op.kind)], np.int64),
        roots=np.array([op.root], np.uint64),
        values=np.array([op.value], np.uint64),
        dedup_keys=np.array([op.key], np.uint64),
        spouts=[op.spout] if op.kind == OpKind.INIT else [],
    )
    return ledger._apply_batch(batch).resolutions  # noqa: SLF001


def collect_due(ledger: ReferenceLedger) -> list[Resolution]:
    """Rotate as the simulated clock says and collect every due tree (the ledger's ``advance``, as resolutions)."""
    return ledger._advance_some(None)[0]  # noqa: SLF001


def copy_entries(ledger: ReferenceLedger, pick: Callable[[int], bool], *, remove: bool) -> list[EntryCopy]:
    """Copy (and with ``remove`` take out) every entry whose root ``pick`` selects.

    The caller collects due entries first (``advance()``), so only live
    buckets hold entries. Removed trees leave without an outcome: the caller
    counts them as handed off, which conservation accounts for.
    """
    found: list[EntryCopy] = []
    for bucket in ledger._pending.live_buckets():  # noqa: SLF001 - the stand-in for an export API, see module doc
        for root in [r for r in bucket if pick(r)]:
            entry = bucket[root]
            seen = entry.dedup
            keys = () if seen is None else tuple(sorted(seen)) if isinstance(seen, set) else (seen,)
            found.append(EntryCopy(root, entry.val, entry.spout, entry.failed, keys))
            if remove:
                del bucket[root]
                if entry.spout is not None:
                    ledger._open_trees -= 1  # noqa: SLF001
    found.sort(key=lambda e: e.root)  # bucket order is insertion order; sorted keeps runs easy to read
    return found


def import_ops(entry: EntryCopy) -> list[Op]:
    """The operations that re-create ``entry`` in a ledger that has no entry for its root."""
    ops: list[Op] = []
    keys = list(entry.keys)
    if entry.spout is not None:
        ops.append(Op(OpKind.INIT, entry.root, entry.val, 0, entry.spout))
    else:
        ops.append(Op(OpKind.ACK, entry.root, entry.val, keys.pop(0) if keys else 0))
    # An ACK of value 0 changes no checksum: it only records the dedup key.
    ops.extend(Op(OpKind.ACK, entry.root, 0, key) for key in keys)
    if entry.failed:
        ops.append(Op(OpKind.FAIL, entry.root))
    return ops


def xor_merge_ops(ledger: ReferenceLedger, entry: EntryCopy) -> list[Op]:
    """The operations that merge ``entry`` into whatever the ledger holds for its root by XOR.

    Exact for two disjoint sets of updates; wrong when the ledger already holds
    some of the entry's updates (they cancel), which the broken catch-up
    variant does on purpose.
    """
    (info,) = ledger.inspect([entry.root])
    if info.status in (TreeStatus.PENDING, TreeStatus.EXPIRING):
        first = Op(OpKind.ACK, entry.root, entry.val, 0)  # the init is set-once: XOR the value in as an ack
    elif entry.spout is not None:
        first = Op(OpKind.INIT, entry.root, entry.val, 0, entry.spout)
    else:
        first = Op(OpKind.ACK, entry.root, entry.val, 0)
    ops = [first] + [Op(OpKind.ACK, entry.root, 0, key) for key in entry.keys]
    if entry.failed:
        ops.append(Op(OpKind.FAIL, entry.root))
    return ops
