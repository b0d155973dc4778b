"""Planning side of the ``acker_spout`` stream: offsets are source positions, outcomes settled by root in bulk.

Spark runs a stream reader's planning calls in a Python process of its own.
:class:`StreamPlanner` is what they drive; it never reads a record (except
the payload of a record it dead-letters). Its state lives in the checkpoint
directory (the ``checkpoint`` option), laid out as :mod:`acker_spark.tracking.checkpoint`
says, with the stream's file registry and replay plans.

An offset is ``{"round", "file", "byte"}``: the micro-batch's number and the
source position it reads up to (file number in the registry, byte in it). A
micro-batch reads the bytes between two positions, cut into
:class:`~acker_spark.streaming.stream_source.ChunkPartition`\\ s, plus the replays its
plan names (:class:`~acker_spark.streaming.stream_source.ReplayPartition`\\ s). Both are
a function of the offsets and the checkpoint, so a batch Spark runs again
after a restart reads the same records, less the ones it had started.

After each micro-batch the planner reads the batch's emission log into its
:class:`~acker_spark.tracking.book.ReplayBook`, which settles the outcomes its
:class:`~acker_spark.tracking.outcome_feed.OutcomeFeed` journaled. Failed, timed-out
and lost deliveries wait their ``ReplayPolicy`` backoff and go into a later
batch's plan; after ``max_attempts`` the record is read once more here and
written to the dead-letter store. The roots whose acks a bolt could not
deliver come from the query's ``foreachBatch`` function
(:func:`record_commit_errors`), through the checkpoint's undelivered journal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from acker_client import ClusterClient, new_id
from acker_client.pending import cluster_backstop
from acker_protocol.wire import Outcome

from ..dead_letter import DeadLetterStore
from ..replay_policy import ReplayPolicy
from ..tracking.book import DeadLetterRow, DeadRecords, ReplayBook
from ..tracking.checkpoint import Checkpoint, Manifest, StreamSection, write_json_atomically
from ..tracking.emission_log import RoundFilter, read_round, write_filter
from ..tracking.record_table import ACKED, DEAD, FAILED, PENDING, RecordTable
from .stream_options import StreamOptions
from .stream_source import (
    ChunkPartition,
    ReplayPartition,
    RoundContext,
    SourceFile,
    read_lines_at,
    split_idents,
)

__all__ = ["StreamPlanner", "StreamProgress", "stream_progress"]

log = logging.getLogger(__name__)

_UNUSED = np.zeros(0, dtype=np.uint64)
_REPLAY_ROWS = 50_000  # replays per partition
_WAIT_LIMIT = 0.25  # seconds an AvailableNow planner waits for outcomes between looks at its book


def initial_offset() -> dict[str, int]:
    """Before the first micro-batch: round 0, the start of the first file."""
    return {"round": 0, "file": 0, "byte": 0}


class StreamPlanner:
    """The stream's state in the planning process, rebuilt from the checkpoint when it starts."""

    def __init__(
        self,
        options: StreamOptions,
        cluster: ClusterClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        journal_interval: float = 0.25,
    ) -> None:
        self.options = options
        self.cluster = cluster
        self.clock = clock
        self.directory = Path(options.path).absolute()
        if not self.directory.is_dir():
            raise NotADirectoryError(f"stream source directory {self.directory} does not exist or is not a directory")
        self.checkpoint = Checkpoint(options.checkpoint)
        self.policy = options.policy
        self.budget = options.budget
        self.dead_letters = DeadLetterStore(options.database)
        self.files: list[SourceFile] = []
        self._names: set[str] = set()
        self._frozen: int | None = None  # AvailableNow: the number of files to read
        self._read_upto = 0  # rounds whose emission log is in the table
        self._scheduled: dict[int, np.ndarray] = {}  # round -> roots whose replay it reads
        self._manifest = self._open_manifest()
        self.spout = self._manifest.name
        self.salt = self._manifest.salt
        self.book = ReplayBook(self.checkpoint, self.salt, self.policy, clock)
        self._load_files()
        self.backstop = options.spout_timeout if options.spout_timeout is not None else cluster_backstop(cluster)
        from ..tracking.outcome_feed import OutcomeFeed

        self.feed = OutcomeFeed(cluster, self.spout, self.checkpoint, journal_interval).start()
        self.book.attach(self.feed)
        try:
            self._restore()
        except BaseException:
            self.feed.close()
            raise

    # -- opening ------------------------------------------------------------------------------

    def _open_manifest(self) -> Manifest:
        """The checkpoint's manifest, checked against this stream's directory and name; a new one if none."""
        manifest = self.checkpoint.manifest("stream")
        if manifest is not None:
            assert manifest.stream is not None, "a stream checkpoint has its section"
            if manifest.stream.directory != str(self.directory):
                raise ValueError(
                    f"the checkpoint {self.checkpoint.path} belongs to a stream of {manifest.stream.directory}, not"
                    f" {self.directory}: use that directory, or a new checkpoint"
                )
            if self.options.name is not None and self.options.name != manifest.name:
                raise ValueError(f"the checkpoint belongs to spout {manifest.name!r}, not {self.options.name!r}")
            return manifest
        manifest = Manifest(
            "stream",
            self.options.name or f"acker-stream-{new_id():016x}",
            new_id(),
            stream=StreamSection(str(self.directory)),
        )
        self.checkpoint.save_manifest(manifest)
        return manifest

    def _load_files(self) -> None:
        path = self.checkpoint.path / "stream" / "files.json"
        if path.exists():
            for index, (name, size, mtime) in enumerate(json.loads(path.read_text())):
                self.files.append(SourceFile(index, name, int(size), int(mtime)))
                self._names.add(name)

    @property
    def table(self) -> RecordTable:
        """The book's record table (what each started delivery is now)."""
        return self.book.table

    def _restore(self) -> None:
        """Rebuild the book from the checkpoint; fail the trees an earlier planner's query left in flight."""
        rounds = _rounds_on_disk(self.checkpoint.path)
        self.book.restore(rounds)
        # The last batch may run again (Spark re-runs a batch the query did not finish): read it again then.
        self._read_upto = max(rounds, default=1) - 1
        self.book.fail_left_in_flight(self.cluster, rounds, self.backstop, "query")

    # -- planning calls -----------------------------------------------------------------------

    def freeze(self) -> None:
        """``Trigger.AvailableNow``: admit the files present now, and no later ones."""
        self._register_new()
        self._frozen = len(self.files)

    def latest(
        self,
        start: dict[str, int],
        *,
        max_files: int | None = None,
        max_bytes: int | None = None,
        wait: bool = False,
    ) -> dict[str, int]:
        """The next micro-batch's end offset: due replays, and new bytes while fewer than ``max_pending`` are in flight.

        With ``wait`` (AvailableNow), an unchanged offset means the stream is done:
        wait for outstanding outcomes and replays rather than answer it early.
        """
        done = int(start["round"])
        if done < self._read_upto:
            raise ValueError(
                f"the checkpoint {self.checkpoint.path} holds micro-batches up to {self._read_upto + 1}, but the query"
                f" starts after micro-batch {done}: give each query its own checkpoint option (and keep it with the"
                " query's checkpointLocation)"
            )
        while True:
            self._catch_up(done)
            end = self._plan(start, max_files, max_bytes)
            if end != start or not wait or not self.busy():
                return end
            self.feed.wait(self.book.wait_time(_WAIT_LIMIT))

    def partitions(
        self, start: dict[str, int], end: dict[str, int], addresses: Sequence[str], client_options: dict[str, Any]
    ) -> list[Any]:
        """The partitions of the micro-batch ``(start, end]``: byte ranges of new data, then replays by identity."""
        round_no = int(end["round"])
        if round_no == int(start["round"]):
            return []
        ctx = RoundContext(
            str(self.directory),
            str(self.checkpoint.path),
            self.salt,
            self.spout,
            round_no,
            tuple(addresses),
            self.options.security,
            dict(client_options),
        )
        started = read_round(self.checkpoint.path, round_no)  # a batch run before (a restarted query)
        skip = None
        if len(started.idents):
            ran = RoundFilter("skip", started.idents, np.zeros(len(started.idents), dtype=np.uint16))
            skip = str(write_filter(self.checkpoint.path, round_no, ran))
            log.info("micro-batch %d runs again: %d records it started are not read again", round_no, len(ran.idents))
        parts: list[Any] = []
        for file, lo, hi in self._ranges(start, end):
            parts.append(ChunkPartition(len(parts), ctx, file, lo, hi, skip))
        idents, attempts = self._plan_replays(round_no)
        if len(started.idents):
            again = ~np.isin(idents, started.idents)
            idents, attempts = idents[again], attempts[again]
        files, offsets = split_idents(idents)
        order = np.lexsort((offsets, files))
        files, offsets, attempts = files[order], offsets[order], attempts[order]
        for index in np.unique(files).tolist():
            sel = np.flatnonzero(files == index)
            for lo in range(0, len(sel), _REPLAY_ROWS):
                part = sel[lo : lo + _REPLAY_ROWS]
                parts.append(ReplayPartition(len(parts), ctx, self.files[index], offsets[part], attempts[part]))
        return parts

    def busy(self) -> bool:
        """True while a record is in flight, waiting for its replay, or its replay is planned but not run."""
        return self.book.busy() or bool(self._scheduled)

    def close(self) -> None:
        """Stop the outcome streams (journaling what arrived)."""
        self.feed.close()

    # -- planning ------------------------------------------------------------------------------

    def _plan(self, start: dict[str, int], max_files: int | None, max_bytes: int | None) -> dict[str, int]:
        round_no = int(start["round"]) + 1
        due = self.book.due_replays()
        position = (int(start["file"]), int(start["byte"]))
        end_position = position
        if self.table.count(PENDING) < self.options.max_pending:
            self._register_new()
            end_position = self._advance(position, max_files, max_bytes)
        if not len(due) and end_position == position:
            return start
        idents, attempts = self.table.idents[due], self.table.attempts[due] + 1
        self._write_plan(round_no, idents, attempts)
        self._scheduled[round_no] = self.table.roots[due]
        self.table.due[due] = np.inf  # planned: not due again unless the batch does not run
        return {"round": round_no, "file": end_position[0], "byte": end_position[1]}

    def _advance(self, position: tuple[int, int], max_files: int | None, max_bytes: int | None) -> tuple[int, int]:
        """The position ``max_bytes_per_batch`` bytes (at least one byte, at most ``max_files`` files) further."""
        file, byte = position
        limit = len(self.files) if self._frozen is None else min(self._frozen, len(self.files))
        if max_files is not None:
            limit = min(limit, file + max(1, max_files))
        budget = min(self.options.max_bytes_per_batch, max_bytes or self.options.max_bytes_per_batch)
        while file < limit and budget > 0:
            take = min(self.files[file].size - byte, budget)
            byte, budget = byte + take, budget - take
            if byte >= self.files[file].size:
                file, byte = file + 1, 0
        while file < limit and self.files[file].size == 0:
            file += 1  # an empty file ends here too
        return file, byte

    def _ranges(self, start: dict[str, int], end: dict[str, int]) -> list[tuple[SourceFile, int, int]]:
        """The byte ranges between two positions, cut into pieces of at most ``split_bytes``."""
        segments = []
        file, byte = int(start["file"]), int(start["byte"])
        stop_file, stop_byte = int(end["file"]), int(end["byte"])
        while (file, byte) < (stop_file, stop_byte):
            hi = self.files[file].size if file < stop_file else stop_byte
            if hi > byte:
                segments.append((self.files[file], byte, hi))
            file, byte = file + 1, 0
        total = sum(hi - lo for _, lo, hi in segments)
        piece = max(1, min(self.options.split_bytes, math.ceil(total / max(1, self.options.partitions))))
        return [(f, at, min(at + piece, hi)) for f, lo, hi in segments for at in range(lo, hi, piece)]

    def _register_new(self) -> None:
        """Add the directory's files not admitted yet to the registry (sorted by path), durably."""
        if self._frozen is not None:
            return
        new: list[SourceFile] = []
        for path in sorted(self.directory.rglob("*")):
            rel = path.relative_to(self.directory).as_posix()
            if rel in self._names or any(part.startswith(".") for part in rel.split("/")) or not path.is_file():
                continue
            stat = path.stat()
            new.append(SourceFile(len(self.files) + len(new), rel, stat.st_size, stat.st_mtime_ns))
        if not new:
            return
        self.files.extend(new)
        self._names.update(f.name for f in new)
        folder = self.checkpoint.path / "stream"
        folder.mkdir(exist_ok=True)
        write_json_atomically(folder / "files.json", [f.as_json() for f in self.files])  # before an offset names them

    def _write_plan(self, round_no: int, idents: np.ndarray, attempts: np.ndarray) -> None:
        folder = self.checkpoint.path / "stream" / "plans"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"r{round_no:05d}.npz"
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, idents=idents, attempts=attempts.astype(np.uint16))
        os.replace(tmp, path)

    def _plan_replays(self, round_no: int) -> tuple[np.ndarray, np.ndarray]:
        path = self.checkpoint.path / "stream" / "plans" / f"r{round_no:05d}.npz"
        if not path.exists():
            return _UNUSED, np.zeros(0, dtype=np.uint16)
        with np.load(path) as data:
            return data["idents"], data["attempts"]

    # -- settling ------------------------------------------------------------------------------

    def _catch_up(self, done_round: int) -> None:
        """Everything up to micro-batch ``done_round`` has run: read its emissions, settle, expire, dead-letter."""
        for round_no in [r for r in self._scheduled if r > done_round]:
            # Planned, but Spark did not run it (the offset was not used): due again.
            self.table.due[self.table.in_state(self._scheduled.pop(round_no), FAILED)] = self.clock()
        for round_no in range(self._read_upto + 1, done_round + 1):
            self.book.add_round(read_round(self.checkpoint.path, round_no), round_no)
            self.book.start_deadline(round_no, self.backstop)
            missing = self.table.in_state(self._scheduled.pop(round_no, _UNUSED), FAILED)
            if len(missing):
                log.warning("%d replays of micro-batch %d were not read: planned again", len(missing), round_no)
                self.table.due[missing] = self.clock()
        self._read_upto = max(self._read_upto, done_round)
        self.book.reload_undelivered()
        # Every batch's emission log is read before the outcomes are taken, so an unknown root is
        # a tree of a settled (compacted) entry, or one an init re-created after its tree completed.
        self.book.settle_feed(keep_strays=False)
        self.book.expire()
        self.book.write_dead_letters(self.dead_letters, self._dead_payloads)
        if self.budget is not None:  # the query fails with the error naming the top causes
            error = self.book.budget_error(self.budget)
            if error is not None:
                raise error
        self.book.compact()

    def _dead_payloads(self, dead: DeadRecords) -> list[DeadLetterRow]:
        """Each dead record's ``(file@byte, line, reason, attempts)``: its line read again."""
        letters: list[DeadLetterRow] = []
        files, offsets = split_idents(dead.idents)
        for i in range(len(dead.idents)):
            file = self.files[int(files[i])]
            try:
                (value,) = read_lines_at(self.directory / file.name, offsets[i : i + 1])
            except OSError as err:
                value = None
                log.warning("dead letter %s@%d: its record could not be read again: %s", file.name, offsets[i], err)
            reason = Outcome(int(dead.reasons[i]))
            letters.append((f"{file.name}@{int(offsets[i])}", value, reason, int(dead.attempts[i])))
        return letters


def _rounds_on_disk(checkpoint: Path) -> list[int]:
    folder = checkpoint / "emissions"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := re.fullmatch(r"r(\d+)", name)))


@dataclass(frozen=True)
class StreamProgress:
    """Where a stream's records stand, from its checkpoint: record keys (``file@byte``) by state."""

    acked: set[str]
    dead: set[str]
    waiting: set[str]  # in flight or waiting for a replay
    deliveries: dict[str, int]  # key -> deliveries started

    @property
    def settled(self) -> set[str]:
        """Keys acked or dead-lettered."""
        return self.acked | self.dead


def stream_progress(checkpoint: str | Path) -> StreamProgress:
    """Read a stream's checkpoint (from any process) and say which records are settled.

    One key per record; the table is rebuilt from the emission logs and the
    outcome journal, so this costs a read of the whole checkpoint.
    """
    cp = Checkpoint(checkpoint)
    manifest = cp.manifest("stream")
    if manifest is None:
        raise FileNotFoundError(f"{cp.path} holds no stream's checkpoint (no manifest.json)")
    names = [name for name, _, _ in json.loads((cp.path / "stream" / "files.json").read_text())]
    book = ReplayBook(cp, manifest.salt, ReplayPolicy(), time.monotonic)  # read only: policy and clock unused
    book.restore(_rounds_on_disk(cp.path))
    table = book.table
    files, offsets = split_idents(table.idents)
    keys = np.array([f"{names[f]}@{o}" for f, o in zip(files.tolist(), offsets.tolist())], dtype=object)
    acked = set(keys[table.state == ACKED].tolist())
    dead = set(keys[table.state == DEAD].tolist()) - acked
    deliveries: dict[str, int] = {}
    for key in keys.tolist():
        deliveries[key] = deliveries.get(key, 0) + 1
    return StreamProgress(acked, dead, set(deliveries) - acked - dead, deliveries)
