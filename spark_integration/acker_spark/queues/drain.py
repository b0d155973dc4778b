"""Draining a queue with SourcePipeline: bounded batches, each copied into the checkpoint, run, committed, then acked.

``SourcePipeline.run(queue_source, job)`` comes here. The checkpoint gets a
``queue/`` folder holding the drain's state (``drain.json``: the open batch),
the ledger of settled ids (:mod:`acker_spark.queues.settled`) and one
checkpoint per open batch. Each batch:

1. reads up to ``source.batch`` messages (a killed run's pending ones first);
   a message a finished batch already settled (its ack was lost) is acked
   again, or dead-lettered with its recorded cause, without processing it; a
   message the broker has delivered more than ``policy.max_attempts`` times
   (runs that died holding it) is dead-lettered;
2. copies the rest into the batch's checkpoint like an in-memory source, each
   record keyed by its broker id, and runs the job on it with a pipeline
   configured like the caller's: failed and timed-out trees are replayed from
   the copy under the replay policy, the output of the deliveries that ACKED
   is committed once, records past their last attempt are dead-lettered;
3. records the outcome in the ledger, then dead-letters (with the cause) and
   acks the messages at the broker, then closes the batch.

A message is therefore acked at the broker only after its rows are committed.
A driver killed at any point and run again on the same checkpoint resumes
the open batch from its copy (the broker's pending messages are not read
twice), and a batch killed before its copy was complete reads its messages
again from the broker, where they were still pending.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq

from ..budget import FailureBudget
from ..dead_letter import DeadLetter, DeadLetterStore
from ..executor_read.memory_source import COPY_DIR, KEY
from ..replay_policy import ReplayPolicy
from ..run_report import RunStats
from ..tracking.checkpoint import Checkpoint
from .contract import Message, QueueSource
from .settled import SettledLedger


class _Options(Protocol):
    """What the drain reads of a SourcePipeline's options."""

    @property
    def policy(self) -> ReplayPolicy:
        """The replay policy (``max_attempts``: deliveries before a message is dead-lettered)."""
        ...

    @property
    def dead_letters(self) -> DeadLetterStore | None:
        """The caller's dead-letter table."""
        ...

    @property
    def budget(self) -> FailureBudget | None:
        """The caller's failure budget."""
        ...


class SourcePipeline(Protocol):
    """What the drain uses of a SourcePipeline (a Protocol: the pipeline module imports this one)."""

    checkpoint: Checkpoint

    @property
    def options(self) -> _Options:
        """The pipeline's options."""
        ...

    def sibling(self, checkpoint: Path, dead_letters: DeadLetterStore, budget: FailureBudget | None) -> Any:
        """A pipeline configured like this one, with another checkpoint, dead-letter table and budget."""


__all__ = ["QUEUE_DIR", "QueueRunStats", "drain_queue"]

log = logging.getLogger(__name__)

QUEUE_DIR = "queue"
"""The drain's folder in the pipeline's checkpoint."""


@dataclasses.dataclass
class QueueRunStats(RunStats):
    """A drain's figures: the batches' run stats summed, and what the broker was told."""

    queue_batches: int = 0  # batches run (a resumed one included)
    acked_at_broker: int = 0  # messages acked at the broker after their output was committed
    dead_lettered_at_broker: int = 0  # messages moved to the broker's dead-letter place with their cause
    already_settled: int = 0  # redeliveries of messages a finished batch settled: acked again, not processed


@dataclasses.dataclass
class _DrainState:
    """``drain.json``: the batch being processed (None between batches) and the next batch's number."""

    path: Path
    open: int | None = None
    next: int = 1

    @classmethod
    def load(cls, root: Path) -> _DrainState:
        path = root / "drain.json"
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path, data["open"], data["next"])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump({"open": self.open, "next": self.next}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


def drain_queue(
    pipeline: SourcePipeline, source: QueueSource, job: Callable[[Any], object], *, max_batches: int | None = None
) -> QueueRunStats:
    """Process what is on ``source`` now, batch by batch, until a read finds nothing (or ``max_batches`` ran)."""
    root = pipeline.checkpoint.path / QUEUE_DIR
    state = _DrainState.load(root)
    ledger = SettledLedger(root / "settled")
    totals = QueueRunStats()
    _drop_closed_batches(root, state.open)
    log.info("draining %s in batches of up to %d messages (checkpoint %s)", source.describe(), source.batch, root)
    while max_batches is None or totals.queue_batches < max_batches:
        if state.open is not None and not _copied(_batch_folder(root, state.open)):
            # Killed before the batch's copy was whole: its messages are still pending at the broker.
            shutil.rmtree(_batch_folder(root, state.open), ignore_errors=True)
            state.open = None
            state.save()
        records: list[tuple[str, Any]] = []
        if state.open is None:
            messages = source.read(source.batch)
            if not messages:
                break
            fresh = _fresh(source, ledger, messages, pipeline.options.policy.max_attempts, totals)
            if not fresh:
                continue
            state.open, state.next = state.next, state.next + 1
            state.save()  # before the copy: a driver killed from here on resumes this batch
            records = [(m.id, m.payload) for m in fresh]
        else:
            totals.resumed = True  # the open batch's copy is the batch: the broker is not read for it
        _run_batch(pipeline, source, job, root, state, ledger, records, totals)
    return totals


def _run_batch(
    pipeline: SourcePipeline,
    source: QueueSource,
    job: Callable[[Any], object],
    root: Path,
    state: _DrainState,
    ledger: SettledLedger,
    records: list[tuple[str, Any]],
    totals: QueueRunStats,
) -> None:
    """Run the open batch to its end, record it, tell the broker, close it."""
    assert state.open is not None
    batch = state.open
    folder = _batch_folder(root, batch)
    folder.mkdir(parents=True, exist_ok=True)
    store = DeadLetterStore(folder / "dead_letters.sqlite")
    try:
        # The caller's failure budget holds for each batch's run.
        batch_pipeline = pipeline.sibling(folder, store, pipeline.options.budget)
        stats = batch_pipeline.run(records, job)
    except BaseException:
        if records and not _copied(folder):
            # Refused before its copy was made (values of mixed types, ...): nothing ran, hand the messages back.
            source.release([key for key, _ in records])
            shutil.rmtree(folder, ignore_errors=True)
            state.open = None
            state.save()
        raise
    _add(totals, stats)
    totals.queue_batches += 1
    keys = pq.read_table(folder / COPY_DIR, columns=[KEY]).column(KEY).to_pylist()
    letters = store.all()
    dead = {letter.key: _cause(letter) for letter in letters}
    acked = [key for key in keys if key not in dead]
    ledger.record(batch, acked, dead)  # durable before the broker hears: a lost ack is recognised later
    if pipeline.options.dead_letters is not None and letters:
        pipeline.options.dead_letters.add_letters(letters)
    totals.dead_lettered_at_broker += source.dead_letter(sorted(dead.items()))
    totals.acked_at_broker += source.ack(acked)
    log.info("batch %d: %d messages acked at the broker, %d dead-lettered", batch, len(acked), len(dead))
    state.open = None
    state.save()
    shutil.rmtree(folder, ignore_errors=True)  # the ledger keeps what a redelivery needs


def _fresh(
    source: QueueSource, ledger: SettledLedger, messages: list[Message], max_attempts: int, totals: QueueRunStats
) -> list[Message]:
    """The messages to process; those settled before are settled again, those delivered too often dead-lettered."""
    settled = [m for m in messages if m.id in ledger]
    if settled:
        again = [m.id for m in settled if ledger.cause(m.id) is None]
        dead = [(m.id, ledger.cause(m.id) or "") for m in settled if ledger.cause(m.id) is not None]
        totals.acked_at_broker += source.ack(again)
        totals.dead_lettered_at_broker += source.dead_letter(dead)
        totals.already_settled += len(settled)
        log.info("%d redelivered messages were settled by an earlier batch: settled again", len(settled))
    worn = [
        (m.id, f"LOST: delivered {m.deliveries} times without finishing (runs stopped holding it)")
        for m in messages
        if m.id not in ledger and m.deliveries > max_attempts
    ]
    if worn:
        totals.dead_lettered_at_broker += source.dead_letter(worn)
    skip = {message_id for message_id, _ in worn}
    return [m for m in messages if m.id not in ledger and m.id not in skip]


def _cause(letter: DeadLetter) -> str:
    """The cause the broker's dead-letter place gets: the outcome, the attempts, and why when known."""
    why = f": {letter.cause}" if letter.cause else ""
    return f"{letter.reason.name} after {letter.attempts} attempts{why}"


def _add(totals: QueueRunStats, stats: RunStats) -> None:
    """Add one batch's run stats to the drain's."""
    for field in dataclasses.fields(RunStats):
        value = getattr(stats, field.name)
        if isinstance(value, bool):
            setattr(totals, field.name, getattr(totals, field.name) or value)
        elif isinstance(value, int):
            setattr(totals, field.name, getattr(totals, field.name) + value)
        elif isinstance(value, dict):
            merged = getattr(totals, field.name)
            for name, count in value.items():
                merged[name] = merged.get(name, 0) + count


def _batch_folder(root: Path, batch: int) -> Path:
    return root / f"batch-{batch:06d}"


def _copied(folder: Path) -> bool:
    """True once the batch's pipeline saved its manifest (its copy is whole from then on)."""
    return (folder / "manifest.json").exists() and (folder / COPY_DIR).is_dir()


def _drop_closed_batches(root: Path, open_batch: int | None) -> None:
    """Remove batch folders a killed driver left after closing them (their ledger entries are written)."""
    for folder in root.glob("batch-*") if root.exists() else []:
        if folder.is_dir() and folder.name != (f"batch-{open_batch:06d}" if open_batch is not None else None):
            shutil.rmtree(folder, ignore_errors=True)
