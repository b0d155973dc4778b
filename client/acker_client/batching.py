"""One shard's buffer of pending operations, with ack folding, encoded as packed parallel arrays.

Pure: no I/O, no clock, no lock (the cluster client holds the lock).
"""

from __future__ import annotations

from typing import cast

from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

__all__ = ["OpBuffer", "INIT", "ACK", "FAIL", "RESET_TIMEOUT"]

# Plain ints: they go into a protobuf repeated enum field by the thousand.
INIT = int(OpKind.INIT)
ACK = int(OpKind.ACK)
FAIL = int(OpKind.FAIL)
RESET_TIMEOUT = int(OpKind.RESET_TIMEOUT)


class OpBuffer:
    """Operations waiting to be sent to one shard.

    Acks for the same ``(root, dedup_key)`` fold into one operation: XOR is
    associative and commutative, so the ledger ends in the same state. Folding
    is also *required* for keyed acks, because the ledger ignores a second ack
    whose key it has already applied to the tree. An ack that folds to 0 is a
    no-op for the ledger and is not sent. FAIL and RESET_TIMEOUT are
    idempotent, so repeats within a batch are sent once.

    The request lists operations by kind: INITs, then FAILs, then ACKs, then
    RESET_TIMEOUTs. Order never changes a tree's checksum; putting FAILs before
    ACKs means that if a batch holds both a fail and the acks that would
    complete the same tree, the tree fails (and is replayed) rather than acks.
    """

    __slots__ = (
        "_init_roots",
        "_init_values",
        "_init_spouts",
        "_spouts",
        "_fails",
        "_acks",
        "_keyed_acks",
        "_resets",
        "size",
        "added",
        "started",
    )

    def __init__(self) -> None:
        self._init_roots: list[int] = []
        self._init_values: list[int] = []
        self._init_spouts: list[int] = []
        self._spouts: dict[str, int] = {}
        self._fails: dict[int, None] = {}  # dicts keep insertion order, sets do not
        self._acks: dict[int, int] = {}  # root -> folded value
        self._keyed_acks: dict[tuple[int, int], int] = {}  # (root, key) -> folded value
        self._resets: dict[int, None] = {}
        self.size = 0  # distinct operations buffered (what will be sent, zero acks aside)
        self.added = 0  # calls buffered, folded or not
        self.started: float | None = None  # clock time of the first op, set by the owner

    def __len__(self) -> int:
        return self.size

    def init(self, root: int, value: int, spout: str) -> None:
        """Buffer INIT(root, value) for ``spout``."""
        index = self._spouts.setdefault(spout, len(self._spouts))
        self._init_roots.append(root)
        self._init_values.append(value)
        self._init_spouts.append(index)
        self.size += 1
        self.added += 1

    def ack(self, root: int, value: int, dedup_key: int = 0) -> None:
        """Buffer ACK(root, value), folded into a buffered ack with the same root and key."""
        self.added += 1
        if dedup_key:
            table: dict = self._keyed_acks
            slot: object = (root, dedup_key)
        else:
            table, slot = self._acks, root
        old = table.get(slot)
        if old is None:
            table[slot] = value
            self.size += 1
        else:
            table[slot] = old ^ value

    def fail(self, root: int) -> None:
        """Buffer FAIL(root), once per batch."""
        self._once(self._fails, root)

    def reset_timeout(self, root: int) -> None:
        """Buffer RESET_TIMEOUT(root), once per batch."""
        self._once(self._resets, root)

    def _once(self, table: dict[int, None], root: int) -> None:
        self.added += 1
        if root not in table:
            table[root] = None
            self.size += 1

    @property
    def folded(self) -> int:
        """Calls that did not become an operation of their own (merged into another)."""
        return self.added - self.size

    def init_roots(self) -> tuple[int, ...]:
        """Roots of the buffered INIT operations."""
        return tuple(self._init_roots)

    def to_request(self, batch_key: int = 0) -> acker_pb2.ApplyRequest:
        """Encode as one ApplyRequest of packed parallel arrays (no per-operation sub-messages).

        A non-zero ``batch_key`` becomes the dedup key of every unkeyed ACK, so
        that the acker applies them once even if the whole request is sent
        again after a lost response (see :mod:`acker_client.delivery`).
        """
        acks = [(r, v) for r, v in self._acks.items() if v]
        keyed = [(r, k, v) for (r, k), v in self._keyed_acks.items() if v]
        n_init, n_fail, n_reset = len(self._init_roots), len(self._fails), len(self._resets)
        kinds = [INIT] * n_init + [FAIL] * n_fail + [ACK] * (len(acks) + len(keyed)) + [RESET_TIMEOUT] * n_reset
        roots = self._init_roots + list(self._fails)
        values = self._init_values + [0] * n_fail
        if acks:
            ack_roots, ack_values = zip(*acks)
            roots += ack_roots
            values += ack_values
        roots += [r for r, _, _ in keyed]
        values += [v for _, _, v in keyed]
        roots += self._resets
        values += [0] * n_reset
        spouts = list(self._spouts)
        # Plain ints are the enum's wire values.
        request = acker_pb2.ApplyRequest(
            kinds=cast("list[acker_pb2.OpKind.ValueType]", kinds), root_ids=roots, values=values, spouts=spouts
        )
        if keyed or (acks and batch_key):
            request.dedup_keys.extend([0] * (n_init + n_fail))
            request.dedup_keys.extend([batch_key] * len(acks))
            request.dedup_keys.extend([k for _, k, _ in keyed])
            request.dedup_keys.extend([0] * n_reset)
        if len(spouts) > 1:
            request.spout_index.extend(self._init_spouts)
            request.spout_index.extend([0] * (len(kinds) - n_init))
        return request
