"""A root staged in two rounds (a zombie task of a failed round and the re-read of its records) is published once.

A failed round's job can leave a task's Python worker running after Spark
reported the failure: it logs, stages and acks records after the driver read
the round's emission log, so the next first read (``skip`` filter) reads them
again as attempt 1, with the very same roots, and stages them in its own round.
Both copies are of one ACKED delivery: the commit must take one of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from acker_spark.output import publish
from acker_spark.output.commits import staged_files
from acker_spark.output.publish import plan_commit, stage_commit
from acker_spark.output.staging import DONE, StagingArea, run_lengths


def stage_task(
    area: StagingArea, round_no: int, partition: int, attempt: int, roots: list[int], done: bool, anchors: int = 1
) -> None:
    """One task attempt's folder: one segment, one file under bucket=1, one row per root given (words w<i>);
    ``anchors`` > 1: each row is anchored to that many trees, ``root``, ``root + 1``, ..."""
    folder = area.round_dir(round_no) / f"p{partition:05d}-t{attempt}"
    name = "bucket=1/s00000-f00000.parquet"
    (folder / "bucket=1").mkdir(parents=True)
    pq.write_table(
        pa.table({"id": [f"r{r}" for r in roots], "word": [f"w{i}" for i in range(len(roots))]}), folder / name
    )
    pairs = [r + k for r in roots for k in range(anchors)]
    values, lengths = run_lengths(np.array(pairs, dtype=np.uint64))
    counts_v, counts_l = run_lengths(np.full(len(roots), anchors, dtype=np.int32))
    np.savez(
        folder / "_s00000.npz",
        files=np.array([name]),
        file_rows=np.array([len(roots)], dtype=np.int64),
        count_values=counts_v,
        count_lengths=counts_l,
        root_values=values,
        root_lengths=lengths,
        batch_keys=np.array([1000 * round_no + partition], dtype=np.uint64),
        batch_file_rows=np.array([[0, 0, len(roots)]], dtype=np.int64),
    )
    if done:
        (folder / DONE).touch()


def published_ids(tmp_path: Path, area: StagingArea, rounds: tuple[int, ...], new: list[int]) -> list[str]:
    roots = np.array(sorted(new), dtype=np.uint64)
    plan = plan_commit(area, rounds, roots, roots)
    out = tmp_path / "commit"
    stage_commit(plan, out)
    ids = sorted(i for f in out.rglob("*.parquet") for i in pq.read_table(f)["id"].to_pylist())
    assert len(ids) == plan.rows
    return ids


def test_a_root_staged_by_a_zombie_task_and_by_the_next_round_is_published_once(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    stage_task(area, 0, 1, 5, [22, 22], done=True)  # round 0, a task that ended before the executor kill
    stage_task(area, 0, 3, 7, [11, 11, 11], done=True)  # round 0, the zombie: logged after the driver's read
    stage_task(area, 1, 3, 42, [11, 11, 11], done=True)  # round 1 re-read those records: attempt 1, same root
    assert published_ids(tmp_path, area, (0, 1), [11, 22]) == ["r11"] * 3 + ["r22"] * 2


def test_the_complete_copy_is_taken_when_the_earlier_one_was_cut(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    stage_task(area, 0, 3, 7, [11], done=False)  # a zombie killed after its first segment: part of the rows
    stage_task(area, 1, 3, 42, [11, 11, 11], done=True)
    assert published_ids(tmp_path, area, (0, 1), [11]) == ["r11"] * 3


def test_a_root_staged_in_one_round_only_is_taken_from_it(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    stage_task(area, 0, 3, 7, [11, 11], done=True)
    stage_task(area, 1, 2, 42, [33], done=True)
    assert published_ids(tmp_path, area, (0, 1), [11, 33]) == ["r11", "r11", "r33"]


def test_a_row_of_several_trees_staged_in_two_rounds_is_published_once(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    stage_task(area, 0, 3, 7, [11, 11], done=True, anchors=2)  # rows of trees 11 and 12
    stage_task(area, 1, 3, 42, [11, 11], done=True, anchors=2)
    assert published_ids(tmp_path, area, (0, 1), [11, 12]) == ["r11", "r11"]


# The other destinations (TableOutput, BatchOutput) select the commit's rows from the staged files with Spark and
# keep one copy of each row only when the files may hold one twice: the zombie's round must count as that.


def test_a_root_staged_in_two_rounds_makes_a_table_commit_keep_one_copy(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), False, ("bucket",))
    stage_task(area, 0, 3, 7, [11, 11, 11], done=True)  # the zombie of round 0
    stage_task(area, 1, 3, 42, [11, 11, 11], done=True)  # round 1's re-read of the same deliveries
    files, copies = staged_files(area, (0, 1))
    assert len(files) == 2 and copies


def test_distinct_roots_in_two_rounds_need_no_copy_dropping(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), False, ("bucket",))
    stage_task(area, 0, 3, 7, [11, 11], done=True)
    stage_task(area, 1, 2, 42, [33], done=True)
    files, copies = staged_files(area, (0, 1))
    assert len(files) == 2 and not copies


def test_two_attempts_of_one_partition_in_one_round_keep_one_copy(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), False, ("bucket",))
    stage_task(area, 0, 3, 7, [11, 11], done=True)
    stage_task(area, 0, 3, 8, [11, 11], done=True)  # a re-run of the same task
    files, copies = staged_files(area, (0,))
    assert len(files) == 2 and copies


# A whole commit of one round (every delivery the round started ACKED, none committed before) takes every row of
# the attempts it chooses: the plan needs no lookup of the rows' trees.


def test_a_whole_commit_of_one_round_plans_as_the_lookup_would_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    stage_task(area, 0, 1, 5, [22, 22], done=True)
    stage_task(area, 0, 3, 7, [11, 11, 11], done=False)  # a failed attempt's part
    stage_task(area, 0, 3, 8, [11, 11, 11], done=True)  # its retry, complete: the one chosen
    stage_task(area, 0, 4, 9, [33, 34], done=True, anchors=2)  # rows of two trees each
    roots = np.array([11, 22, 33, 34, 35], dtype=np.uint64)
    looked_up = plan_commit(area, (0,), roots, roots)

    def no_lookup(*_: object) -> None:
        raise AssertionError("a whole commit looked its rows' trees up")

    monkeypatch.setattr(publish, "member_of", no_lookup)
    whole = plan_commit(area, (0,), None, None)
    assert whole == looked_up and whole.rows == 7 and whole.moved == 3


def test_a_whole_commit_of_several_rounds_is_refused_without_its_roots(tmp_path: Path) -> None:
    area = StagingArea(str(tmp_path / "staging"), True, ("bucket",))
    with pytest.raises(ValueError, match="several rounds"):
        plan_commit(area, (0, 1), None, None)
