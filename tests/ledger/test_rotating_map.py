"""Unit tests of RotatingMap: Storm's list-of-buckets timeout structure."""

from __future__ import annotations

import pytest

from acker_service.rotating_map import RotatingMap


class TestBasics:
    """put / get / remove / contains / len behave like a map spread over buckets."""

    def test_put_then_get_returns_value(self):
        """A value put is returned by get and reported by contains."""
        m = RotatingMap(buckets=3)
        m.put("a", 1)
        assert m.get("a") == 1
        assert "a" in m
        assert len(m) == 1

    def test_get_absent_returns_default(self):
        """get of an absent key returns None, or the default given."""
        m = RotatingMap(buckets=3)
        assert m.get("missing") is None
        assert m.get("missing", 42) == 42
        assert "missing" not in m

    def test_put_overwrites_without_growing(self):
        """Putting an existing key replaces its value and keeps one entry."""
        m = RotatingMap(buckets=3)
        m.put("a", 1)
        m.put("a", 2)
        assert m.get("a") == 2
        assert len(m) == 1

    def test_remove_returns_value_and_forgets_key(self):
        """remove hands back the value and the key is gone from every bucket."""
        m = RotatingMap(buckets=3)
        m.put("a", 1)
        m.rotate()  # now in an older bucket: remove must look there too
        assert m.remove("a") == 1
        assert "a" not in m
        assert m.get("a") is None
        assert len(m) == 0

    def test_remove_absent_returns_none(self):
        """remove of an absent key returns None and changes nothing."""
        m = RotatingMap(buckets=3)
        m.put("a", 1)
        assert m.remove("b") is None
        assert len(m) == 1

    def test_len_counts_all_buckets(self):
        """len counts entries in the nursery and in the older buckets."""
        m = RotatingMap(buckets=4)
        m.put(1, "x")
        m.rotate()
        m.put(2, "y")
        m.rotate()
        m.put(3, "z")
        assert len(m) == 3
        assert sorted(m) == [1, 2, 3]

    def test_get_finds_key_in_older_bucket(self):
        """A rotated (older) entry is still visible to get and contains until it expires."""
        m = RotatingMap(buckets=3)
        m.put("a", 1)
        m.rotate()
        m.rotate()
        assert m.get("a") == 1
        assert "a" in m

    def test_bucket_count_reported(self):
        """bucket_count is the b given at construction."""
        assert RotatingMap(buckets=5).bucket_count == 5
        assert RotatingMap().bucket_count == 3


class TestRotation:
    """rotate() expires entries after exactly b rotations, and put refreshes."""

    @pytest.mark.parametrize("buckets", [2, 3, 4, 7])
    def test_expires_after_exactly_b_rotations(self, buckets):
        """An entry survives b - 1 rotations and is returned by the b-th."""
        m = RotatingMap(buckets=buckets)
        m.put("k", "v")
        for i in range(buckets - 1):
            assert m.rotate() == {}, f"expired early at rotation {i + 1} of {buckets}"
            assert m.get("k") == "v"
        assert m.rotate() == {"k": "v"}
        assert "k" not in m
        assert len(m) == 0

    def test_rotate_returns_only_oldest_bucket(self):
        """Each rotation returns exactly the entries put b rotations ago."""
        m = RotatingMap(buckets=3)
        m.put(1, "a")
        m.rotate()
        m.put(2, "b")
        m.rotate()
        m.put(3, "c")
        assert m.rotate() == {1: "a"}
        assert m.rotate() == {2: "b"}
        assert m.rotate() == {3: "c"}
        assert m.rotate() == {}

    @pytest.mark.parametrize("buckets", [2, 3, 5])
    def test_put_moves_key_to_nursery(self, buckets):
        """Re-putting an old key moves it to the nursery: it gets b fresh rotations."""
        m = RotatingMap(buckets=buckets)
        m.put("k", 1)
        for _ in range(buckets - 1):
            m.rotate()
        m.put("k", 2)  # about to expire: the refresh must take it out of the oldest bucket
        assert len(m) == 1, "put left a stale copy in an older bucket"
        for i in range(buckets - 1):
            assert m.rotate() == {}, f"refreshed key expired early at rotation {i + 1}"
        assert m.rotate() == {"k": 2}
        assert len(m) == 0

    def test_stale_copy_does_not_expire_after_refresh(self):
        """After a refresh, the old bucket no longer holds the key (no double expiry)."""
        m = RotatingMap(buckets=3)
        m.put("k", 1)
        m.rotate()
        m.put("k", 2)
        expired = [m.rotate() for _ in range(4)]
        assert expired == [{}, {}, {"k": 2}, {}]

    def test_rotate_empty_map(self):
        """Rotating an empty map returns an empty dict and keeps the bucket count."""
        m = RotatingMap(buckets=3)
        assert m.rotate() == {}
        assert m.bucket_count == 3


class TestValidation:
    """The bucket count must allow a timeout window."""

    @pytest.mark.parametrize("buckets", [1, 0, -3])
    def test_fewer_than_two_buckets_rejected(self, buckets):
        """b < 2 is refused with a message naming the minimum and the value given."""
        with pytest.raises(ValueError, match=rf"at least 2 buckets, got {buckets}"):
            RotatingMap(buckets=buckets)

    def test_two_buckets_accepted(self):
        """b = 2, the smallest useful map, is accepted."""
        assert RotatingMap(buckets=2).bucket_count == 2
