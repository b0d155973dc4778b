"""Column-wise tracking arithmetic: id checks, XOR folding, deterministic ids and shard splitting."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from acker_client.columns import (
    as_ids,
    as_roots,
    derive_id,
    derive_ids,
    distinct,
    edge_key,
    fold_xor,
    message_digest,
    mix64,
    mix64_int,
    parent_key,
    row_digests,
    shard_slices,
)
from hypothesis import given
from hypothesis import strategies as st

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
root = st.integers(min_value=1, max_value=(1 << 64) - 1)


class TestChecks:
    def test_python_ints_beyond_int64_are_kept_exactly(self):
        """A list of Python ints up to 2^64-1 converts without loss."""
        assert as_ids([1, (1 << 64) - 1]).tolist() == [1, (1 << 64) - 1]

    @pytest.mark.parametrize("bad", [[-1], [1 << 64], [1.5], [[1, 2]]])
    def test_values_that_are_not_u64_are_refused(self, bad):
        """Negative, too large, fractional or 2-d input is a ValueError naming the problem."""
        with pytest.raises(ValueError, match="64-bit|1-d"):
            as_ids(bad)

    def test_a_zero_root_is_refused_with_its_position(self):
        """Root 0 means no tree: refused, and the message says where it is."""
        with pytest.raises(ValueError, match="position 2"):
            as_roots(np.array([4, 5, 0], dtype=np.uint64))


@given(st.lists(st.tuples(st.integers(1, 6), u64), max_size=60))
def test_fold_xor_equals_a_dict_fold(pairs):
    """Folding matches XOR per root in a dict, zeros dropped, sorted by root."""
    expected: dict[int, int] = defaultdict(int)
    for r, v in pairs:
        expected[r] ^= v
    roots = np.array([r for r, _ in pairs], dtype=np.uint64)
    values = np.array([v for _, v in pairs], dtype=np.uint64)
    got_roots, got_values = fold_xor(roots, values)
    assert list(zip(got_roots.tolist(), got_values.tolist())) == sorted((r, v) for r, v in expected.items() if v)


def test_mix64_is_a_bijection_on_a_sample():
    """Distinct inputs give distinct outputs (no collisions in 2^16 consecutive values)."""
    x = np.arange(1 << 16, dtype=np.uint64)
    assert np.unique(mix64(x)).size == x.size


@given(root, u64, root, u64)
def test_row_digest_is_independent_of_pair_order(r1, i1, r2, i2):
    """A row's digest does not depend on the order of its (root, id) pairs."""
    rows = np.array([0, 0], dtype=np.int64)
    a = row_digests(rows, np.array([r1, r2], np.uint64), np.array([i1, i2], np.uint64), 1)
    b = row_digests(rows, np.array([r2, r1], np.uint64), np.array([i2, i1], np.uint64), 1)
    assert a.tolist() == b.tolist()


def test_derived_ids_are_deterministic_nonzero_and_salted():
    """Same (salt, digest, ordinal) gives the same id; another salt or ordinal another id; never 0."""
    digests = np.arange(1000, dtype=np.uint64)
    ordinals = np.zeros(1000, dtype=np.uint64)
    first = derive_ids(7, digests, ordinals)
    assert (first == derive_ids(7, digests, ordinals)).all()
    assert first.all()
    assert np.unique(first).size == 1000
    assert not (first == derive_ids(8, digests, ordinals)).any()
    assert not (first == derive_ids(7, digests, ordinals + np.uint64(1))).any()
    with pytest.raises(ValueError, match="salt"):
        derive_ids(0, digests, ordinals)


def test_shard_slices_cover_every_root_once_on_its_shard():
    """Every position lands in exactly one slice, the one of its root's shard."""
    roots = np.array([3, 4, 5, 6, 7, 9, 12], dtype=np.uint64)
    slices = shard_slices(roots, 3)
    seen = np.concatenate([positions for _, positions in slices])
    assert sorted(seen.tolist()) == list(range(roots.size))
    for shard, positions in slices:
        assert (roots[positions] % 3 == shard).all()


@given(st.lists(root, max_size=60), st.integers(min_value=0, max_value=5))
def test_distinct_equals_numpy_unique(values, repeats):
    """distinct (by sorting) gives np.unique's answer: sorted, each value once, with repeats and empty input."""
    ids = np.array(values + values[:repeats], dtype=np.uint64)
    result = distinct(ids)
    assert result.dtype == np.uint64
    assert result.tolist() == np.unique(ids).tolist()


# -- the one-value twins: bit-identical to the array functions --------------------------

_MASK = (1 << 64) - 1


def unmix64(z: int) -> int:
    """The inverse of mix64 (it is a bijection): the input whose mix is ``z``."""
    z ^= (z >> 31) ^ (z >> 62)
    z = (z * pow(0x94D049BB133111EB, -1, 1 << 64)) & _MASK
    z ^= (z >> 27) ^ (z >> 54)
    z = (z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & _MASK
    z ^= (z >> 30) ^ (z >> 60)
    return (z - 0x9E3779B97F4A7C15) & _MASK


@given(st.lists(u64, min_size=1, max_size=50))
def test_mix64_int_equals_mix64(values):
    """The scalar mixer gives, bit for bit, what the array mixer gives."""
    assert [mix64_int(v) for v in values] == mix64(np.array(values, dtype=np.uint64)).tolist()
    assert [unmix64(mix64_int(v)) for v in values] == values  # the test's inverse is right


@given(st.lists(st.dictionaries(root, u64, max_size=4), max_size=12))
def test_message_digest_equals_row_digests(rows):
    """One MessageId's digest, one pair at a time, equals its row's digest from row_digests."""
    pair_rows = np.array([i for i, row in enumerate(rows) for _ in row], dtype=np.int64)
    roots = np.array([r for row in rows for r in row], dtype=np.uint64)
    ids = np.array([v for row in rows for v in row.values()], dtype=np.uint64)
    expected = row_digests(pair_rows, roots, ids, len(rows)).tolist()
    assert [message_digest(row.items()) for row in rows] == expected


@given(root, st.lists(st.tuples(u64, st.integers(0, (1 << 32) - 1)), min_size=1, max_size=40))
def test_derive_id_equals_derive_ids(salt, children):
    """Each child's id, derived alone, is the one derive_ids gives it in a batch."""
    digests = np.array([d for d, _ in children], dtype=np.uint64)
    ordinals = np.array([o for _, o in children], dtype=np.uint64)
    key = edge_key(salt)
    alone = [derive_id(key, parent_key(key, d), o) for d, o in children]
    assert alone == derive_ids(salt, digests, ordinals).tolist()


@given(root, u64)
def test_a_zero_id_is_rehashed_alike(salt, digest):
    """The child whose id mixes to 0 (constructed by inverting the mixer) gets the same non-zero id both ways."""
    key = edge_key(salt)
    ordinal = (unmix64(0) - parent_key(key, digest)) & _MASK  # mix64(parent + ordinal) == 0
    alone = derive_id(key, parent_key(key, digest), ordinal)
    batch = derive_ids(salt, np.array([digest], np.uint64), np.array([ordinal], np.uint64)).tolist()
    assert alone == batch[0] == mix64_int(key) != 0


def test_edge_key_refuses_a_bad_salt():
    """The scalar path refuses the salts derive_ids refuses."""
    for bad in (0, 1 << 64, -1):
        with pytest.raises(ValueError, match="salt"):
            edge_key(bad)


@given(root, root, u64, st.integers(0, 1000))
def test_derive_ids_is_the_documented_formula(salt, anchor_root, anchor_id, n):
    """docs/spark.md: child n gets mix64(mix64(digest ^ key) + n), key = mix64(salt ^ "acker/ed"),
    digest = mix64(mix64(root ^ "acker/pa") ^ id) for a one-pair anchor."""
    key = mix64_int(salt ^ int.from_bytes(b"acker/ed", "big"))
    digest = mix64_int(mix64_int(anchor_root ^ int.from_bytes(b"acker/pa", "big")) ^ anchor_id)
    expected = mix64_int((mix64_int(digest ^ key) + n) & _MASK) or mix64_int(key)
    digests = row_digests(
        np.zeros(1, np.int64), np.array([anchor_root], np.uint64), np.array([anchor_id], np.uint64), 1
    )
    assert derive_ids(salt, digests, np.array([n], np.uint64)).tolist() == [expected]


def test_member_of_matches_isin_and_refuses_an_unsorted_set() -> None:
    """``member_of`` is ``np.isin`` over a sorted set; an unsorted set (a binary search would miss members
    silently) is a ValueError."""
    from acker_client.columns import member_of

    rng = np.random.default_rng(3)
    values = rng.integers(1, 2**63, 5_000, dtype=np.uint64)
    members = np.sort(np.concatenate((values[::3], rng.integers(1, 2**63, 1_000, dtype=np.uint64))))
    assert (member_of(values, members) == np.isin(values, members)).all()
    with pytest.raises(ValueError, match="sorted"):
        member_of(values, members[::-1].copy())
