"""One shard's buffer of pending operations, with ack folding, encoded as packed parallel arrays.

Operations arrive one call at a time (``init``, ``ack``, ...) or as numpy
columns (``add_columns``, from the client's ``*_columns`` methods); either way
the buffer is encoded once, with numpy (:meth:`OpBuffer.encode`), and columns
never become one Python object per operation. Pure: no I/O, no clock, no lock
(the cluster client holds the lock).
"""

from __future__ import annotations

from typing import cast

import numpy as np
from acker_protocol.packed import encode_apply_request
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind

from .columns import distinct

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
        "_chunks",
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
        # Columns added in bulk: (kind, roots, values or None, dedup key, or spout index for INIT).
        self._chunks: list[tuple[int, np.ndarray, np.ndarray | None, int]] = []
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

    def add_columns(
        self, kind: int, roots: np.ndarray, values: np.ndarray | None = None, *, dedup_key: int = 0, spout: str = ""
    ) -> None:
        """Buffer one operation of ``kind`` per root (uint64 arrays the caller checked); folded when encoded.

        ``values`` is required for INIT and ACK; ``dedup_key`` applies to ACKs,
        ``spout`` to INITs. ``size`` counts every operation added: folding
        happens in :meth:`encode`, so the batch sent may be smaller.
        """
        if roots.size == 0:
            return
        tag = dedup_key
        if kind == INIT:
            tag = self._spouts.setdefault(spout, len(self._spouts))
        self._chunks.append((kind, roots, values, tag))
        self.size += int(roots.size)
        self.added += int(roots.size)

    def retry_safe(self, batch_key: int = 0) -> bool:
        """True if the request :meth:`encode` makes with ``batch_key`` may be applied twice.

        That is, every ACK in it carries a dedup key. Decided from the buffer,
        not by reading the encoded request back one operation at a time.
        Conservative: unkeyed ACK columns count as unsafe even if they fold to 0.
        """
        if batch_key:
            return True
        if any(self._acks.values()):
            return False
        return not any(kind == ACK and not key for kind, _, _, key in self._chunks)

    @property
    def folded(self) -> int:
        """Calls that did not become an operation of their own (merged into another)."""
        return self.added - self.size

    def init_roots(self) -> tuple[int, ...]:
        """Roots of the buffered INIT operations."""
        columns = [c[1] for c in self._chunks if c[0] == INIT]
        if not columns:
            return tuple(self._init_roots)
        return tuple(self._init_roots) + tuple(np.concatenate(columns).tolist())

    def encode(self, batch_key: int = 0) -> tuple[bytes, int]:
        """The serialized ApplyRequest and its number of operations: the buffer's one encoding, which the client sends.

        Operations are folded (see the class) and listed by kind, then written
        straight to bytes with numpy (:func:`acker_protocol.packed.encode_apply_request`),
        whether they were added one call at a time or as columns. A non-zero
        ``batch_key`` becomes the dedup key of every unkeyed ACK, so that the
        acker applies them once even if the whole request is sent again after
        a lost response (see :mod:`acker_client.delivery`).
        """
        init_roots, init_values, init_spouts = self._inits()
        fails = self._distinct(FAIL, self._fails)
        resets = self._distinct(RESET_TIMEOUT, self._resets)
        ack_roots, ack_values, ack_keys = self._folded_acks(batch_key)
        n_init, n_fail, n_ack, n_reset = init_roots.size, fails.size, ack_roots.size, resets.size
        kinds = np.repeat(np.array([INIT, FAIL, ACK, RESET_TIMEOUT], dtype=np.uint8), [n_init, n_fail, n_ack, n_reset])
        zeros = np.zeros
        roots = np.concatenate((init_roots, fails, ack_roots, resets))
        values = np.concatenate((init_values, zeros(n_fail, np.uint64), ack_values, zeros(n_reset, np.uint64)))
        dedup_keys = None
        if ack_keys.any():  # no key at all: the field is left out (a smaller request)
            dedup_keys = np.concatenate((zeros(n_init + n_fail, np.uint64), ack_keys, zeros(n_reset, np.uint64)))
        spout_index = None
        if len(self._spouts) > 1:  # one spout: every INIT names spouts[0], no index needed
            spout_index = np.concatenate((init_spouts, zeros(n_fail + n_ack + n_reset, np.uint32)))
        data = encode_apply_request(kinds, roots, values, dedup_keys, list(self._spouts), spout_index)
        return data, int(kinds.size)

    def to_request(self, batch_key: int = 0) -> acker_pb2.ApplyRequest:
        """:meth:`encode`'s request as a message: packed parallel arrays, for inspection (the client sends the bytes)."""
        return acker_pb2.ApplyRequest.FromString(self.encode(batch_key)[0])

    # -- the columns of the request ----------------------------------------------

    def _inits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Roots, values and spout indexes of every buffered INIT: those added one by one first."""
        init_chunks = [c for c in self._chunks if c[0] == INIT]
        roots = _joined(np.asarray(self._init_roots, dtype=np.uint64), [c[1] for c in init_chunks])
        values = _joined(
            np.asarray(self._init_values, dtype=np.uint64), [cast("np.ndarray", c[2]) for c in init_chunks]
        )
        spouts = _joined(
            np.asarray(self._init_spouts, dtype=np.uint32), [np.full(c[1].size, c[3], np.uint32) for c in init_chunks]
        )
        return roots, values, spouts

    def _distinct(self, kind: int, added: dict[int, None]) -> np.ndarray:
        """The roots of ``kind`` (FAIL or RESET_TIMEOUT), each once: the ones added one by one, then the columns'."""
        scalar = np.fromiter(added, np.uint64, len(added))
        columns = [c[1] for c in self._chunks if c[0] == kind]
        if not columns:
            return scalar  # the dict already holds each root once, in the order added
        return distinct(_joined(scalar, columns))

    def _folded_acks(self, batch_key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every buffered ACK folded per (root, dedup key), zero folds dropped; unkeyed ones get ``batch_key``."""
        acks, keyed = self._acks, self._keyed_acks
        columns = [c for c in self._chunks if c[0] == ACK]
        roots = _joined(
            np.fromiter(acks.keys(), np.uint64, len(acks)),
            [np.fromiter((r for r, _ in keyed), np.uint64, len(keyed))] if keyed else [],
            [c[1] for c in columns],
        )
        values = _joined(
            np.fromiter(acks.values(), np.uint64, len(acks)),
            [np.fromiter(keyed.values(), np.uint64, len(keyed))] if keyed else [],
            [cast("np.ndarray", c[2]) for c in columns],
        )
        keys = _joined(
            np.zeros(len(acks), np.uint64),
            [np.fromiter((k for _, k in keyed), np.uint64, len(keyed))] if keyed else [],
            [np.full(c[1].size, c[3], np.uint64) for c in columns],
        )
        if columns and roots.size:
            # The dicts fold the acks added one by one; columns may repeat a (root, key)
            # of theirs or of each other, and the ledger applies one ACK per (tree, key).
            order = np.lexsort((keys, roots))
            roots, values, keys = roots[order], values[order], keys[order]
            starts = np.flatnonzero(np.concatenate(([True], (roots[1:] != roots[:-1]) | (keys[1:] != keys[:-1]))))
            roots, values, keys = roots[starts], np.bitwise_xor.reduceat(values, starts), keys[starts]
        keep = values != 0
        keys = keys[keep]
        if batch_key:
            keys[keys == 0] = batch_key
        return roots[keep], values[keep], keys


def _joined(first: np.ndarray, *more: list[np.ndarray]) -> np.ndarray:
    """``first`` followed by the arrays of ``more``, concatenated only when there is something to add."""
    rest = [a for group in more for a in group]
    return np.concatenate([first, *rest]) if rest else first
