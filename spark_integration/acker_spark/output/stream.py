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
import pyarrow.parquet as pq
from acker_protocol.wire import Outcome

from ..executor_read.checkpoint import Checkpoint
from ..steps.frames import TRACKING_COLUMN, decode_ids
from .commits import OutputCommits
from .destinations import Output
from .stager import STAGED_DIR, OutputStager, stager_schema

__all__ = ["StreamOutput"]

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
            str(self.checkpoint.path),
            int(batch_id),
            zlib.crc32(self.run.encode()),
            self.addresses,
            self.security,
            self.client_options,
        )
        self.staged_rows += sum(r[0] for r in df.mapInArrow(stager, stager_schema()).collect())
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
        if not len(fresh) or not staged:
            return 0
        rows = self.commits.commit(spark, fresh, np.asarray(staged), key=key)
        self._drop_resolved(staged, ended)
        return rows

    def _journal(self) -> tuple[np.ndarray, np.ndarray]:
        """Roots with an outcome in the journal, and those whose first outcome is ACKED (both sorted)."""
        roots, outcomes = self.checkpoint.read_outcomes()
        if not len(roots):
            return roots, roots
        order = np.argsort(roots, kind="stable")
        by_root, by_outcome = roots[order], outcomes[order]
        first = np.concatenate(([True], by_root[1:] != by_root[:-1]))
        return by_root[first], by_root[first][by_outcome[first] == int(Outcome.ACKED)]

    def _staged_rounds(self) -> list[int]:
        folder = self.checkpoint.path / STAGED_DIR
        return sorted(int(p.name[1:]) for p in folder.glob("r*") if p.is_dir()) if folder.is_dir() else []

    def _drop_resolved(self, rounds: list[int], ended: np.ndarray) -> None:
        """Delete staged folders whose every tree had an outcome before this commit: none is left to take."""
        for round_no in rounds:
            folder = self.checkpoint.path / STAGED_DIR / f"r{round_no:05d}"
            files = sorted(folder.glob("p*.parquet"))
            staged = [decode_ids(pq.read_table(f, columns=[TRACKING_COLUMN]).column(TRACKING_COLUMN)) for f in files]
            if all(np.isin(s.roots, ended).all() for s in staged):
                shutil.rmtree(folder, ignore_errors=True)
