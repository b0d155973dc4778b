"""Causes written by executors into the checkpoint and read back by the driver (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from acker_spark.causes import CauseWriter, cause_kinds, read_causes
from acker_spark.job_errors import error_type


def test_causes_round_trip_first_cause_wins_and_torn_tail_is_skipped(tmp_path: Path) -> None:
    """Two task attempts write causes; the first cause of a root is kept; a torn last batch is ignored."""
    first = CauseWriter(tmp_path, "bolt-p0-t1")
    first.write({1: "ValueError: bad date '2021' (at job.py:3 in parse)", 2: "not a date"})
    first.write({3: "TimeoutError: service (at job.py:9 in call)"})
    first.close()
    second = CauseWriter(tmp_path, "bolt-p0-t2")
    second.write({1: "KeyError: 'id' (at job.py:4 in parse)", 4: "ValueError: x"})
    second.close()
    torn = tmp_path / "causes" / "bolt-p0-t2.arrow"
    torn.write_bytes(torn.read_bytes()[:-20])  # the writer died mid-batch
    causes = read_causes(tmp_path)
    assert causes[1].startswith("ValueError: bad date") and causes[2] == "not a date" and 3 in causes
    assert 4 not in causes  # only in the torn batch
    assert cause_kinds(causes, np.array([1, 2, 3, 9], dtype=np.uint64)) == {
        "ValueError": 1,
        "not a date": 1,
        "TimeoutError": 1,
    }


def test_error_type_reads_exception_names_not_free_text() -> None:
    """``Type: message`` names its type (module dropped); a free-text reason names none."""
    assert error_type("json.decoder.JSONDecodeError: Expecting value (at x.py:1 in f)") == "JSONDecodeError"
    assert error_type("ValueError: ") == "ValueError"
    assert error_type("not a date: '2021'") is None
    assert error_type(None) is None
