"""Unit tests of the ReferenceLedger against the acker-semantics spec, with an injected fake clock."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from acker_protocol.wire import OpKind, Outcome

from acker_service.batch import Batch
from acker_service.reference_ledger import BatchResult, ReferenceLedger

SPOUT = "spout-a"
R = 0x9E3779B97F4A7C15  # a root id with the high bit set: ids are full 64-bit values
E1, E2, E3 = 0xA5A5_0000_1111_0001, 0x0F0F_2222_3333_0002, 0xDEAD_BEEF_0000_0003


@dataclass(frozen=True)
class Op:
    """One ledger message as a test writes it."""

    kind: OpKind
    root: int
    value: int = 0
    key: int = 0
    spout: str = SPOUT

    def __repr__(self) -> str:  # short, so permutation failures read well
        return f"{self.kind.name.lower()}({self.value:#x})" if self.value else self.kind.name.lower()


def init(root: int, value: int, spout: str = SPOUT) -> Op:
    return Op(OpKind.INIT, root, value, spout=spout)


def ack(root: int, value: int, key: int = 0) -> Op:
    return Op(OpKind.ACK, root, value, key)


def fail(root: int) -> Op:
    return Op(OpKind.FAIL, root)


def reset(root: int) -> Op:
    return Op(OpKind.RESET_TIMEOUT, root)


def batch_of(ops: list[Op]) -> Batch:
    """Encode ops as one Batch, with a spout table and keys only when needed."""
    spouts = sorted({op.spout for op in ops})
    keyed = any(op.key for op in ops)
    return Batch.of(
        [int(op.kind) for op in ops],
        [op.root for op in ops],
        [op.value for op in ops],
        dedup_keys=[op.key for op in ops] if keyed else (),
        spouts=spouts,
        spout_index=[spouts.index(op.spout) for op in ops] if len(spouts) > 1 else (),
    )


def assert_conserved(ledger: ReferenceLedger) -> None:
    """Spec invariant 3: inits = acked + failed + timed out + pending."""
    s = ledger.stats
    assert s.inits == s.acked + s.failed + s.timed_out + ledger.pending_trees, s


def apply(ledger: ReferenceLedger, *ops: Op) -> BatchResult:
    """Apply ops as one batch, check the result accounts for every op and conservation holds."""
    result = ledger.apply_batch(batch_of(list(ops)))
    assert result.applied + result.deduplicated + result.ignored == len(ops), result
    assert_conserved(ledger)
    return result


def outcomes(result_or_list) -> list[tuple[int, Outcome]]:
    """(root, outcome) pairs of a BatchResult or a list of resolutions."""
    resolutions = getattr(result_or_list, "resolutions", result_or_list)
    return [(r.root, r.outcome) for r in resolutions]


@pytest.fixture
def ledger(ledger_cls, clock) -> ReferenceLedger:
    """A ledger with a long timeout (nothing expires unless a test moves the clock far)."""
    return ledger_cls(message_timeout=1000.0, buckets=3, clock=clock)


# --- the spec's table, transcribed, as the reference for the permutation tests ---


@dataclass
class SpecModel:
    """The spec's per-message table for one root, written from the spec text (not the code)."""

    val: int = 0
    exists: bool = False
    spout: str | None = None
    failed: bool = False
    ended: int = 0
    duplicate_inits: int = 0
    resets_applied: int = 0
    init_step: int | None = None

    @property
    def orphan_entry(self) -> bool:
        """An entry without a spout exists (an ack or fail whose init is not, or no longer, there)."""
        return self.exists and self.spout is None

    def step(self, i: int, op: Op) -> Outcome | None:
        """Apply one message; return the outcome it produces, if any."""
        if not self.exists:
            # Also after the tree ended: only pending trees are kept, so the root is unknown.
            if op.kind is OpKind.RESET_TIMEOUT:
                return None  # reset_timeout with no entry: ignore
            self.exists = True
        if op.kind is OpKind.INIT:
            if self.spout is not None:
                self.duplicate_inits += 1  # init is set-once
                return None
            self.val ^= op.value
            self.spout = op.spout
            self.init_step = i
        elif op.kind is OpKind.ACK:
            self.val ^= op.value
        elif op.kind is OpKind.FAIL:
            self.failed = True
        else:
            self.resets_applied += 1
        if self.spout is not None:
            outcome = Outcome.ACKED if self.val == 0 else Outcome.FAILED if self.failed else None
            if outcome is not None:
                # The entry is removed: nothing of the tree is remembered.
                self.val, self.exists, self.spout, self.failed = 0, False, None, False
                self.ended += 1
                return outcome
        return None


# Three one-root message sets. "acked": spout -> 2 targets, target 1 emits one child, all
# acked. "failed": spout -> 2 targets, target 1 acked, target 2 failed. "ack_and_fail": a
# client that both acks and fails its only tuple (checks the spec's order: val == 0 first).
SCENARIOS = {
    "acked": [init(R, E1 ^ E2), ack(R, E1 ^ E3), ack(R, E2), ack(R, E3), reset(R)],
    "failed": [init(R, E1 ^ E2), ack(R, E1), fail(R), reset(R)],
    "ack_and_fail": [init(R, E1), ack(R, E1), fail(R), reset(R)],
}
PERMUTATIONS = [
    pytest.param(name, perm, id=f"{name}:" + ",".join(map(repr, perm)))
    for name, msgs in SCENARIOS.items()
    for perm in itertools.permutations(msgs)
]


class TestEveryOrdering:
    """Every ordering of init / ack / fail / reset_timeout for one root, per the spec's table."""

    @pytest.mark.parametrize(("scenario", "order"), PERMUTATIONS)
    def test_one_message_per_batch(self, ledger_cls, clock, scenario, order):
        """Each message alone: the outcome comes at exactly the message the spec says, once."""
        ledger = ledger_cls(message_timeout=1000.0, clock=clock)
        model = SpecModel()
        seen = []
        for i, op in enumerate(order):
            clock.advance(1.0)
            expected = model.step(i, op)
            result = apply(ledger, op)
            got = outcomes(result)
            assert got == ([(R, expected)] if expected else []), f"after message {i} ({op!r}) of {order}"
            if expected:
                # Latency is measured from the init, not from the first message.
                assert result.resolutions[0].latency_seconds == pytest.approx(i - model.init_step)
                assert result.resolutions[0].spout == SPOUT
            seen += got
        assert len(seen) == model.ended == 1, "every tree in these scenarios must end exactly once"
        s = ledger.stats
        assert (s.duplicate_inits, s.resets) == (model.duplicate_inits, model.resets_applied)
        # An ack or fail after the end leaves an orphan entry; it expires with no outcome.
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, int(model.orphan_entry))
        clock.advance(ledger.message_timeout + ledger.rotation_period)
        assert ledger.advance() == []
        assert (ledger.orphan_entries, s.orphaned, s.acked + s.failed + s.timed_out) == (0, int(model.orphan_entry), 1)

    @pytest.mark.parametrize(("scenario", "order"), PERMUTATIONS)
    def test_whole_order_in_one_batch(self, ledger, scenario, order):
        """All messages in one batch: exactly one resolution, with the outcome the spec gives."""
        model = SpecModel()
        expected = [o for i, op in enumerate(order) if (o := model.step(i, op))]
        assert outcomes(apply(ledger, *order)) == [(R, o) for o in expected]

    @pytest.mark.parametrize("order", list(itertools.permutations(SCENARIOS["failed"])))
    def test_fail_anywhere_fails_once_when_init_known(self, ledger, order):
        """A fail anywhere ends the tree FAILED at max(init, fail) position, and only then."""
        at = max(order.index(SCENARIOS["failed"][0]), order.index(fail(R)))
        for i, op in enumerate(order):
            got = outcomes(apply(ledger, op))
            assert got == ([(R, Outcome.FAILED)] if i == at else []), f"message {i} of {order}"
        assert ledger.stats.failed == 1 and ledger.stats.acked == 0

    @pytest.mark.parametrize("order", list(itertools.permutations(SCENARIOS["acked"])))
    def test_acks_complete_exactly_at_last_message(self, ledger, order):
        """With every ack and the init, ACKED comes at the last of them, never before."""
        needed = [op for op in order if op.kind is not OpKind.RESET_TIMEOUT]
        at = max(order.index(op) for op in needed)
        for i, op in enumerate(order):
            got = outcomes(apply(ledger, op))
            assert got == ([(R, Outcome.ACKED)] if i == at else []), f"message {i} of {order}"

    def test_reset_before_init_is_ignored(self, ledger):
        """reset_timeout for an unknown root creates nothing (no entry, no orphan, not applied)."""
        result = apply(ledger, reset(R))
        assert (result.applied, result.ignored) == (0, 1)
        assert ledger.pending_trees == 0 and ledger.orphan_entries == 0
        assert ledger.stats.resets == 0
        assert outcomes(apply(ledger, init(R, E1), ack(R, E1))) == [(R, Outcome.ACKED)]


class TestInit:
    """init creates the tree, is set-once, and may be overtaken by acks."""

    def test_ack_overtaking_init(self, ledger):
        """An ack before its init makes an orphan entry; the init then completes the tree."""
        assert outcomes(apply(ledger, ack(R, E1))) == []
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, 1)
        assert outcomes(apply(ledger, init(R, E1))) == [(R, Outcome.ACKED)]
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)

    def test_duplicate_init_never_acks_early(self, ledger):
        """A repeated init would XOR the tree to 0; set-once ignores it and counts it."""
        result = apply(ledger, init(R, E1 ^ E2), init(R, E1 ^ E2))
        assert outcomes(result) == []
        assert (result.applied, result.ignored) == (1, 1)
        assert ledger.stats.duplicate_inits == 1 and ledger.stats.inits == 1
        assert ledger.pending_trees == 1
        assert outcomes(apply(ledger, ack(R, E1))) == []
        assert outcomes(apply(ledger, init(R, E1 ^ E2))) == []
        assert outcomes(apply(ledger, ack(R, E2))) == [(R, Outcome.ACKED)]
        assert ledger.stats.duplicate_inits == 2

    def test_duplicate_init_keeps_first_spout(self, ledger):
        """A second init naming another spout does not steal the tree's outcome."""
        apply(ledger, init(R, E1, spout="first"))
        apply(ledger, init(R, E1, spout="second"))
        (res,) = apply(ledger, ack(R, E1)).resolutions
        assert (res.spout, res.outcome) == ("first", Outcome.ACKED)

    def test_init_with_zero_value_acks_immediately(self, ledger, clock):
        """A spout emitting to no target sends init(r, 0): the tree is complete at once."""
        (res,) = apply(ledger, init(R, 0)).resolutions
        assert (res.root, res.outcome, res.latency_seconds) == (R, Outcome.ACKED, 0.0)
        assert ledger.pending_trees == 0 and ledger.stats.acked == 1

    def test_latency_measured_from_init(self, ledger, clock):
        """Latency counts from the init, even when an ack arrived before it."""
        apply(ledger, ack(R, E1))
        clock.advance(5.0)
        apply(ledger, init(R, E1 ^ E2))
        clock.advance(2.5)
        (res,) = apply(ledger, ack(R, E2)).resolutions
        assert res.latency_seconds == pytest.approx(2.5)

    def test_outcome_goes_to_the_inits_spout(self, ledger):
        """In a batch naming several spouts, each tree's outcome names its own init's spout."""
        r2 = R + 1
        result = apply(ledger, init(R, E1, spout="s1"), init(r2, E2, spout="s2"), ack(r2, E2), ack(R, E1))
        assert sorted((r.root, r.spout) for r in result.resolutions) == [(R, "s1"), (r2, "s2")]

    def test_counters_by_kind(self, ledger):
        """stats counts inits, acks, fails and applied resets."""
        r2 = R + 1
        apply(ledger, init(R, E1 ^ E2), reset(R), ack(R, E1), init(r2, E3), fail(r2), ack(R, E2))
        s = ledger.stats
        assert (s.inits, s.acks, s.fails, s.resets, s.acked, s.failed) == (2, 2, 1, 1, 1, 1)


class TestMessagesAfterEnd:
    """An ended tree is forgotten: later messages are handled as for any unknown root."""

    def _finish(self, ledger, clock, how: str) -> None:
        if how == "acked":
            assert outcomes(apply(ledger, init(R, E1), ack(R, E1, key=7))) == [(R, Outcome.ACKED)]
        elif how == "failed":
            assert outcomes(apply(ledger, init(R, E1), fail(R))) == [(R, Outcome.FAILED)]
        else:
            apply(ledger, init(R, E1))
            clock.advance(ledger.message_timeout + ledger.rotation_period)
            assert outcomes(ledger.advance()) == [(R, Outcome.TIMED_OUT)]
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)

    # (late messages, applied, ignored): a reset before the first late ack/fail finds no entry.
    LATE = {
        "ack": ([ack(R, E1)], 1, 0),
        "fail": ([fail(R)], 1, 0),
        "mixed": ([reset(R), ack(R, E2), fail(R), reset(R), ack(R, E1)], 4, 1),
    }

    @pytest.mark.parametrize("late", list(LATE))
    @pytest.mark.parametrize("how", ["acked", "failed", "timed_out"])
    def test_late_acks_and_fails_become_orphans(self, ledger, clock, how, late):
        """Acks / fails after the outcome: no outcome, one orphan entry that expires in [t+T, t+T+T/(b-1)], counted."""
        self._finish(ledger, clock, how)
        before = ledger.stats.inits, ledger.stats.acked + ledger.stats.failed + ledger.stats.timed_out
        ops, applied, ignored = self.LATE[late]
        t = clock.now
        result = apply(ledger, *ops)
        assert outcomes(result) == []
        assert (result.applied, result.ignored) == (applied, ignored)
        assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.orphaned) == (0, 1, 0)
        clock.set(t + ledger.message_timeout - 2.0**-20)
        assert ledger.advance() == [] and ledger.orphan_entries == 1
        clock.set(t + ledger.message_timeout + ledger.rotation_period)
        assert ledger.advance() == [], "a late ack or fail produced an outcome"
        assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.orphaned) == (0, 0, 1)
        s = ledger.stats
        assert (s.inits, s.acked + s.failed + s.timed_out) == before
        assert_conserved(ledger)

    @pytest.mark.parametrize("how", ["acked", "failed", "timed_out"])
    def test_late_reset_is_ignored(self, ledger, clock, how):
        """reset_timeout after the outcome finds no entry: ignored, creates nothing."""
        self._finish(ledger, clock, how)
        result = apply(ledger, reset(R))
        assert (result.applied, result.ignored, outcomes(result)) == (0, 1, [])
        assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.resets) == (0, 0, 0)

    @pytest.mark.parametrize("how", ["acked", "failed", "timed_out"])
    def test_resent_init_after_end_starts_a_new_tree(self, ledger, clock, how):
        """A re-sent init after the end (never sent by our client) is a new tree and gets a second outcome, TIMED_OUT."""
        self._finish(ledger, clock, how)
        result = apply(ledger, init(R, E2))
        assert (result.applied, result.ignored, outcomes(result)) == (1, 0, [])
        assert (ledger.stats.inits, ledger.stats.duplicate_inits) == (2, 0)
        assert (ledger.pending_trees, ledger.orphan_entries) == (1, 0)
        clock.advance(ledger.message_timeout + ledger.rotation_period)
        assert outcomes(ledger.advance()) == [(R, Outcome.TIMED_OUT)]
        s = ledger.stats
        assert (s.acked + s.failed + s.timed_out, ledger.pending_trees) == (2, 0)
        assert_conserved(ledger)

    def test_late_ack_then_resent_init_acks_again(self, ledger, clock):
        """A late ack followed by a re-sent init that cancels it is a new tree that is ACKED again."""
        self._finish(ledger, clock, "acked")
        assert outcomes(apply(ledger, ack(R, E1))) == []
        assert outcomes(apply(ledger, init(R, E1))) == [(R, Outcome.ACKED)]
        assert (ledger.stats.inits, ledger.stats.acked, ledger.pending_trees, ledger.orphan_entries) == (2, 2, 0, 0)

    def test_dedup_keys_forgotten_with_the_tree(self, ledger, clock):
        """A keyed ack repeated after the end is applied once more (to an orphan), then deduplicated there."""
        self._finish(ledger, clock, "acked")  # acked with ack(R, E1, key=7)
        first = apply(ledger, ack(R, E1, key=7))
        again = apply(ledger, ack(R, E1, key=7))
        assert (first.applied, first.deduplicated, again.applied, again.deduplicated) == (1, 0, 0, 1)
        assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.deduplicated) == (0, 1, 1)
        assert outcomes(first) == outcomes(again) == []


class TestDedupKeys:
    """Keyed acks: a repeat on the same pending tree is ignored and counted."""

    def test_repeated_keyed_ack_is_ignored_and_counted(self, ledger):
        """The same (root, key) ack twice: the second is dropped, so the tree still acks."""
        apply(ledger, init(R, E1 ^ E2))
        first = apply(ledger, ack(R, E1, key=77))
        repeat = apply(ledger, ack(R, E1, key=77))
        assert (first.applied, repeat.applied, repeat.deduplicated) == (1, 0, 1)
        assert ledger.stats.deduplicated == 1 and ledger.stats.acks == 1
        assert outcomes(apply(ledger, ack(R, E2, key=78))) == [(R, Outcome.ACKED)]

    def test_repeat_within_one_batch_is_ignored(self, ledger):
        """A repeated keyed ack inside the same batch is deduplicated too."""
        result = apply(ledger, init(R, E1 ^ E2), ack(R, E1, key=5), ack(R, E1, key=5), ack(R, E2, key=6))
        assert outcomes(result) == [(R, Outcome.ACKED)]
        assert (result.applied, result.deduplicated) == (3, 1)

    def test_different_keys_apply(self, ledger):
        """Acks with different keys on one tree are all applied (XORed)."""
        result = apply(ledger, init(R, E1 ^ E2 ^ E3), ack(R, E1, key=1), ack(R, E2, key=2))
        assert (result.applied, result.deduplicated, outcomes(result)) == (3, 0, [])
        assert outcomes(apply(ledger, ack(R, E3, key=3))) == [(R, Outcome.ACKED)]

    def test_every_earlier_key_is_remembered_once_a_tree_has_several(self, ledger):
        """The first key is kept alone, then with the next ones: repeats of any of them are dropped."""
        apply(ledger, init(R, E1 ^ E2 ^ E3), ack(R, E1, key=1))
        apply(ledger, ack(R, E2, key=2))
        repeats = apply(ledger, ack(R, E1, key=1), ack(R, E2, key=2))
        assert repeats.deduplicated == 2 and ledger.pending_trees == 1
        assert outcomes(apply(ledger, ack(R, E3, key=3))) == [(R, Outcome.ACKED)]

    def test_keys_do_not_leak_across_roots(self, ledger):
        """The same key on two different trees applies to each."""
        r2 = R + 2
        result = apply(ledger, init(R, E1), init(r2, E2), ack(R, E1, key=9), ack(r2, E2, key=9))
        assert result.deduplicated == 0
        assert sorted(outcomes(result)) == sorted([(R, Outcome.ACKED), (r2, Outcome.ACKED)])

    def test_unkeyed_repeat_is_applied(self, ledger):
        """Key 0 means no key: an unkeyed repeated ack XORs again (plain Storm behaviour)."""
        result = apply(ledger, init(R, E1 ^ E2), ack(R, E1), ack(R, E1))
        assert (result.applied, result.deduplicated) == (3, 0)
        assert outcomes(apply(ledger, ack(R, E2))) == [], "the repeat cancelled E1, so E2 alone must not ack"

    def test_keys_remembered_before_init(self, ledger):
        """A keyed ack that overtook its init still deduplicates its repeat."""
        apply(ledger, ack(R, E1, key=4), ack(R, E1, key=4))
        assert ledger.stats.deduplicated == 1
        assert outcomes(apply(ledger, init(R, E1))) == [(R, Outcome.ACKED)]


# Timeout tests use dyadic numbers so every boundary is exact in floating point.
TIMEOUT_CASES = [(T, b) for T in (3.0, 12.0, 30.0) for b in (2, 3, 4, 5)]


def expiry_offsets(period: float) -> list[float]:
    """Put times relative to the ledger's creation: inside, at and past rotation boundaries."""
    tiny = 2.0**-20
    return [0.0, tiny, period / 4, period / 2, period - tiny, period, 2.5 * period]


class TestTimeouts:
    """An entry put at t expires in [t + T, t + T + T/(b-1)]; TIMED_OUT if the spout is known."""

    @pytest.mark.parametrize(("T", "b"), TIMEOUT_CASES)
    def test_expiry_window_checked_at_bounds(self, ledger_cls, clock, T, b):
        """Not expired just before t + T; expired (TIMED_OUT, once) by t + T + T/(b-1)."""
        for offset in expiry_offsets(T / (b - 1)):
            c = type(clock)(start=clock.now)
            ledger = ledger_cls(message_timeout=T, buckets=b, clock=c)
            c.advance(offset)
            t = c.now
            apply(ledger, init(R, E1))
            c.set(t + T - 2.0**-20)
            assert ledger.advance() == [], f"expired before t + T (T={T}, b={b}, put at +{offset})"
            assert ledger.pending_trees == 1
            c.set(t + T + T / (b - 1))
            assert outcomes(ledger.advance()) == [(R, Outcome.TIMED_OUT)], f"T={T}, b={b}, put at +{offset}"
            assert_conserved(ledger)
            assert (ledger.pending_trees, ledger.stats.timed_out) == (0, 1)
            assert ledger.advance() == []

    @pytest.mark.parametrize(("T", "b"), TIMEOUT_CASES)
    def test_expiry_time_inside_window_with_small_steps(self, ledger_cls, clock, T, b):
        """Driving advance() in small steps, the entry expires at a time inside the window."""
        period = T / (b - 1)
        for offset in expiry_offsets(period):
            c = type(clock)(start=clock.now)
            ledger = ledger_cls(message_timeout=T, buckets=b, clock=c)
            c.advance(offset)
            t = c.now
            apply(ledger, init(R, E1))
            expired_at = None
            while expired_at is None and c.now < t + 2 * T + 2 * period:
                c.advance(period / 16)
                if ledger.advance():
                    expired_at = c.now
            assert expired_at is not None, f"never expired (T={T}, b={b})"
            assert t + T <= expired_at <= t + T + period, (T, b, offset, expired_at - t)

    def test_tree_completed_from_older_bucket_does_not_time_out(self, ledger_cls, clock):
        """A tree that ends after a rotation moved it to an older bucket leaves the map for good."""
        ledger = ledger_cls(message_timeout=4.0, buckets=3, clock=clock)
        apply(ledger, init(R, E1 ^ E2), ack(R, E1))
        clock.advance(3.0)  # past one rotation (every 2 s): the entry is no longer in the nursery
        assert ledger.advance() == [] and ledger.pending_trees == 1
        assert outcomes(apply(ledger, ack(R, E2))) == [(R, Outcome.ACKED)]
        clock.advance(10.0)
        assert ledger.advance() == []
        assert (ledger.stats.timed_out, ledger.pending_trees, ledger.orphan_entries) == (0, 0, 0)

    def test_timed_out_latency_from_init(self, ledger_cls, clock):
        """A timed-out tree reports the time from its init to the expiry."""
        ledger = ledger_cls(message_timeout=2.0, buckets=3, clock=clock)
        apply(ledger, init(R, E1))
        clock.advance(3.0)
        (res,) = ledger.advance()
        assert (res.outcome, res.spout, res.latency_seconds) == (Outcome.TIMED_OUT, SPOUT, 3.0)

    def test_apply_batch_reports_trees_that_expired_first(self, ledger_cls, clock):
        """apply_batch rotates first and returns the TIMED_OUT trees alongside its own."""
        ledger = ledger_cls(message_timeout=2.0, buckets=3, clock=clock)
        apply(ledger, init(R, E1))
        clock.advance(3.0)
        result = apply(ledger, init(R + 1, 0))
        assert sorted(outcomes(result)) == sorted([(R, Outcome.TIMED_OUT), (R + 1, Outcome.ACKED)])

    @pytest.mark.parametrize("b", [2, 3, 5])
    def test_reset_timeout_gives_fresh_timeout(self, ledger_cls, clock, b):
        """After reset_timeout at t', the tree lives until at least t' + T and ends by t' + T + T/(b-1)."""
        T = 12.0
        period = T / (b - 1)
        ledger = ledger_cls(message_timeout=T, buckets=b, clock=clock)
        apply(ledger, init(R, E1))
        clock.advance(T - 2.0**-10)  # just before the earliest possible expiry
        assert ledger.advance() == []
        t_reset = clock.now
        assert apply(ledger, reset(R)).applied == 1
        clock.set(t_reset + T - 2.0**-20)
        assert ledger.advance() == [], "reset_timeout did not give a fresh timeout"
        clock.set(t_reset + T + period)
        assert outcomes(ledger.advance()) == [(R, Outcome.TIMED_OUT)]

    def test_reset_keeps_orphan_alive_until_its_init(self, ledger_cls, clock):
        """reset_timeout also refreshes an entry whose init has not arrived yet."""
        T = 4.0
        ledger = ledger_cls(message_timeout=T, buckets=3, clock=clock)
        apply(ledger, ack(R, E1))
        clock.advance(T - 0.25)
        apply(ledger, reset(R))
        clock.advance(T - 0.25)
        assert ledger.orphan_entries == 1
        assert outcomes(apply(ledger, init(R, E1))) == [(R, Outcome.ACKED)]

    @pytest.mark.parametrize("first", [ack(R, E1), fail(R)], ids=["ack", "fail"])
    def test_orphan_dropped_and_counted(self, ledger_cls, clock, first):
        """An ack or fail whose init never comes expires with no outcome, counted as orphaned."""
        T = 6.0
        ledger = ledger_cls(message_timeout=T, buckets=3, clock=clock)
        t = clock.now
        apply(ledger, first)
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, 1)
        clock.set(t + T - 2.0**-20)
        assert ledger.advance() == [] and ledger.orphan_entries == 1
        clock.set(t + T + T / 2)
        assert ledger.advance() == []
        assert (ledger.orphan_entries, ledger.stats.orphaned, ledger.stats.timed_out) == (0, 1, 0)
        assert ledger.stats.inits == 0

    def test_clock_jump_expires_everything_once(self, ledger_cls, clock):
        """A long pause (many rotations due) times every tree out exactly once."""
        ledger = ledger_cls(message_timeout=3.0, buckets=4, clock=clock)
        roots = list(range(1, 51))
        apply(ledger, *(init(r, E1) for r in roots), ack(999, E2))
        clock.advance(100 * 3.0)
        assert sorted(outcomes(ledger.advance())) == [(r, Outcome.TIMED_OUT) for r in roots]
        assert (ledger.pending_trees, ledger.orphan_entries, ledger.stats.orphaned) == (0, 0, 1)
        clock.advance(100 * 3.0)
        assert ledger.advance() == []

    def test_no_traffic_drains_within_one_window(self, ledger_cls, clock):
        """Bounded memory: with no traffic, pending trees and orphans reach 0 within T + T/(b-1)."""
        T, b = 8.0, 5
        ledger = ledger_cls(message_timeout=T, buckets=b, clock=clock)
        for i in range(40):  # spread puts over a window, then go quiet
            apply(ledger, init(1000 + i, E1), ack(5000 + i, E2))
            clock.advance(T / 40)
        last_put = clock.now - T / 40
        clock.set(last_put + T + T / (b - 1))
        ledger.advance()
        assert (ledger.pending_trees, ledger.orphan_entries) == (0, 0)
        assert (ledger.stats.timed_out, ledger.stats.orphaned) == (40, 40)


class TestConstruction:
    """ReferenceLedger arguments are checked and the rotation period follows T / (b - 1)."""

    @pytest.mark.parametrize(("T", "b"), [(30.0, 3), (12.0, 4), (1.0, 2)])
    def test_rotation_period(self, ledger_cls, clock, T, b):
        """The rotation period is T / (b - 1)."""
        ledger = ledger_cls(message_timeout=T, buckets=b, clock=clock)
        assert (ledger.rotation_period, ledger.buckets) == (T / (b - 1), b)

    @pytest.mark.parametrize("T", [0.0, -1.0])
    def test_non_positive_timeout_rejected(self, ledger_cls, clock, T):
        """A zero or negative message timeout is refused with a message naming it."""
        with pytest.raises(ValueError, match="message_timeout must be positive"):
            ledger_cls(message_timeout=T, clock=clock)

    def test_one_bucket_rejected(self, ledger_cls, clock):
        """b = 1 leaves no timeout window and is refused."""
        with pytest.raises(ValueError, match="at least 2 buckets"):
            ledger_cls(message_timeout=1.0, buckets=1, clock=clock)
