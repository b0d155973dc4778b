"""Exactly-once output for the ``acker_spout`` streaming source: stage in ``foreachBatch``, commit what ACKED.

A streaming query's ``foreachBatch(job)`` hands each micro-batch to ``job(df,
batch_id)``; there, :meth:`StreamOutput.write` takes the micro-batch's output
DataFrame (rows anchored to their records, as bolts emit them)::

    out = StreamOutput(FileOutput("out/", partition_by=["day"]), "acker-checkpoint", ADDRESSES)

    def job(df, batch_id):
        out.write(split_bolt.apply_df(df), batch_id)

    query = spark.readStream.format("acker_spout")...writeStream.foreachBatch(job).start()
    query.awaitTermination()
    out.finish(spark)   # after an availableNow query: commit the last trees that ACKED

``write`` stages the rows under the source's checkpoint and acks them batch by
batch (:class:`~acker_spark.output.stager.OutputStager`), then commits, keyed
by Spark's ``batch_id``, the rows of every tree whose first outcome in the
source's outcome journal is ACKED and that no commit took yet. A micro-batch's
own trees usually complete just after it: their rows go out with a later
micro-batch's commit, or with :meth:`StreamOutput.finish`. A query restarted
from its checkpoints runs an unfinished micro-batch again with the same
``batch_id``: its commit is finished (same rows) instead of made twice, and
its rows staged again are the same rows, kept once.
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from acker_protocol.wire import Outcome

from ..causes import CHECKPOINT_PROPERTY
from ..session import spark_context_of
from ..steps.frames import TRACKING_COLUMN
from ..tracking.checkpoint import Checkpoint
from .commits import OutputCommits
from .destinations import Output
from .stager import OutputStager, stager_schema
from .staging import read_segments, task_folders

__all__ = ["StreamOutput", "journal_outcomes"]

_FINAL = -1  # the commit key of finish(): after the last micro-batch


class StreamOutput:
    """Exactly-once output of an ``acker_spout`` query: stage each micro-batch's rows, commit the ACKED trees' rows.

    ``checkpoint`` is the source's ``checkpoint`` option (its outcome journal
    says which trees ACKED), ``addresses`` its ``ackers`` (shard order);
    ``security`` and ``client_options`` as for a bolt.
    """

    def __init__(
        self,
        output: Output,
        checkpoint: str | Path,
        addresses: Sequence[str],
        *,
        security: Any = None,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        self.output = output
        self.checkpoint = Checkpoint(checkpoint)
        self.addresses = tuple(addresses)
        self.security = security
        self.client_options = dict(client_options or {})
        self.run = f"stream{zlib.crc32(str(self.checkpoint.path).encode()):08x}"
        self.commits = OutputCommits(self.checkpoint.path, self.run, output)
        self.staged_rows = 0

    def write(self, df: Any, batch_id: int) -> int:
        """Stage micro-batch ``batch_id``'s output rows, then commit what ACKED so far (keyed by ``batch_id``).

        Returns the rows committed now (from earlier micro-batches, usually).
        """
        if TRACKING_COLUMN not in df.columns:
            raise ValueError(
                f"StreamOutput.write takes the rows a bolt emitted, with {TRACKING_COLUMN!r}; got columns {df.columns}"
            )
        spark = df.sparkSession
        rows = self.commits.finish(spark)
        stager = OutputStager(
            self.commits.area,
            int(batch_id),
            zlib.crc32(self.run.encode()),
            self.addresses,
            self.security,
            self.client_options,
        )
        sc = spark_context_of(spark)
        if sc is not None:  # the bolts write why records failed into the checkpoint: dead letters get causes
            sc.setLocalProperty(CHECKPOINT_PROPERTY, str(self.checkpoint.path))
        try:
            self.staged_rows += sum(r[0] for r in df.mapInArrow(stager, stager_schema()).collect())
        finally:
            if sc is not None:
                sc.setLocalProperty(CHECKPOINT_PROPERTY, None)
        if self.commits.has_key(int(batch_id)):
            return rows  # this micro-batch ran before a restart and made its commit (finished above)
        return rows + self._commit(spark, int(batch_id))

    def finish(self, spark: Any) -> int:
        """Commit the rows of trees that ACKED after the last micro-batch (call once the query has ended)."""
        rows = self.commits.finish(spark)
        return rows + self._commit(spark, _FINAL - len(self.commits.records()))

    def _commit(self, spark: Any, key: int) -> int:
        ended, acked = self._journal()  # one reading of the journal for both: it grows meanwhile
        fresh = acked[~np.isin(acked, self.commits.taken())]
        staged = self._staged_rounds()
        if not len(fresh) or (not staged and not self.commits.records()):
            return 0
        # With nothing staged the fresh trees made no row, but they are still committed (an empty commit):
        # the log is how an acker_queue planner learns their messages may be acked at the broker. Not as the
        # first commit: that one meets the destination first (a table is created by it), with rows.
        rows = self.commits.commit(spark, fresh, np.asarray(staged), key=key)
        self._drop_resolved(staged, ended)
        return rows

    def _journal(self) -> tuple[np.ndarray, np.ndarray]:
        """Roots with an outcome in the journal, and those whose first outcome is ACKED (both sorted)."""
        return journal_outcomes(self.checkpoint)

    def _staged_rounds(self) -> list[int]:
        return self.commits.area.rounds()

    def _drop_resolved(self, rounds: list[int], ended: np.ndarray) -> None:
        """Delete staged folders whose every tree had an outcome before this commit: none is left to take."""
        for round_no in rounds:
            folder = self.commits.area.round_dir(round_no)
            segments = [s for task in task_folders(folder) for s in read_segments(task)]
            if all(np.isin(s.pair_roots, ended).all() for s in segments):
                shutil.rmtree(folder, ignore_errors=True)


def journal_outcomes(checkpoint: Checkpoint) -> tuple[np.ndarray, np.ndarray]:
    """Roots with an outcome in ``checkpoint``'s journal, and those whose first outcome is ACKED (both sorted).

    A commit takes the second set (a delivery is ACKED by its first outcome);
    the ``acker_queue`` planner asks the same of its held messages.
    """
    roots, outcomes = checkpoint.read_outcomes()
    if not len(roots):
        return roots, roots
    order = np.argsort(roots, kind="stable")
    by_root, by_outcome = roots[order], outcomes[order]
    first = np.concatenate(([True], by_root[1:] != by_root[:-1]))
    return by_root[first], by_root[first][by_outcome[first] == int(Outcome.ACKED)]
