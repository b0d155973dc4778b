"""acker-bench's columnar load: batches of synthetic trees started by the bulk spout and acked as numpy columns.

A batch of ``count`` trees is started with one ``Spout.emit_columns`` call
(which admits it under ``max_pending``, tracks it for the backstop and sends
one ``init_columns``) and acked level by level, one ``ack_columns`` call per
level, as a columnar pipeline stage would. The message ids name their batch,

    message id = batch << 32 | index in the batch

so the ``on_outcomes`` callback maps every acked record to its batch's
last-ack time with array arithmetic (:meth:`ColumnTrees.latencies`) instead
of a per-tree lookup table. Edge ids below the spout tuple are random.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["ColumnTrees", "CHUNKS", "INDEX_BITS"]

INDEX_BITS = 32
"""Low bits of a message id: the tree's index in its batch (a batch holds fewer than 2^32 trees)."""
CHUNKS = 1 << 20
"""Batches whose last-ack time is remembered: batch ``b`` is kept at ``b % CHUNKS``, long after its trees ended
(at most ``max_pending`` trees, so batches, are in flight at once)."""


class ColumnTrees:
    """Starts and acks batches of trees of ``fan_out`` children per tuple, ``depth`` levels, through a bulk spout."""

    def __init__(self, fan_out: int, depth: int, seed: int | None = None) -> None:
        if fan_out < 1 or depth < 0:
            raise ValueError("fan_out must be >= 1 and depth >= 0")
        self.fan_out = fan_out
        self.depth = depth
        self._bits = np.random.default_rng(secrets.randbits(128) if seed is None else seed).bit_generator
        self.batches = 0  # batches numbered so far
        self.sent_at = np.zeros(CHUNKS, dtype=np.float64)  # perf_counter() of each batch's last ack call

    def message_ids(self, count: int) -> np.ndarray:
        """The next batch's ``count`` message ids (int64: the batch number above the index)."""
        if not 0 < count < 1 << INDEX_BITS:
            raise ValueError(f"a batch holds 1 to 2^32 - 1 trees, not {count}")
        batch = self.batches
        self.batches += 1
        return (batch << INDEX_BITS) + np.arange(count, dtype=np.int64)

    def latencies(self, acked: Sequence[int], now: float) -> np.ndarray:
        """Seconds from each acked record's batch's last ack call to ``now`` (``acked``: its message ids)."""
        # One conversion per callback: the spout hands message ids over as a list of Python ints.
        ids = np.fromiter(acked, dtype=np.int64, count=len(acked))
        return now - self.sent_at[(ids >> INDEX_BITS) % CHUNKS]

    def ids(self, count: int) -> np.ndarray:
        """``count`` random non-zero edge ids."""
        ids = self._bits.random_raw(count)
        ids[ids == 0] = 1  # 0 is "no id" on the wire; 2^-64-likely
        return ids

    def ack_batch(self, client, batch: int, roots: np.ndarray, edges: np.ndarray) -> int:
        """Ack every tuple of the trees ``roots`` (spout tuple ``{roots[i]: edges[i]}``), level by level.

        Returns the ack operations; ``sent_at[batch % CHUNKS]`` gets the time
        the last ``ack_columns`` call started.
        """
        count = roots.size
        level = edges.reshape(count, 1)  # each tree's tuples at this level
        acks = 0
        for _ in range(self.depth):
            width = level.shape[1]
            children = self.ids(count * width * self.fan_out).reshape(count, width, self.fan_out)
            # A parent's ack carries its id XOR its children's edges (Storm's out_ack_val).
            values = level ^ np.bitwise_xor.reduce(children, axis=2)
            client.ack_columns(np.repeat(roots, width), values.ravel())
            acks += values.size
            level = children.reshape(count, width * self.fan_out)
        self.sent_at[batch % CHUNKS] = time.perf_counter()
        client.ack_columns(np.repeat(roots, level.shape[1]), level.ravel())
        return acks + level.size

    def run_batch(self, spout, client, count: int, timeout: float | None = None) -> int:
        """Emit ``count`` trees through ``spout`` (waiting up to ``timeout`` for room) and ack them all; the acks.

        Raises :class:`~acker_client.errors.SpoutFull` (nothing emitted) if
        they do not fit under ``max_pending`` in time.
        """
        message_ids = self.message_ids(count)
        roots, edges = spout.emit_columns(message_ids, timeout=timeout)
        return self.ack_batch(client, int(message_ids[0]) >> INDEX_BITS, roots, edges)
