"""acker-bench's columnar load: batches of synthetic trees as numpy columns, and roots that name their batch.

A batch of ``count`` trees is started with one ``init_columns`` call and
acked level by level, one ``ack_columns`` call per level, as a columnar
pipeline stage would. Root ids carry the batch ("chunk") number, so the
outcome reader maps every outcome to its batch's last-ack time with array
arithmetic instead of a per-tree lookup table:

    root = worker + 1 (8 bits) | chunk ^ salt (20 bits) | index * odd ^ salt (36 bits)

Distinct within a run (the index part is a bijection of the tree's index in
its batch, the chunk part of the batch number modulo 2^20) and, through the
random salts, between runs against the same ackers. Edge ids are random.
"""

from __future__ import annotations

import secrets
import time

import numpy as np

__all__ = ["ColumnTrees", "CHUNKS"]

_INDEX_BITS = 36
_CHUNK_BITS = 20
CHUNKS = 1 << _CHUNK_BITS
"""Batch numbers wrap around after this many batches (long after their trees ended)."""
_INDEX_MASK = np.uint64((1 << _INDEX_BITS) - 1)
_CHUNK_MASK = np.uint64(CHUNKS - 1)
_ODD = np.uint64(0x9E3779B97F4A7C15 & ((1 << _INDEX_BITS) - 1) | 1)  # odd: i -> i * odd is a bijection mod 2^36


class ColumnTrees:
    """Starts and acks batches of trees of ``fan_out`` children per tuple, ``depth`` levels, for one worker."""

    def __init__(self, fan_out: int, depth: int, worker: int, seed: int | None = None) -> None:
        if fan_out < 1 or depth < 0:
            raise ValueError("fan_out must be >= 1 and depth >= 0")
        if not 0 <= worker < 255:
            raise ValueError(f"worker must be in [0, 255), got {worker}")
        self.fan_out = fan_out
        self.depth = depth
        self._bits = np.random.default_rng(secrets.randbits(128) if seed is None else seed).bit_generator
        salts = self._bits.random_raw(2)
        self._index_salt = salts[0] & _INDEX_MASK
        self._chunk_salt = salts[1] & _CHUNK_MASK
        self._worker = np.uint64((worker + 1) << 56)
        self.chunk = 0  # batches started

    def roots(self, count: int) -> tuple[int, np.ndarray]:
        """The next batch's number (modulo :data:`CHUNKS`) and its ``count`` root ids."""
        if not 0 < count < 1 << _INDEX_BITS:
            raise ValueError(f"a batch holds 1 to 2^36 - 1 trees, not {count}")
        chunk = self.chunk % CHUNKS
        self.chunk += 1
        with np.errstate(over="ignore"):
            index = (np.arange(count, dtype=np.uint64) * _ODD ^ self._index_salt) & _INDEX_MASK
        tag = (np.uint64(chunk) ^ self._chunk_salt) << np.uint64(_INDEX_BITS)
        return chunk, self._worker | tag | index

    def chunk_of(self, roots: np.ndarray) -> np.ndarray:
        """The batch number (modulo :data:`CHUNKS`) of each root, as array indexes."""
        return (((roots >> np.uint64(_INDEX_BITS)) & _CHUNK_MASK) ^ self._chunk_salt).astype(np.intp)

    def ids(self, count: int) -> np.ndarray:
        """``count`` random non-zero edge ids."""
        ids = self._bits.random_raw(count)
        ids[ids == 0] = 1  # 0 is "no id" on the wire; 2^-64-likely
        return ids

    def run_batch(self, client, spout: str, count: int, sent_at: np.ndarray) -> int:
        """Start ``count`` trees and ack every tuple of them, level by level; return the ack operations.

        ``sent_at[chunk]`` gets the time the batch's last ack call started.
        """
        chunk, roots = self.roots(count)
        spout_ids = self.ids(count)
        client.init_columns(roots, spout_ids, spout)
        level = spout_ids.reshape(count, 1)  # each tree's tuples at this level
        acks = 0
        for _ in range(self.depth):
            width = level.shape[1]
            children = self.ids(count * width * self.fan_out).reshape(count, width, self.fan_out)
            # A parent's ack carries its id XOR its children's edges (Storm's out_ack_val).
            values = level ^ np.bitwise_xor.reduce(children, axis=2)
            client.ack_columns(np.repeat(roots, width), values.ravel())
            acks += values.size
            level = children.reshape(count, width * self.fan_out)
        sent_at[chunk] = time.perf_counter()
        client.ack_columns(np.repeat(roots, level.shape[1]), level.ravel())
        return acks + level.size
