"""The durable checkpoint directory of an executor-read driver: what a restarted driver needs to finish the run.

Both executor-read drivers, :class:`~acker_spark.executor_read.source_pipeline.SourcePipeline`
and the ``acker_spout`` stream's :class:`~acker_spark.streaming.stream_planner.StreamPlanner`,
keep their state here, in one layout. Every file is appended or replaced
atomically, so a ``kill -9`` at any moment leaves a readable directory::

    manifest.json              the run (:class:`Manifest`): driver kind, spout name, id salt, and the
                               driver's own section: the source pipeline's source identity and
                               progress (:class:`SourceSection`), or the stream's directory
                               (:class:`StreamSection`)
    emissions/r<round>/*.arrow roots the executors started (see :mod:`acker_spark.tracking.emission_log`)
    rounds/r<round>.npz        which records each round read (its filter)
    outcomes/j<n>.arrow        every outcome the driver took, in order: the ackers' and its own (LOST, job failures)
    positions.json             per shard, the outcome stream position the journal holds everything up to
    dead/j<n>.arrow            identities whose dead letters were written
    undelivered/j<n>.arrow     roots whose acks a bolt could not deliver (they end as ACKS_UNDELIVERED)

The source pipeline's own files::

    source/*.parquet           an in-memory source, copied once (see :mod:`acker_spark.executor_read.memory_source`)
    output/staged, output/commits  the job's staged output (a Parquet FileOutput stages beside its folder) and its commits

The stream's own files::

    stream/files.json          the file registry: every file admitted, in order, with size and mtime
    stream/plans/r<round>.npz  the replays a micro-batch re-reads (identities and attempts)

The run's state is a pure function of these: the settled records are the
emitted roots with an outcome in the journal (the first one counts), the
attempts come from the emission log, and a restarted driver resumes the
outcome streams after ``positions.json`` so outcomes that arrived while it was
down are not missed (within the ackers' retention). A checkpoint belongs to
one kind of driver: the other kind refuses it (:class:`WrongCheckpoint`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..arrow_files import read_complete_batches
from ..run_report import RunError

__all__ = [
    "Checkpoint",
    "JournalWriter",
    "Manifest",
    "SourceSection",
    "StreamSection",
    "WrongCheckpoint",
    "read_complete_batches",
]

MANIFEST_VERSION = 2
DriverKind = Literal["source", "stream"]

OUTCOME_SCHEMA = pa.schema([("root", pa.uint64()), ("outcome", pa.int8())])
DEAD_SCHEMA = pa.schema([("ident", pa.uint64())])
UNDELIVERED_SCHEMA = pa.schema([("root", pa.uint64())])


class WrongCheckpoint(RunError, ValueError):
    """The checkpoint directory belongs to another kind of driver, or to no run this package can read."""


@dataclass
class SourceSection:
    """The source pipeline's part of the manifest: which source it reads and how far the run got."""

    identity: dict[str, Any]  # the record identity (see acker_spark.tracking.identity.IdentitySpec)
    source_done: bool = False  # the first round read the whole source
    next_round: int = 0  # rounds started so far (a round's number is taken before its tasks can start a tree)
    memory_source: dict[str, Any] | None = None  # an in-memory source's copy: its folder and record count
    commit_causes: list[str] = field(default_factory=list)  # why executors could not deliver acks, as reported


@dataclass
class StreamSection:
    """The ``acker_spout`` stream's part of the manifest: the directory it follows."""

    directory: str


@dataclass
class Manifest:
    """The run a checkpoint holds: which driver, its spout name and id salt, and that driver's own section."""

    kind: DriverKind
    name: str
    salt: int
    source: SourceSection | None = None
    stream: StreamSection | None = None
    version: int = MANIFEST_VERSION

    def as_json(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """Read ``manifest.json``'s contents (checked by :meth:`Checkpoint.manifest`)."""
        source, stream = data.get("source"), data.get("stream")
        return cls(
            kind=data["kind"],
            name=data["name"],
            salt=int(data["salt"]),
            source=SourceSection(**source) if source is not None else None,
            stream=StreamSection(**stream) if stream is not None else None,
            version=int(data["version"]),
        )


_DRIVERS = {"source": "a SourcePipeline", "stream": "an acker_spout stream"}


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

    def manifest(self, kind: DriverKind) -> Manifest | None:
        """``manifest.json``, or None for a new checkpoint; :class:`WrongCheckpoint` if another driver's."""
        try:
            data = json.loads((self.path / "manifest.json").read_text())
        except FileNotFoundError:
            if (self.path / "pipeline.json").exists() or (self.path / "stream.json").exists():
                raise WrongCheckpoint(
                    f"the checkpoint {self.path} is of an older format this version cannot resume:"
                    " use a new checkpoint directory"
                ) from None
            return None
        if data.get("version") != MANIFEST_VERSION or data.get("kind") not in _DRIVERS:
            raise WrongCheckpoint(
                f"the checkpoint {self.path} has a manifest of another format (version {data.get('version')!r}):"
                " use a new checkpoint directory"
            )
        if data["kind"] != kind:
            raise WrongCheckpoint(
                f"the checkpoint {self.path} belongs to {_DRIVERS[data['kind']]}, not {_DRIVERS[kind]}:"
                " each run needs a checkpoint directory of its own"
            )
        return Manifest.from_json(data)

    def save_manifest(self, manifest: Manifest) -> None:
        """Replace ``manifest.json`` atomically."""
        write_json_atomically(self.path / "manifest.json", manifest.as_json())

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

    def add_undelivered(self, roots: np.ndarray) -> np.ndarray:
        """Journal those of ``roots`` not journaled yet as undelivered; return them (sorted, each once)."""
        new = np.setdiff1d(np.asarray(roots, dtype=np.uint64), self.read_undelivered())
        if len(new):
            journal = self.undelivered_journal()
            try:
                journal.append(new)
            finally:
                journal.close()
        return new

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
