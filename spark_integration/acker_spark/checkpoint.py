"""The source pipeline's durable checkpoint directory: what a restarted driver needs to finish the run.

Layout (every file is appended or replaced atomically, so a ``kill -9`` at any
moment leaves a readable directory)::

    pipeline.json              run identity: spout name, id salt, source identity, policy, progress
    emissions/r<round>/*.arrow roots the executors started (see :mod:`acker_spark.emission_log`)
    rounds/r<round>.npz        which records each round read
    outcomes/j<n>.arrow        every outcome the driver took, in order: the ackers' and its own (LOST, job failures)
    positions.json             per shard, the outcome stream position the journal holds everything up to
    dead/j<n>.arrow            identities whose dead letters were written
    undelivered/j<n>.arrow     roots whose acks a bolt could not deliver (they end as ACKS_UNDELIVERED)
    source/*.parquet           an in-memory source, copied once (see :mod:`acker_spark.memory_source`)

The run's state is a pure function of these: the settled records are the
emitted roots with an outcome in the journal (the first one counts), the
attempts come from the emission log, and a restarted driver resumes the
outcome streams after ``positions.json`` so outcomes that arrived while it was
down are not missed (within the ackers' retention).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["Checkpoint", "JournalWriter", "read_complete_batches"]

OUTCOME_SCHEMA = pa.schema([("root", pa.uint64()), ("outcome", pa.int8())])
DEAD_SCHEMA = pa.schema([("ident", pa.uint64())])
UNDELIVERED_SCHEMA = pa.schema([("root", pa.uint64())])


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that a crash leaves the old file or the new one (fsync, then rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class JournalWriter:
    """An append-only Arrow IPC stream, each batch pushed to disk (``fsync``) before :meth:`append` returns."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.schema = schema
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._writer = pa.ipc.new_stream(self._file, schema)

    def append(self, *columns: np.ndarray) -> None:
        """Write one batch of parallel columns durably."""
        if not len(columns[0]):
            return
        arrays = [pa.array(c, f.type) for c, f in zip(columns, self.schema)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """End the stream and close the file."""
        if not self._file.closed:
            self._writer.close()
            self._file.close()


class Checkpoint:
    """One run's checkpoint directory (created if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).absolute()
        self.path.mkdir(parents=True, exist_ok=True)

    # -- the manifest -------------------------------------------------------------------

    def manifest(self) -> dict[str, Any] | None:
        """``pipeline.json``, or None for a new checkpoint."""
        try:
            return json.loads((self.path / "pipeline.json").read_text())
        except FileNotFoundError:
            return None

    def save_manifest(self, data: dict[str, Any]) -> None:
        """Replace ``pipeline.json`` atomically."""
        write_json_atomically(self.path / "pipeline.json", data)

    # -- journals -----------------------------------------------------------------------

    def _next_journal(self, folder: str) -> Path:
        existing = sorted((self.path / folder).glob("j*.arrow")) if (self.path / folder).is_dir() else []
        return self.path / folder / f"j{len(existing):05d}.arrow"

    def outcome_journal(self) -> JournalWriter:
        """A new outcome journal for this driver (earlier drivers' journals stay as they are)."""
        return JournalWriter(self._next_journal("outcomes"), OUTCOME_SCHEMA)

    def dead_journal(self) -> JournalWriter:
        """A new journal of identities whose dead letters were written."""
        return JournalWriter(self._next_journal("dead"), DEAD_SCHEMA)

    def undelivered_journal(self) -> JournalWriter:
        """A new journal of roots whose acks an executor could not deliver."""
        return JournalWriter(self._next_journal("undelivered"), UNDELIVERED_SCHEMA)

    def read_undelivered(self) -> np.ndarray:
        """Roots whose acks an executor could not deliver."""
        return _read_journals(self.path / "undelivered", UNDELIVERED_SCHEMA).column("root").to_numpy()

    def read_outcomes(self) -> tuple[np.ndarray, np.ndarray]:
        """Every journaled ``(root, outcome)``, oldest first."""
        table = _read_journals(self.path / "outcomes", OUTCOME_SCHEMA)
        return table.column("root").to_numpy(), table.column("outcome").to_numpy()

    def read_dead(self) -> np.ndarray:
        """Identities whose dead letters were written."""
        return _read_journals(self.path / "dead", DEAD_SCHEMA).column("ident").to_numpy()

    # -- stream positions ---------------------------------------------------------------

    def positions(self) -> dict[int, tuple[int, int]]:
        """Per shard, the ``(incarnation, sequence)`` the outcome journal is complete up to."""
        try:
            data = json.loads((self.path / "positions.json").read_text())
        except FileNotFoundError:
            return {}
        return {int(shard): (int(inc), int(seq)) for shard, (inc, seq) in data.items()}

    def save_positions(self, positions: dict[int, tuple[int, int]]) -> None:
        """Record the stream positions (after the outcomes up to them are journaled)."""
        write_json_atomically(self.path / "positions.json", {str(k): list(v) for k, v in positions.items()})


def _read_journals(folder: Path, schema: pa.Schema) -> pa.Table:
    batches: list[pa.RecordBatch] = []
    for path in sorted(folder.glob("j*.arrow")) if folder.is_dir() else []:
        batches.extend(read_complete_batches(path))
    return pa.Table.from_batches(batches, schema)


def read_complete_batches(path: Path) -> list[pa.RecordBatch]:
    """The whole batches of an Arrow IPC stream; a torn last batch (its writer died mid-write) is left out."""
    batches = []
    try:
        with pa.OSFile(str(path), "rb") as source:
            reader = pa.ipc.open_stream(source)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
    except (pa.ArrowInvalid, OSError, EOFError):
        pass  # a torn tail: the batches before it are complete
    return batches
