"""StreamOutput commits trees that ACKED with no row staged anywhere (an empty commit), once it has made a first one.

The acker_queue planner acks a message at its broker once a done commit
holds its tree, so a tree whose record made no row must still be taken by a
commit. No Spark: an empty commit to a Parquet folder moves no file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from acker_protocol.wire import Outcome
from acker_spark.output import FileOutput, StreamOutput
from acker_spark.queues.queue_planner import committed_roots


def journal_acked(output: StreamOutput, roots: list[int]) -> None:
    """Journal ``roots`` as ACKED in the stream's checkpoint (as the planner's outcome feed does)."""
    journal = output.checkpoint.outcome_journal()
    try:
        journal.append(np.asarray(roots, dtype=np.uint64), np.full(len(roots), int(Outcome.ACKED), dtype=np.int8))
    finally:
        journal.close()


def test_trees_acked_without_rows_are_committed_empty_after_the_first_commit(tmp_path: Path) -> None:
    output = StreamOutput(FileOutput(str(tmp_path / "out")), tmp_path / "cp", ["127.0.0.1:1"])
    journal_acked(output, [5, 6])
    # No first commit yet: it waits for rows (it is the one that meets the destination, a table's creation).
    assert output._commit(None, 0) == 0 and not output.commits.records()
    output.commits.commit(None, np.asarray([5], dtype=np.uint64), np.asarray([], dtype=np.int64), key=0)
    assert committed_roots(output.checkpoint.path).tolist() == [5]
    assert output._commit(None, 1) == 0  # nothing staged: an empty commit of root 6
    (first, second) = output.commits.records()
    assert (second.key, second.state, second.rows) == (1, "done", 0)
    assert committed_roots(output.checkpoint.path).tolist() == [5, 6]
    assert output._commit(None, 2) == 0 and len(output.commits.records()) == 2  # nothing fresh: no commit
