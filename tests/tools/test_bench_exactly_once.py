"""acker-bench --mode exactly-once without Spark: the output check finds each kind of error, the fault plan is sound."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from acker_bench.exactly_once import ExactlyOnceConfig, compare, expected_rows, plan_runs, thresholds


def _dump(folder: Path, rows: list[tuple[str, str, str, int]]) -> Path:
    folder.mkdir()
    ids, words, buckets, attempts = (list(c) for c in zip(*rows))
    table = pa.table({"id": ids, "word": words, "bucket": buckets, "attempt": pa.array(attempts, pa.int32())})
    pq.write_table(table, folder / "part-0.parquet")
    return folder


def test_compare_counts_duplicates_missing_unexpected_and_mixed_attempts(tmp_path: Path) -> None:
    """Record 1 twice (from two deliveries), record 3's second word missing, a row no record makes."""
    expected = expected_rows(4)  # r0: 1 word, r1: 2, r2: 3, r3: 4
    rows = [(i, w, b, 1) for i, w, b in sorted(expected) if (i, w) != ("r0000003", "w3_1")]
    rows += [("r0000001", "w1_0", "1", 2), ("r0000001", "w1_1", "1", 2), ("r0000009", "w9_0", "9", 1)]
    figures = compare(_dump(tmp_path / "dump", rows), expected)
    assert figures == {
        "expected_rows": 10,
        "output_rows": 12,
        "duplicates": 2,
        "missing": 1,
        "unexpected": 1,
        "mixed_attempts": 1,
        "rows_from_replays": 2,
    }


def test_an_exact_dump_is_exact_and_dead_letters_are_left_out(tmp_path: Path) -> None:
    """Every expected row once (dead-lettered record 2 apart): nothing to report."""
    expected = expected_rows(5, dead={"r0000002"})
    assert not any(i == "r0000002" for i, _, _ in expected)
    figures = compare(_dump(tmp_path / "dump", [(i, w, b, 3) for i, w, b in expected]), expected)
    assert (figures["duplicates"], figures["missing"], figures["unexpected"], figures["mixed_attempts"]) == (0, 0, 0, 0)
    assert figures["output_rows"] == figures["expected_rows"] == len(expected)


def test_fault_plan_one_run_per_kind_then_mixed_starting_with_the_executor() -> None:
    """Three kinds, two kills each: three single-kind runs and an interleaved mixed run; faults spread from 20%."""
    runs = plan_runs(ExactlyOnceConfig(kills=2))
    assert runs == [
        ["acker", "acker"],
        ["driver", "driver"],
        ["executor", "executor"],
        ["executor", "acker", "driver", "executor", "acker", "driver"],
    ]
    assert plan_runs(ExactlyOnceConfig(faults=("driver",), kills=3)) == [["driver"] * 3]
    due = thresholds(6, 0.2)
    assert due[0] == 0.2 and due == sorted(due) and due[-1] == pytest.approx(0.8)


def test_unknown_fault_kind_is_refused() -> None:
    """A typo in --faults is an error, not a run without faults."""
    with pytest.raises(ValueError, match="unknown fault kinds"):
        ExactlyOnceConfig(faults=("acker", "network"))


def test_staged_progress_survives_a_staging_folder_removed_while_it_is_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit moves or drops staged files while the fault driver counts them: the count goes on, it does not
    end the run with FileNotFoundError (seen once in the exactly-once fault loop)."""
    from acker_bench.faults import StagedProgress

    staging = tmp_path / "out" / ".acker-staging"
    staging.mkdir(parents=True)

    def vanishing(self: Path, pattern: str):  # noqa: ANN202 - Path.rglob's stand-in
        yield from ()
        raise FileNotFoundError(f"{self}/r00000/p00007-t12/bucket=5")

    monkeypatch.setattr(Path, "rglob", vanishing)
    assert StagedProgress([], [tmp_path / "out"]).rows() == 0
