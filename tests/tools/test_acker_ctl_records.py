"""acker-ctl top/inspect --checkpoint: each tree named by its record, against real ackers (issue 28, item 5).

Reproduced before: ``acker-ctl top`` listed the oldest pending trees by root
id only, so a record hanging in a bolt could not be told from the others. The
source reader now logs each tree's record identity as text next to its
emission file, and ``--checkpoint DIR`` looks the roots up there.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from acker_client.testing import ManualClock, local_cluster
from acker_ctl.cli import main
from acker_spark import close_clients
from acker_spark.executor_read.source_reader import SourceReader
from acker_spark.tracking.emission_log import RoundFilter, write_filter
from acker_spark.tracking.identity import IdentitySpec


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ackers(clock):
    with local_cluster(2, message_timeout=300.0, clock=clock) as cluster:
        yield cluster
    close_clients()


def read_round(ackers, checkpoint, round_no: int, keys: list[str], attempts: list[int] | None = None) -> list[int]:
    """Run the pipeline's reader over one batch of keyed records: their trees start on the ackers; their roots."""
    if attempts is None:
        rows = RoundFilter("all", np.zeros(0, np.uint64), np.zeros(0, np.uint16))
    else:
        from acker_spark.tracking.identity import hash_key_column

        idents = hash_key_column(pa.array(keys), "k")
        rows = RoundFilter("select", idents, np.array(attempts, dtype=np.uint16))
    path = write_filter(checkpoint, round_no, rows)
    reader = SourceReader(IdentitySpec("key", "k"), 7, "orders", str(checkpoint), round_no, str(path), ackers.addresses)
    batch = pa.record_batch({"k": keys, "v": list(range(len(keys)))})
    [out] = list(reader.run(iter([batch]), partition=3, task_attempt=11 + round_no))
    from acker_spark.steps.frames import decode_ids

    return decode_ids(out.column("_acker_ids")).roots.tolist()


def ctl(ackers, *args: str) -> tuple[int, str]:
    printed: list[str] = []
    code = main(["--ackers", ",".join(ackers.addresses), *args], out=printed.append)
    return code, "\n".join(printed)


def test_top_names_each_pending_tree_by_its_record(ackers, clock, tmp_path):
    checkpoint = tmp_path / "cp"
    first = read_round(ackers, checkpoint, 0, ["k00041", "k00042"])
    clock.advance(5.0)
    replay = read_round(ackers, checkpoint, 1, ["k00042"], attempts=[2])
    code, text = ctl(ackers, "--json", "top", "--oldest", "5", "--checkpoint", str(checkpoint))
    assert code == 0
    rows = {r["root"]: r for r in json.loads(text)}
    assert {(r["record"], r["attempt"], r["round"]) for r in rows.values()} == {
        ("k00041", 1, 0),
        ("k00042", 1, 0),
        ("k00042", 2, 1),
    }
    assert rows[replay[0]]["age_seconds"] == 0.0 and rows[first[0]]["age_seconds"] == 5.0
    code, text = ctl(ackers, "top", "--checkpoint", str(checkpoint))
    header, *lines = text.splitlines()
    assert header.split()[:4] == ["root", "record", "attempt", "round"]
    assert any(line.split()[1:4] == ["k00042", "2", "1"] for line in lines)


def test_inspect_names_the_records_it_knows_and_leaves_other_roots_blank(ackers, tmp_path):
    checkpoint = tmp_path / "cp"
    (root,) = read_round(ackers, checkpoint, 0, ["only"])
    code, text = ctl(ackers, "--json", "inspect", str(root), "12345", "--checkpoint", str(checkpoint))
    assert code == 0
    rows = json.loads(text)
    assert [(r["root"], r["record"], r["attempt"]) for r in rows] == [(root, "only", 1), (12345, None, None)]


def test_a_checkpoint_that_is_not_a_directory_is_refused(ackers, tmp_path, capsys):
    code, _ = ctl(ackers, "top", "--checkpoint", str(tmp_path / "missing"))
    assert code == 1
    assert "is not a directory: give the pipeline's checkpoint directory" in capsys.readouterr().err
