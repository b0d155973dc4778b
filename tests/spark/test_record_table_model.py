"""The driver's record table and emission-log reader against a plain Python model (hypothesis).

Both are vectorised with sorts and ``searchsorted`` for speed; the model says
what they must do, one outcome or one file row at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from acker_protocol.wire import Outcome
from acker_spark.tracking.emission_log import Emissions, EmissionWriter, read_round
from acker_spark.tracking.record_table import ACKED, FAILED, PENDING, RecordTable
from hypothesis import given, settings
from hypothesis import strategies as st

U64 = np.uint64
ACK = int(Outcome.ACKED)
CODES = [ACK, int(Outcome.FAILED), int(Outcome.TIMED_OUT), int(Outcome.LOST)]

roots_st = st.lists(st.integers(1, 40), min_size=0, max_size=30, unique=True)
outcomes_st = st.lists(st.tuples(st.integers(1, 50), st.sampled_from(CODES)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(roots=roots_st, batches=st.lists(outcomes_st, max_size=4))
def test_settle_takes_the_first_outcome_of_each_pending_root_in_arrival_order(
    roots: list[int], batches: list[list[tuple[int, int]]]
) -> None:
    table = RecordTable()
    table.add(Emissions(np.array(roots, U64), np.array(roots, U64) * 10, np.ones(len(roots), np.uint16), 0), 0)
    model = {root: (PENDING, 0) for root in roots}
    for batch in batches:
        settled, unknown = table.settle(
            np.array([r for r, _ in batch], U64), np.array([o for _, o in batch], np.int8), ACK
        )
        ended: dict[int, int] = {}
        for root, code in batch:
            if root in model and model[root][0] == PENDING and root not in ended:
                ended[root] = code
        for root, code in ended.items():
            model[root] = (ACKED if code == ACK else FAILED, code)
        assert sorted(set(unknown.tolist())) == sorted({r for r, _ in batch if r not in model})
        assert sorted(table.roots[settled.acked].tolist()) == sorted(r for r, c in ended.items() if c == ACK)
        failed = dict(zip(table.roots[settled.failed].tolist(), settled.reasons.tolist(), strict=True))
        assert failed == {r: c for r, c in ended.items() if c != ACK}
        for root, (state, code) in model.items():
            (at,) = np.flatnonzero(table.roots == root)
            assert table.state[at] == state and (state == PENDING or table.reason[at] == code)


files_st = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.lists(st.integers(1, 30), max_size=12)), max_size=6
)


@settings(max_examples=100, deadline=None)
@given(files=files_st)
def test_read_round_keeps_each_root_once_and_counts_shared_identities(
    tmp_path_factory: object, files: list[tuple[int, int, list[int]]]
) -> None:
    folder = Path(tmp_path_factory.mktemp("round"))  # type: ignore[attr-defined]
    written: dict[tuple[int, int], list[int]] = {}
    for partition, attempt, rows in files:
        if (partition, attempt) in written or not rows:
            continue
        written[(partition, attempt)] = rows
        writer = EmissionWriter(folder, 0, partition, attempt)
        writer.write(np.array(rows, U64), np.array(rows, U64) + 1000, np.full(len(rows), attempt + 1, np.uint16))
        writer.close()
    # The model: files in (partition, attempt) order; a root seen again in the same file or in
    # another partition is a duplicate; in another attempt of the same partition, a re-run.
    first: dict[int, int] = {}
    duplicates = 0
    previous: tuple[int, int] | None = None  # (partition, attempt) of the root's last occurrence
    for root in sorted({r for rows in written.values() for r in rows}):
        previous = None
        for (partition, attempt), rows in sorted(written.items()):
            for row in rows:
                if row != root:
                    continue
                if previous is None:
                    first[root] = attempt + 1
                elif previous[0] != partition or previous == (partition, attempt):
                    duplicates += 1
                previous = (partition, attempt)
    emissions = read_round(folder, 0)
    assert dict(zip(emissions.roots.tolist(), emissions.attempts.tolist(), strict=True)) == first
    assert (emissions.idents == emissions.roots + 1000).all()
    assert emissions.duplicates == duplicates


one_code_st = st.tuples(st.lists(st.integers(1, 50), max_size=60), st.sampled_from(CODES))


@settings(max_examples=200, deadline=None)
@given(roots=roots_st, batches=st.lists(one_code_st, max_size=4))
def test_a_batch_of_one_outcome_code_settles_each_pending_root_once(
    roots: list[int], batches: list[tuple[list[int], int]]
) -> None:
    """The one-code fast path (roots sorted without a permutation) against the model, repeats included."""
    table = RecordTable()
    table.add(Emissions(np.array(roots, U64), np.array(roots, U64) * 10, np.ones(len(roots), np.uint16), 0), 0)
    pending = set(roots)
    for batch_roots, code in batches:
        settled, unknown = table.settle(np.array(batch_roots, U64), np.full(len(batch_roots), code, np.int8), ACK)
        ended = pending & set(batch_roots)
        pending -= ended
        assert sorted(unknown.tolist()) == sorted(set(batch_roots) - set(roots))
        positions = settled.acked if code == ACK else settled.failed
        assert sorted(table.roots[positions].tolist()) == sorted(ended)
        assert len(settled.acked) + len(settled.failed) == len(ended)
        assert (settled.reasons == code).all()
    for root in roots:
        (at,) = np.flatnonzero(table.roots == root)
        assert (table.state[at] == PENDING) == (root in pending)


rounds_st = st.lists(st.lists(st.integers(1, 60), max_size=20, unique=True), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(rounds=rounds_st, presorted=st.booleans())
def test_rounds_added_keep_one_entry_per_root_sorted_with_its_first_round(
    rounds: list[list[int]], presorted: bool
) -> None:
    """The first round taken as it is (sorted input) or merged (any order) gives the same table as the model."""
    table = RecordTable()
    first_round: dict[int, int] = {}
    for round_no, roots in enumerate(rounds):
        ordered = sorted(roots) if presorted else roots
        array = np.array(ordered, U64)
        added = table.add(Emissions(array, array * 10, np.full(len(ordered), round_no + 1, np.uint16), 0), round_no)
        new = [r for r in ordered if r not in first_round]
        assert added == len(new)
        first_round.update((r, round_no) for r in new)
    expected = sorted(first_round)
    assert table.roots.tolist() == expected
    assert table.idents.tolist() == [r * 10 for r in expected]
    assert table.rounds.tolist() == [first_round[r] for r in expected]
    assert table.attempts.tolist() == [first_round[r] + 1 for r in expected]
    assert (table.state == PENDING).all()
