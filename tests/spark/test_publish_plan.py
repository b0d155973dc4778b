"""A commit decides on runs of rows: the same verdict per file as deciding row by row, for any sidecar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from acker_spark.output.publish import KeptRuns, kept_runs, taken_rows
from acker_spark.output.staging import Segment, TaskFolder, run_lengths
from hypothesis import given
from hypothesis import strategies as st


def segment_of(counts: np.ndarray, roots: np.ndarray, file_rows: list[int]) -> Segment:
    """A segment as its sidecar codes it (run-length coded counts and roots)."""
    count_values, count_lengths = run_lengths(counts.astype(np.int32))
    root_values, root_lengths = run_lengths(roots.astype(np.uint64))
    return Segment(
        TaskFolder(Path("/nowhere"), 0, 0),
        0,
        [f"f{i}.parquet" for i in range(len(file_rows))],
        np.array(file_rows, dtype=np.int64),
        count_values,
        count_lengths,
        root_values,
        root_lengths,
        np.zeros(0, dtype=np.uint64),
        np.zeros((0, 3), dtype=np.int64),
    )


def per_file(keep: np.ndarray, file_rows: list[int]) -> list[int]:
    """Taken rows per file, counted row by row."""
    bounds = np.cumsum([0, *file_rows])
    return [int(keep[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]


@st.composite
def sidecars(draw: st.DrawFn, one_root: bool) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray, np.ndarray]:
    """Rows grouped by record (each record's rows adjacent), cut into files anywhere; the commit's root sets."""
    records = draw(st.lists(st.integers(1, 6), max_size=30))  # rows per record
    trees = draw(st.integers(1, 12))
    counts: list[int] = []
    roots: list[int] = []
    for rows in records:
        anchors = (
            [draw(st.integers(0, trees - 1))]
            if one_root
            else draw(st.lists(st.integers(0, trees - 1), min_size=0, max_size=3))
        )
        for _ in range(rows):
            counts.append(len(anchors))
            roots.extend(anchors)
    total = len(counts)
    cuts = sorted(draw(st.lists(st.integers(0, total), max_size=5)))
    file_rows = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    taken = np.unique(np.array(draw(st.lists(st.integers(0, trees - 1), max_size=trees)), dtype=np.uint64))
    new = taken[: draw(st.integers(0, len(taken)))] if len(taken) else taken
    return np.array(counts, dtype=np.int64), np.array(roots, dtype=np.uint64), file_rows, new, taken


@given(sidecars(one_root=True))
def test_one_root_per_row_runs_give_the_rows_verdict(case: tuple) -> None:
    counts, roots, file_rows, new, taken = case
    segment = segment_of(counts, roots, file_rows)
    kept = kept_runs(segment, new, taken)
    expected = taken_rows(counts, roots, new, taken)
    assert segment.one_root_per_row
    assert kept.rows().tolist() == expected.tolist()
    assert kept.kept_per_file(segment.file_rows).tolist() == per_file(expected, file_rows)


@given(sidecars(one_root=False))
def test_rows_of_several_trees_are_decided_row_by_row(case: tuple) -> None:
    counts, roots, file_rows, new, taken = case
    segment = segment_of(counts, roots, file_rows)
    expected = taken_rows(counts, roots, new, taken)
    kept = kept_runs(segment, new, taken)
    assert kept.rows().tolist() == expected.tolist()
    assert kept.kept_per_file(segment.file_rows).tolist() == per_file(expected, file_rows)


@given(st.lists(st.booleans(), max_size=40), st.data())
def test_kept_per_file_counts_runs_cut_by_file_bounds(keep: list[bool], data: st.DataObject) -> None:
    rows = np.array(keep, dtype=bool)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(keep)), max_size=6)))
    file_rows = [b - a for a, b in zip([0, *cuts], [*cuts, len(keep)])]
    runs = KeptRuns.from_rows(rows)
    assert runs.rows().tolist() == keep
    assert runs.kept_per_file(np.array(file_rows, dtype=np.int64)).tolist() == per_file(rows, file_rows)
