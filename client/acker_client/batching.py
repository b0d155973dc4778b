"""One shard's buffer of pending operations, with ack folding, encoded as packed parallel arrays.

Operations arrive one call at a time (``init``, ``ack``, ...) or as numpy
columns (``add_columns``, from the client's ``*_columns`` methods); a buffer
holding columns is folded and encoded with numpy, never one Python object per
operation. Pure: no I/O, no clock, no lock (the cluster client holds the lock).
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
        happens in :meth:`to_request`, so the batch sent may be smaller.
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
        """True if the request :meth:`to_request` makes with ``batch_key`` may be applied twice.

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
        """The serialized ApplyRequest and its number of operations: what the client sends, encoded once.

        Buffered columns are written straight to bytes by numpy; buffered single
        operations go through the generated message, serialized once.
        """
        if self._chunks:
            data, count = self._encode_columns(batch_key)
            return data, count
        request = self.to_request(batch_key)
        return request.SerializeToString(), len(request.kinds)

    def to_request(self, batch_key: int = 0) -> acker_pb2.ApplyRequest:
        """Encode as one ApplyRequest of packed parallel arrays (no per-operation sub-messages).

        A non-zero ``batch_key`` becomes the dedup key of every unkeyed ACK, so
        that the acker applies them once even if the whole request is sent
        again after a lost response (see :mod:`acker_client.delivery`). The
        client sends :meth:`encode`'s bytes; this message is for inspection.
        """
        if self._chunks:
            return acker_pb2.ApplyRequest.FromString(self._encode_columns(batch_key)[0])
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

    # -- the columnar encoding ------------------------------------------------

    def _column(self, kind: int, scalar: list[int] | None = None) -> np.ndarray:
        parts = [np.asarray(scalar, dtype=np.uint64)] if scalar else []
        parts.extend(c[1] for c in self._chunks if c[0] == kind)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def _encode_columns(self, batch_key: int) -> tuple[bytes, int]:
        """The request bytes and operations, folded and ordered as :meth:`to_request` promises, built with numpy."""
        init_chunks = [c for c in self._chunks if c[0] == INIT]
        init_roots = self._column(INIT, self._init_roots)
        init_values = np.concatenate(
            [np.asarray(self._init_values, dtype=np.uint64)] + [cast("np.ndarray", c[2]) for c in init_chunks]
        )
        init_spouts = np.concatenate(
            [np.asarray(self._init_spouts, dtype=np.uint32)]
            + [np.full(c[1].size, c[3], dtype=np.uint32) for c in init_chunks]
        )
        fails = distinct(self._column(FAIL, list(self._fails)))
        resets = distinct(self._column(RESET_TIMEOUT, list(self._resets)))
        ack_roots, ack_values, ack_keys = self._folded_acks(batch_key)
        n_init, n_fail, n_ack, n_reset = init_roots.size, fails.size, ack_roots.size, resets.size
        kinds = np.repeat(np.array([INIT, FAIL, ACK, RESET_TIMEOUT], dtype=np.uint8), [n_init, n_fail, n_ack, n_reset])
        zeros = np.zeros
        roots = np.concatenate((init_roots, fails, ack_roots, resets))
        values = np.concatenate((init_values, zeros(n_fail, np.uint64), ack_values, zeros(n_reset, np.uint64)))
        dedup_keys = None
        if ack_keys.any():
            dedup_keys = np.concatenate((zeros(n_init + n_fail, np.uint64), ack_keys, zeros(n_reset, np.uint64)))
        spout_index = None
        if len(self._spouts) > 1:
            spout_index = np.concatenate((init_spouts, zeros(n_fail + n_ack + n_reset, np.uint32)))
        data = encode_apply_request(kinds, roots, values, dedup_keys, list(self._spouts), spout_index)
        return data, int(kinds.size)

    def _folded_acks(self, batch_key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every buffered ACK folded per (root, dedup key), zero folds dropped; unkeyed ones get ``batch_key``."""
        roots = [np.fromiter(self._acks.keys(), np.uint64, len(self._acks))]
        values = [np.fromiter(self._acks.values(), np.uint64, len(self._acks))]
        keys = [np.zeros(len(self._acks), np.uint64)]
        if self._keyed_acks:
            roots.append(np.fromiter((r for r, _ in self._keyed_acks), np.uint64, len(self._keyed_acks)))
            keys.append(np.fromiter((k for _, k in self._keyed_acks), np.uint64, len(self._keyed_acks)))
            values.append(np.fromiter(self._keyed_acks.values(), np.uint64, len(self._keyed_acks)))
        for kind, chunk_roots, chunk_values, key in self._chunks:
            if kind == ACK:
                roots.append(chunk_roots)
                values.append(cast("np.ndarray", chunk_values))
                keys.append(np.full(chunk_roots.size, key, np.uint64))
        all_roots, all_values, all_keys = np.concatenate(roots), np.concatenate(values), np.concatenate(keys)
        if all_roots.size == 0:
            return all_roots, all_values, all_keys
        # The ledger applies one ACK per (tree, key): acks sharing both must be one operation.
        order = np.lexsort((all_keys, all_roots))
        all_roots, all_values, all_keys = all_roots[order], all_values[order], all_keys[order]
        new_group = np.concatenate(([True], (all_roots[1:] != all_roots[:-1]) | (all_keys[1:] != all_keys[:-1])))
        starts = np.flatnonzero(new_group)
        folded = np.bitwise_xor.reduceat(all_values, starts)
        keep = folded != 0
        out_keys = all_keys[starts][keep]
        if batch_key:
            out_keys[out_keys == 0] = batch_key
        return all_roots[starts][keep], folded[keep], out_keys
