"""The progress view's count of a running round's logged rows: read on from where it stopped, torn tails later."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from acker_spark.tracking import emission_log
from acker_spark.tracking.emission_log import EmissionWriter, RoundRows, round_dir


def write(writer: EmissionWriter, start: int, count: int) -> None:
    """One batch of ``count`` rows, roots ``start + 1 ..``."""
    roots = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    writer.write(roots, roots, np.ones(count, dtype=np.uint16))


def test_rows_of_growing_files_are_counted_once_each(tmp_path: Path) -> None:
    counter = RoundRows(tmp_path)
    first, second = EmissionWriter(tmp_path, 0, 0, 1), EmissionWriter(tmp_path, 0, 1, 2)
    assert counter.count(0) == 0
    write(first, 0, 5)
    assert counter.count(0) == 5
    write(first, 5, 7)
    write(second, 100, 3)
    assert counter.count(0) == 15
    assert counter.count(0) == 15  # nothing new: the same figure
    first.close()  # the end-of-stream marker is no batch
    assert counter.count(0) == 15
    second.close()


def test_a_count_reads_only_what_was_written_since_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that grows batch by batch is read from its last whole batch on, not from its start."""
    counter = RoundRows(tmp_path)
    writer = EmissionWriter(tmp_path, 0, 0, 1)
    read_from: list[int] = []
    real = emission_log.count_batches_from

    def spy(path: Path, offset: int) -> tuple[int, int]:
        read_from.append(offset)
        return real(path, offset)

    monkeypatch.setattr(emission_log, "count_batches_from", spy)
    for batch in range(4):
        write(writer, 10 * batch, 10)
        assert counter.count(0) == 10 * (batch + 1)
    writer.close()
    assert read_from[0] == 0 and read_from[1:] == sorted(read_from[1:]) and len(set(read_from)) == 4


def test_a_torn_last_batch_is_counted_once_it_is_whole(tmp_path: Path) -> None:
    writer = EmissionWriter(tmp_path, 0, 0, 1)
    write(writer, 0, 4)
    write(writer, 4, 6)
    writer.close()
    path = round_dir(tmp_path, 0) / writer.path.name
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # the second batch cut mid-body, as a writer caught mid-write
    counter = RoundRows(tmp_path)
    assert counter.count(0) == 4
    path.write_bytes(whole)
    assert counter.count(0) == 10


def test_a_new_round_starts_a_new_count(tmp_path: Path) -> None:
    counter = RoundRows(tmp_path)
    writers = [EmissionWriter(tmp_path, 0, 0, 1), EmissionWriter(tmp_path, 1, 0, 2)]
    write(writers[0], 0, 3)
    write(writers[1], 0, 2)
    assert counter.count(0) == 3
    assert counter.count(1) == 2
    for writer in writers:
        writer.close()
