"""Column-wise tracking arithmetic on numpy uint64 arrays: checking ids, XOR folding, deterministic ids.

What :class:`~acker_client.bolt.BoltCollector` does one tuple at a time, for a
whole batch at once: the Arrow bolts, the bulk spout and the columnar
``ClusterClient`` methods (``init_columns``, ``ack_columns``, ...) use these,
so no operation becomes a Python object on the way to the wire.

Deterministic ids come from a splitmix64-style mixer (multiply-xorshift rounds
with wrapping uint64 arithmetic). It is not a cryptographic hash, and needs not
be: the acker's guarantee rests on edge ids that look independent and uniform,
so that a tree's XOR of ids returns to 0 only when every edge was acked; the
mixer's outputs pass that bar (it is a bijection with full avalanche), and
distinct inputs (salt, parent digest, ordinal) go through different mixing
chains.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np

__all__ = [
    "U64",
    "as_ids",
    "as_roots",
    "random_ids",
    "distinct",
    "member_of",
    "fold_xor",
    "mix64",
    "pair_digest",
    "row_digests",
    "derive_ids",
    "mix64_int",
    "message_digest",
    "edge_key",
    "parent_key",
    "derive_id",
    "shard_slices",
    "replica_slices",
]

U64 = np.dtype(np.uint64)

# splitmix64's constants, as Python ints (for the one-value twins below) and as numpy scalars.
_GOLDEN_INT, _M1_INT, _M2_INT = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN, _M1, _M2 = np.uint64(_GOLDEN_INT), np.uint64(_M1_INT), np.uint64(_M2_INT)
# Domain constants keep a pair digest, an edge id and a salt from ever sharing a mixing chain.
_PAIR_DOMAIN = np.uint64(0x61636B65722F7061)  # "acker/pa"
_EDGE_DOMAIN = np.uint64(0x61636B65722F6564)  # "acker/ed"
_MASK = (1 << 64) - 1


def as_ids(values: Any, what: str = "value") -> np.ndarray:
    """``values`` as a 1-d uint64 array; ValueError for negative, fractional or over-64-bit entries."""
    if isinstance(values, np.ndarray) and values.dtype == U64:
        array = values
    else:
        array = np.asarray(values)
        if array.dtype.kind == "u":
            array = array.astype(U64, copy=False)
        elif array.dtype.kind == "i":
            if array.size and int(array.min()) < 0:
                raise ValueError(f"{what}s must be unsigned 64-bit integers; got a negative {what}")
            array = array.astype(U64)
        elif array.size == 0:
            array = np.zeros(0, dtype=U64)
        elif not isinstance(values, np.ndarray) and array.dtype.kind in "fO":
            # A Python list mixing small ints with ints >= 2^63 becomes float64 or
            # object in numpy: convert exactly from the ints, refusing non-integers.
            array = _exact(values, what)
        else:
            raise ValueError(f"{what}s must be unsigned 64-bit integers, not an array of {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{what}s must be a 1-d array, got shape {array.shape}")
    return array


def _exact(values: Any, what: str) -> np.ndarray:
    try:
        ints = [operator.index(v) for v in values]
        return np.array(ints, dtype=U64)
    except (OverflowError, TypeError) as err:
        raise ValueError(f"{what}s must be unsigned 64-bit integers: {err}") from None


def as_roots(roots: Any) -> np.ndarray:
    """``roots`` as a uint64 array; ValueError if any is 0 (0 means "no tree" on the wire)."""
    array = as_ids(roots, "root id")
    if array.size and not array.all():
        at = int(np.flatnonzero(array == 0)[0])
        raise ValueError(f"root id at position {at} is 0; root ids must be non-zero 64-bit unsigned integers")
    return array


def random_ids(count: int) -> np.ndarray:
    """``count`` random non-zero uint64 ids from one read of the OS CSPRNG (``os.urandom``), safe across forks.

    The column form of :func:`acker_client.ids.new_id`: 0 means "no tree" or
    "complete" on the wire, so zeros (odds 2^-64 each) are drawn again.
    """
    if count < 0:
        raise ValueError(f"cannot draw {count} ids")
    ids = np.frombuffer(os.urandom(8 * count), dtype=U64).copy()
    zero = np.flatnonzero(ids == 0)
    while zero.size:
        ids[zero] = np.frombuffer(os.urandom(8 * zero.size), dtype=U64)
        zero = zero[ids[zero] == 0]
    return ids


def distinct(ids: np.ndarray) -> np.ndarray:
    """The distinct values of ``ids``, sorted: ``np.unique(ids)``, by sorting.

    numpy 2.4's ``np.unique`` hashes, and over many distinct 64-bit values
    (random ids) it is far slower than one sort (the figures and their command:
    docs/benchmarks.md).

    >>> distinct(np.array([5, 3, 5], dtype=np.uint64))
    array([3, 5], dtype=uint64)
    """
    ordered = np.sort(ids)
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def member_of(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """For each value, True if it is in ``sorted_set`` (sorted): ``np.isin(values, sorted_set)``, by one sort.

    Looking ``values`` up in sorted order keeps the binary searches in cache:
    over a million random 64-bit ids about three times faster than searching
    them in their own order, or than ``np.isin`` (figures: docs/benchmarks.md).

    >>> member_of(np.array([5, 4, 3], dtype=np.uint64), np.array([3, 5], dtype=np.uint64))
    array([ True, False,  True])
    """
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), dtype=bool)
    if len(sorted_set) > 1 and not (sorted_set[1:] >= sorted_set[:-1]).all():
        # A binary search in an unsorted set misses members silently: loud instead (one pass, cheap beside the sort).
        raise ValueError("member_of needs sorted_set sorted (np.sort or distinct it first)")
    order = np.argsort(values)
    ordered = values[order]
    found = np.minimum(np.searchsorted(sorted_set, ordered), len(sorted_set) - 1)
    out = np.empty(len(values), dtype=bool)
    out[order] = sorted_set[found] == ordered
    return out


def fold_xor(roots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """XOR ``values`` per distinct root: ``(roots, folded)`` sorted by root, with zero results dropped.

    What one ack per root carrying the XOR of every ack would do to a ledger
    (XOR is associative and commutative); a zero fold changes no checksum.

    >>> fold_xor(np.array([5, 3, 5], dtype=np.uint64), np.array([1, 2, 1], dtype=np.uint64))
    (array([3], dtype=uint64), array([2], dtype=uint64))
    """
    if roots.size == 0:
        return roots.astype(U64), values.astype(U64)
    order = np.argsort(roots, kind="stable")
    sorted_roots = roots[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_roots[1:] != sorted_roots[:-1])))
    folded = np.bitwise_xor.reduceat(values[order], starts)
    unique = sorted_roots[starts]
    keep = folded != 0
    return unique[keep], folded[keep]


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer over a uint64 array (a bijection with full avalanche; wraps mod 2^64)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=U64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def pair_digest(roots: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A 64-bit digest of each ``(root, id)`` pair; XOR them per row for an order-independent MessageId digest."""
    return mix64(mix64(roots ^ _PAIR_DOMAIN) ^ ids)


def row_digests(rows: np.ndarray, roots: np.ndarray, ids: np.ndarray, row_count: int) -> np.ndarray:
    """Per row, the XOR of its pairs' digests (``rows[i]`` is the row of pair i); 0 for a row with no pair."""
    digests = np.zeros(row_count, dtype=U64)
    if rows.size:
        np.bitwise_xor.at(digests, rows, pair_digest(roots, ids))
    return digests


def derive_ids(salt: int, digests: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """Non-zero edge ids, deterministic in (``salt``, parent digest, ordinal): a Spark re-run reproduces them.

    ``salt`` is a bolt's uid, ``digests`` the parents' MessageId digests
    (:func:`row_digests`), ``ordinals`` each child's 0-based position among its
    parent's children.
    """
    keyed = np.uint64(edge_key(salt))
    with np.errstate(over="ignore"):
        ids = mix64(mix64(np.asarray(digests, dtype=U64) ^ keyed) + np.asarray(ordinals, dtype=U64))
    zero = ids == 0
    while zero.any():
        # 0 means "no id" on the wire: rehash the (2^-64-likely) zeros, still deterministically.
        ids[zero] = mix64(ids[zero] ^ keyed)
        zero = ids == 0
    return ids


# -- the same scheme one value at a time ----------------------------------------------
# Per-tuple code (BoltCollector with acker_spark's DeterministicEdgeIds, dedup keys)
# derives one id at a time; a numpy call per id costs microseconds, so these are
# twins of the array functions above on Python ints (wrapping with a 64-bit mask),
# bit-identical to them (tests/client/test_columns_scalar.py proves it), so a
# tuple gets the same ids whichever path processes it.


def mix64_int(x: int) -> int:
    """:func:`mix64` of one unsigned 64-bit Python int (the same value, without a numpy call)."""
    z = (x + _GOLDEN_INT) & _MASK
    z = ((z ^ (z >> 30)) * _M1_INT) & _MASK
    z = ((z ^ (z >> 27)) * _M2_INT) & _MASK
    return z ^ (z >> 31)


def message_digest(pairs: Any) -> int:
    """One MessageId's digest from its ``(root, id)`` pairs: :func:`row_digests` of a single row (0 for none)."""
    domain = int(_PAIR_DOMAIN)
    digest = 0
    for root, ident in pairs:
        digest ^= mix64_int(mix64_int(root ^ domain) ^ ident)
    return digest


def edge_key(salt: int) -> int:
    """The key :func:`derive_ids` and :func:`derive_id` mix every id of ``salt`` (a bolt's uid) with."""
    if not 0 < salt < 1 << 64:
        raise ValueError(f"salt must be a non-zero unsigned 64-bit integer, got {salt}")
    return mix64_int(salt ^ int(_EDGE_DOMAIN))


def parent_key(key: int, digest: int) -> int:
    """What :func:`derive_ids` mixes from one parent before adding the ordinal: ``key`` is :func:`edge_key` of the salt.

    Computed once per parent; each child then costs one :func:`mix64_int` in :func:`derive_id`.
    """
    return mix64_int(digest ^ key)


def derive_id(key: int, parent: int, ordinal: int) -> int:
    """:func:`derive_ids` for one child: ``parent`` is :func:`parent_key` of ``key`` and the parent's digest."""
    edge = mix64_int((parent + ordinal) & _MASK)
    while edge == 0:
        # As derive_ids: 0 means "no id" on the wire, rehash deterministically.
        edge = mix64_int(edge ^ key)
    return edge


def shard_slices(roots: np.ndarray, shard_count: int) -> list[tuple[int, np.ndarray]]:
    """``(shard, positions)`` for every shard that owns at least one of ``roots`` (``root % shard_count``)."""
    if shard_count == 1:
        return [(0, np.arange(roots.size))] if roots.size else []
    shards = roots % np.uint64(shard_count)
    order = np.argsort(shards, kind="stable")
    counts = np.bincount(shards.astype(np.int64), minlength=shard_count)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [(s, order[bounds[s] : bounds[s + 1]]) for s in range(shard_count) if counts[s]]


def replica_slices(roots: np.ndarray, shard_count: int, replicas: int = 1) -> list[tuple[int, np.ndarray]]:
    """``(shard, positions)`` for every shard that keeps some of ``roots``: each owner's, then each follower's.

    With ``replicas`` 2 the roots owned by shard ``s`` appear twice, for ``s``
    and for ``(s + 1) % shard_count``; a shard may thus get two entries (the
    roots it owns and those it follows).
    """
    slices = shard_slices(roots, shard_count)
    if replicas == 1:
        return slices
    return [((shard + k) % shard_count, positions) for k in range(replicas) for shard, positions in slices]
