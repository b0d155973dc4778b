"""Tests of validate_batch: each refusal names the problem, a valid batch passes whole."""

from __future__ import annotations

import re

import numpy as np
import pytest
from acker_protocol.wire import MAX_SPOUT_NAME_BYTES, OpKind, Outcome

from acker_service.batch import (
    Batch,
    BatchError,
    BatchTooLarge,
    InvalidBatch,
    WrongShard,
    validate_batch,
)

INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


def check(
    batch: Batch, *, shard_index: int = 0, shard_count: int = 1, max_batch: int = 1000, replicas: int = 1
) -> None:
    validate_batch(batch, shard_index=shard_index, shard_count=shard_count, max_batch=max_batch, replicas=replicas)


def refused(batch: Batch, error: type[BatchError], *fragments: str, **kwargs) -> str:
    """Assert the batch is refused with ``error`` and a message holding every fragment."""
    with pytest.raises(error) as info:
        check(batch, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"
    return message


class TestValidBatches:
    """Well-formed batches pass validation and apply."""

    def test_valid_batch_of_every_kind_passes(self, ledger_cls):
        """A batch using all four kinds, keys and one spout is accepted and applies whole."""
        batch = Batch.of(
            [INIT, RESET, ACK, INIT, FAIL],
            [10, 10, 10, 11, 11],
            [5, 0, 5, 7, 0],
            dedup_keys=[0, 0, 3, 0, 0],
            spouts=["s"],
        )
        assert check(batch) is None
        result = ledger_cls(message_timeout=30.0, clock=lambda: 0.0).apply_batch(batch)
        assert (result.applied, result.deduplicated, result.ignored) == (5, 0, 0)
        assert sorted((r.root, r.outcome) for r in result.resolutions) == [
            (10, Outcome.ACKED),
            (11, Outcome.FAILED),
        ]

    def test_empty_batch_passes(self):
        """An empty batch is valid (and applies nothing)."""
        assert check(Batch.of([], [], [])) is None

    def test_batch_without_init_needs_no_spout(self):
        """Acks, fails and resets alone need no spout name."""
        assert check(Batch.of([ACK, FAIL, RESET], [1, 2, 3], [9, 0, 0])) is None

    def test_full_64_bit_ids_pass(self):
        """Root ids and values use all 64 bits."""
        top = 2**64 - 1
        assert check(Batch.of([INIT, ACK], [top, top], [top, top], spouts=["s"])) is None

    def test_exactly_max_batch_passes(self):
        """A batch of exactly max_batch operations is accepted."""
        assert check(Batch.of([ACK] * 8, range(1, 9), [1] * 8), max_batch=8) is None

    def test_own_shard_roots_pass(self):
        """Roots with root % n == i pass on shard i of n."""
        roots = [3 * k + 2 for k in range(1, 20)]
        batch = Batch.of([ACK] * len(roots), roots, [1] * len(roots))
        assert check(batch, shard_index=2, shard_count=3) is None


class TestMixedSpouts:
    """spout_index routes each INIT to its spout; it is ignored for other kinds."""

    def test_mixed_spout_batch_routes_outcomes(self, ledger_cls):
        """Trees started by different spouts in one batch report to their own spout."""
        batch = Batch.of(
            [INIT, INIT, INIT, ACK, ACK, ACK],
            [1, 2, 3, 1, 2, 3],
            [4, 5, 6, 4, 5, 6],
            spouts=["alpha", "beta", "gamma"],
            spout_index=[2, 0, 1, 0, 0, 0],
        )
        check(batch)
        result = ledger_cls(message_timeout=30.0, clock=lambda: 0.0).apply_batch(batch)
        routed = sorted((r.root, r.spout) for r in result.resolutions)
        assert routed == [(1, "gamma"), (2, "alpha"), (3, "beta")]

    def test_spout_index_ignored_for_non_init(self):
        """An out-of-range spout index on an ACK is not an error: only INITs use it."""
        batch = Batch.of([INIT, ACK], [1, 1], [4, 4], spouts=["a", "b"], spout_index=[1, 99])
        assert check(batch) is None

    def test_several_spouts_without_index_refused(self):
        """Naming several spouts without spout_index is ambiguous and refused."""
        batch = Batch.of([INIT], [1], [4], spouts=["a", "b"])
        refused(batch, InvalidBatch, "2 spouts", "spout_index")

    def test_spout_index_length_mismatch_refused(self):
        """spout_index must be empty or one per operation."""
        batch = Batch.of([INIT, ACK, ACK], [1, 1, 1], [4, 2, 6], spouts=["a", "b"], spout_index=[0, 1])
        refused(batch, InvalidBatch, "spout_index has 2 entries", "(3)")

    def test_init_spout_index_out_of_range_refused(self):
        """An INIT pointing past the spout table is refused, naming the operation and the index."""
        batch = Batch.of([ACK, INIT], [1, 1], [4, 4], spouts=["a", "b"], spout_index=[0, 2])
        refused(batch, InvalidBatch, "operation 1", "spout index 2", "only 2 spouts")

    def test_negative_spout_index_refused(self):
        """A negative index (possible from Python callers, not the wire) must not pick the last spout."""
        batch = Batch.of([INIT], [1], [4], spouts=["a", "b"], spout_index=[-1])
        refused(batch, InvalidBatch, "operation 0", "spout index -1")


class TestRefusals:
    """Each malformed batch raises the right error type with an actionable message."""

    def test_too_many_operations(self):
        """More operations than max_batch: BatchTooLarge naming both numbers and the fix."""
        batch = Batch.of([ACK] * 9, range(1, 10), [1] * 9)
        msg = refused(batch, BatchTooLarge, "9 operations", "maximum of 8", "split", max_batch=8)
        assert "at most 8" in msg

    @pytest.mark.parametrize(("roots", "values", "name", "length"), [([1, 2], [1, 2, 3], "root_ids", 2)])
    def test_roots_length_mismatch(self, roots, values, name, length):
        """root_ids shorter than kinds: refused naming the array and both lengths."""
        batch = Batch.of([ACK, ACK, ACK], roots, values)
        refused(batch, InvalidBatch, "kinds has 3 entries", f"{name} has {length}", "parallel")

    def test_values_length_mismatch(self):
        """values of another length than kinds: refused naming values."""
        batch = Batch.of([ACK, ACK], [1, 2], [1, 2, 3])
        refused(batch, InvalidBatch, "kinds has 2 entries", "values has 3")

    def test_dedup_keys_length_mismatch(self):
        """dedup_keys must be empty or one per operation."""
        batch = Batch.of([ACK, ACK], [1, 2], [1, 2], dedup_keys=[7])
        refused(batch, InvalidBatch, "dedup_keys has 1 entries", "(2)")

    @pytest.mark.parametrize("kind", [0, 5, -1, 99])
    def test_unknown_kind(self, kind):
        """An unknown kind (including UNSPECIFIED = 0) is refused with its index and the known kinds."""
        batch = Batch.of([ACK, ACK, kind], [1, 2, 3], [1, 1, 0])
        refused(batch, InvalidBatch, "operation 2", f"unknown kind {kind}", "INIT (1)", "RESET_TIMEOUT (4)")

    def test_zero_root(self):
        """Root id 0 is refused, naming the operation index."""
        batch = Batch.of([ACK, ACK, ACK, ACK], [5, 6, 0, 7], [1, 1, 1, 1])
        refused(batch, InvalidBatch, "operation 2", "root id 0", "non-zero")

    @pytest.mark.parametrize("kind", [FAIL, RESET])
    def test_value_on_valueless_kind(self, kind):
        """FAIL and RESET_TIMEOUT must carry value 0; the message names the op and the fix."""
        batch = Batch.of([ACK, kind], [1, 1], [3, 8])
        refused(batch, InvalidBatch, "operation 1", OpKind(kind).name, "send 0")

    def test_init_without_spout(self):
        """An INIT in a request naming no spout is refused with its index."""
        batch = Batch.of([ACK, INIT], [1, 1], [3, 3])
        refused(batch, InvalidBatch, "operation 1 is INIT", "no spout")

    def test_empty_spout_name(self):
        """An empty spout name is refused, stating the allowed length."""
        batch = Batch.of([INIT], [1], [3], spouts=[""])
        refused(batch, InvalidBatch, "0 bytes", f"1 to {MAX_SPOUT_NAME_BYTES} bytes")

    def test_too_long_spout_name_counts_utf8_bytes(self):
        """A spout name over the byte limit is refused; the limit counts UTF-8 bytes, not characters."""
        name = "é" * (MAX_SPOUT_NAME_BYTES // 2 + 1)  # fewer characters than the limit, more bytes
        batch = Batch.of([INIT], [1], [3], spouts=[name])
        refused(batch, InvalidBatch, f"{len(name.encode())} bytes", f"1 to {MAX_SPOUT_NAME_BYTES} bytes")
        assert check(Batch.of([INIT], [1], [3], spouts=["x" * MAX_SPOUT_NAME_BYTES])) is None

    def test_wrong_shard_names_expected_shard(self):
        """A foreign root: WrongShard naming the root, the shard that owns it and this shard."""
        roots = [4, 7, 10, 12]  # shard 1 of 3 owns 4, 7, 10; 12 belongs to shard 0
        batch = Batch.of([ACK] * 4, roots, [1] * 4)
        fragments = ("root 12", "shard 0 of 3", "this acker is shard 1")
        msg = refused(batch, WrongShard, *fragments, shard_index=1, shard_count=3)
        assert "address order" in msg

    def test_wrong_shard_for_high_root(self):
        """Shard arithmetic uses the unsigned 64-bit root (no sign or float rounding)."""
        root = 2**64 - 1  # % 5 == 0
        batch = Batch.of([ACK], [root], [1])
        refused(batch, WrongShard, f"root {root}", "shard 0 of 5", shard_index=3, shard_count=5)
        assert check(batch, shard_index=0, shard_count=5) is None

    def test_replicas_two_accepts_owned_and_followed_roots(self):
        """With replicas 2, shard 1 of 3 keeps its own roots (= 1 mod 3) and shard 0's (= 0 mod 3)."""
        assert check(Batch.of([ACK] * 4, [4, 7, 3, 6], [1] * 4), shard_index=1, shard_count=3, replicas=2) is None
        # Shard 0 follows shard 2 (the last wraps around to the first).
        assert check(Batch.of([ACK] * 2, [3, 5], [1] * 2), shard_index=0, shard_count=3, replicas=2) is None

    def test_replicas_two_refuses_roots_neither_owned_nor_followed(self):
        """Root 5 lives on shards 2 and 0 of 3: shard 1 refuses it, naming both."""
        batch = Batch.of([ACK] * 2, [4, 5], [1] * 2)
        refused(
            batch, WrongShard, "root 5", "shard 2 and shard 0 of 3", "this acker is shard 1",
            shard_index=1, shard_count=3, replicas=2,
        )  # fmt: skip

    def test_single_shard_accepts_any_root(self):
        """With one shard every non-zero root is owned."""
        assert check(Batch.of([ACK] * 3, [1, 2, 2**63], [1] * 3), shard_index=0, shard_count=1) is None

    def test_first_problem_is_reported(self):
        """With several bad operations, the message names the first one."""
        batch = Batch.of([ACK, ACK, ACK], [1, 0, 0], [1, 1, 1])
        msg = refused(batch, InvalidBatch, "operation 1")
        assert not re.search(r"operation 2\b", msg)

    def test_errors_are_value_errors(self):
        """All refusals share BatchError (a ValueError), so callers can catch one type."""
        for error in (InvalidBatch, BatchTooLarge, WrongShard):
            assert issubclass(error, BatchError) and issubclass(error, ValueError)

    def test_validation_does_not_touch_the_batch(self):
        """validate_batch reads the batch only: refused arrays are unchanged."""
        batch = Batch.of([ACK, ACK], [1, 0], [1, 1])
        before = [a.copy() for a in (batch.kinds, batch.roots, batch.values)]
        with pytest.raises(InvalidBatch):
            check(batch)
        for old, new in zip(before, (batch.kinds, batch.roots, batch.values)):
            np.testing.assert_array_equal(old, new)
