"""Opening a SourcePipeline's source: the DataFrame its rounds read, the checkpoint's run, the frames of each round.

:func:`source_frame` turns what ``run`` was given into the DataFrame the
rounds read: a DataFrame as it is, a ``TextDirectorySource`` as
``spark.read.text`` over its files, an in-memory source copied once into the
checkpoint as Parquet (:mod:`acker_spark.executor_read.memory_source`) and
read from that copy on every round and every later run. :func:`open_run`
starts the checkpoint's run, or checks that this source is the one its run was
reading. :class:`SourceFrames` makes the frame a round's job gets (the
source's columns plus ``_record_key``, ``_attempt`` and ``_acker_ids``, read
through a :class:`~acker_spark.executor_read.source_reader.SourceReader`), and
reads dead records again for their dead letters (a peek round: it starts no
tree and logs nothing).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from acker_client import new_id
from acker_protocol.wire import Outcome

from ..run_report import SourceStats
from ..session import default_parallelism
from ..sources import TextDirectorySource
from ..steps.fusion import map_in_arrow
from ..tracking.book import DeadLetterRow, DeadRecords
from ..tracking.checkpoint import Checkpoint, Manifest, SourceSection
from ..tracking.emission_log import Emissions, RoundFilter, write_filter
from ..tracking.identity import IdentitySpec, UnstableIdentity, apply_pinned_conf, check_unchanged
from .memory_source import COPY_DIR, KEY, DuplicateIdentity, is_dataframe, is_utf8, text_frame, write_records
from .source_reader import ATTEMPT_COLUMN, IDENT_COLUMN, KEY_COLUMN, SourceReader, reader_schema

__all__ = ["SourceFrames", "open_run", "source_frame"]

log = logging.getLogger(__name__)

_PEEK_ROUND = 99_999  # the filter file of dead-letter reads (they start no trees and log nothing)


def source_frame(
    spark: Any, checkpoint: Checkpoint, source: Any, key: str | None, stats: SourceStats
) -> tuple[Any, str | None, dict[str, Any] | None]:
    """The DataFrame the rounds read, its key column, and for a new copy of an in-memory source its description."""
    manifest = checkpoint.manifest("source")
    copied = manifest is not None and manifest.source is not None and manifest.source.memory_source is not None
    if is_dataframe(source) or (isinstance(source, TextDirectorySource) and is_utf8(source.encoding)):
        if copied:
            raise UnstableIdentity(
                f"the checkpoint {checkpoint.path} holds a copy of an in-memory source; this source is "
                "read by Spark: pass the in-memory source again (it is not re-read), or use a new checkpoint"
            )
        if isinstance(source, TextDirectorySource):
            if key is not None:
                raise ValueError("a TextDirectorySource's lines are identified by file and position: no key=")
            return text_frame(spark, source), None, None
        return source, key, None
    if key is not None:
        raise ValueError(
            f"key={key!r} names a DataFrame column; an in-memory source's records are identified by their keys"
        )
    folder = checkpoint.path / COPY_DIR
    if copied:
        # The copy is the source now: the iterable is not read again (a generator could not be).
        return spark.read.parquet(str(folder)), KEY, None
    if manifest is not None:
        raise UnstableIdentity(
            f"the checkpoint {checkpoint.path} belongs to a run over a DataFrame source, not an in-memory "
            "one: pass that source again, or use a new checkpoint directory"
        )
    count = write_records(source, folder, default_parallelism(spark))
    stats.copied = count
    log.info("copied %d in-memory records into %s", count, folder)
    return spark.read.parquet(str(folder)), KEY, {"folder": COPY_DIR, "records": count}


def open_run(
    spark: Any,
    checkpoint: Checkpoint,
    spec: IdentitySpec,
    copy: dict[str, Any] | None,
    name: str | None,
    stats: SourceStats,
) -> Manifest:
    """Start a new checkpoint, or check that this source is the one the checkpoint's run was reading."""
    manifest = checkpoint.manifest("source")
    if manifest is None:
        manifest = Manifest(
            "source",
            name or f"acker-source-{new_id():016x}",
            new_id(),
            source=SourceSection(spec.as_json(), memory_source=copy),
        )
        apply_pinned_conf(spark, spec)
        checkpoint.save_manifest(manifest)
        return manifest
    assert manifest.source is not None, "a source checkpoint has its section"
    recorded = IdentitySpec.from_json(manifest.source.identity)
    check_unchanged(recorded, spec)
    if name is not None and name != manifest.name:
        raise ValueError(f"the checkpoint belongs to spout {manifest.name!r}, not {name!r}")
    apply_pinned_conf(spark, recorded)
    stats.resumed = True
    return manifest


class SourceFrames:
    """The frames of a run's rounds over ``df``: each record tracked from the executor that reads it.

    ``spec`` is the run's identity, ``manifest`` its checkpoint manifest (spout
    name and salt); ``addresses``, ``security`` and ``client_options`` make the
    executors' clients.
    """

    def __init__(
        self,
        df: Any,
        spec: IdentitySpec,
        manifest: Manifest,
        checkpoint: Checkpoint,
        addresses: Any,
        security: Any,
        client_options: dict[str, Any],
    ) -> None:
        self.df = df
        self.spec = spec
        self.manifest = manifest
        self.checkpoint = checkpoint
        self.addresses = addresses
        self.security = security
        self.client_options = client_options

    def frame(self, round_no: int, filter_path: str, *, peek: bool = False) -> Any:
        """The frame of round ``round_no``: the records its filter keeps, each starting its tree where it is read."""
        source = self.spec.with_columns(self.df)
        reader = SourceReader(
            self.spec,
            self.manifest.salt,
            self.manifest.name,
            str(self.checkpoint.path),
            round_no,
            filter_path,
            self.addresses,
            self.security,
            self.client_options,
            peek=peek,
        )
        return map_in_arrow(source, reader, reader_schema(source.schema, peek=peek))  # fused with the job's bolts

    def identity_name(self) -> str:
        """What identifies the records, for an error that says it is not unique or not stable."""
        return f"key column {self.spec.column!r}" if self.spec.kind == "key" else f"the {self.spec.kind} identity"

    def unique(self, emissions: Emissions) -> Emissions:
        """A round's emissions, refused if records of the source share their identity (their trees would mix)."""
        if emissions.duplicates:
            raise DuplicateIdentity(
                f"{emissions.duplicates} records of the source share their identity with another record"
                f" ({self.identity_name()} is not unique): their trees would be mixed up. Use a unique key column."
            )
        return emissions

    def found_again(self, missing: int) -> None:
        """After a replay round read the whole source: raise if ``missing`` replayed records were not found again."""
        if missing:
            raise UnstableIdentity(
                f"{missing} failed records were not found again when the source was re-read: the source changed, "
                f"{self.identity_name()} is not stable across reads, or the job did not run over all of its "
                "input. The checkpoint keeps the run's state."
            )

    def read_dead(self, dead: DeadRecords) -> list[DeadLetterRow]:
        """Each dead record's ``(key, payload, reason, attempts, cause)``: its last attempt read again (a peek round)."""
        filter_path = write_filter(self.checkpoint.path, _PEEK_ROUND, RoundFilter("select", dead.idents, dead.attempts))
        rows = self.frame(_PEEK_ROUND, str(filter_path), peek=True).toArrow().to_pylist()
        idents = dead.idents.view(np.int64).tolist()
        reason_of = dict(zip(idents, dead.reasons.tolist()))
        cause_of = dict(zip(idents, dead.causes()))
        letters: list[DeadLetterRow] = []
        for row in rows:
            key, attempt, ident = row.pop(KEY_COLUMN), row.pop(ATTEMPT_COLUMN), row.pop(IDENT_COLUMN)
            letters.append((key, row, Outcome(reason_of[ident]), attempt, cause_of[ident]))
        if len(letters) != len(idents):
            log.warning("%d dead records were not found again in the source (changed?)", len(idents) - len(letters))
        return letters
