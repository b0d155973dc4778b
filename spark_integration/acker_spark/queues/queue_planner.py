"""Planning side of the ``acker_queue`` stream: the broker connection, the spool, and acks after the output commit.

:class:`QueuePlanner` is the ``acker_spout`` planner
(:class:`~acker_spark.streaming.stream_planner.StreamPlanner`) over a
directory it fills itself: the **spool**, ``<checkpoint>/queue/spool/``. It
lives in Spark's planning process, which holds the broker connection for the
query's life (a RabbitMQ delivery tag belongs to the channel that received
it, so the process that reads a message must be the one that acks it).

* **Pull.** Before it plans a micro-batch, the planner reads messages from the
  broker (while fewer than ``max_held`` are held unsettled) and writes them to
  a new spool file, one JSON line ``[id, payload]`` each, put in place whole
  (written aside, fsynced, renamed). The stream's offsets are positions in the
  spool files, so a micro-batch Spark runs again after a restart reads the
  same messages, and executors read them from the spool, not from the broker.
* **Trees.** Executors start one tree per spooled line (identity: spool file
  and byte, as for ``acker_spout``); the stream's rows carry the broker id as
  ``key`` and the payload as ``value``. Failed, timed-out and lost deliveries
  are replayed from the spool under the ReplayPolicy; after the last attempt
  the message is a dead letter (the ``database`` store, keyed by broker id,
  with its cause).
* **Settle at the broker.** A message is acked once its ACKED tree's rows are
  committed: the planner reads :class:`~acker_spark.output.stream.StreamOutput`'s
  commit log in the same checkpoint (``output/commits/``) and takes the roots
  of commits whose state is ``done``. Dead letters are moved to the broker's
  dead-letter place with their cause. Both are first recorded in the ledger of
  settled ids (:mod:`acker_spark.queues.settled`), so a redelivery of a
  message whose ack was lost (a killed planner, a closed channel) is acked
  again without being processed.

A message that is ACKED but not yet committed makes the planner plan an empty
micro-batch, so the query's ``foreachBatch`` runs ``StreamOutput.write`` and
commits it: a quiet queue, and an ``availableNow`` query's end, do not leave
messages unacknowledged.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from acker_client import ClusterClient
from acker_client.columns import distinct

from ..output.commits import COMMITS_DIR
from ..output.stream import journal_outcomes
from ..streaming.stream_planner import StreamPlanner
from ..streaming.stream_source import split_idents
from ..tracking.book import DeadRecords
from ..tracking.emission_log import read_round
from .contract import Message, QueueSource
from .drain import QUEUE_DIR, QueueRunStats, _cause, _fresh
from .settled import SettledLedger

__all__ = ["SPOOL_DIR", "QueuePlanner", "committed_roots", "spool_line", "spool_record"]

log = logging.getLogger(__name__)

SPOOL_DIR = f"{QUEUE_DIR}/spool"
"""The spool's folder in the stream's checkpoint (the ``acker_spout`` directory the planner reads)."""

_EMPTY = np.zeros(0, dtype=np.uint64)
_IDLE_ROUNDS = 3  # empty micro-batches in a row that commit nothing before the planner stops asking for them


def spool_line(message: Message) -> bytes:
    """A message's spool line: ``[id, payload]`` as JSON (ASCII, so a payload's newlines cannot cut it)."""
    if not isinstance(message.payload, str):
        raise TypeError(
            f"message {message.id}: the acker_queue stream takes text payloads (the source's decode=True), got"
            f" {type(message.payload).__name__}"
        )
    return json.dumps([message.id, message.payload]).encode() + b"\n"


def spool_record(line: str) -> tuple[str, str]:
    """``(broker id, payload)`` of a spool line."""
    message_id, payload = json.loads(line)
    return str(message_id), payload


def committed_roots(checkpoint: Path) -> np.ndarray:
    """The roots of every *done* commit in the checkpoint's output commit log (sorted).

    A decided commit is left out on purpose: its rows are not published yet,
    and a message is acked at its broker only once they are.
    """
    folder = checkpoint / COMMITS_DIR
    parts = []
    for path in sorted(folder.glob("c*.json")) if folder.is_dir() else []:
        if json.loads(path.read_text()).get("state") == "done":
            parts.append(np.load(path.with_suffix(".npz"))["roots"])
    return distinct(np.concatenate(parts)) if parts else _EMPTY


class QueuePlanner(StreamPlanner):
    """The ``acker_queue`` stream's planner: a StreamPlanner over its spool, holding the broker connection.

    ``options`` are the stream's (``path`` is the spool folder),
    ``source`` the broker (opened by the caller, closed by :meth:`close`),
    ``max_held`` the most messages held unsettled (read, not yet acked or
    dead-lettered at the broker), ``max_read`` the most read per micro-batch.
    """

    def __init__(
        self,
        options: Any,
        cluster: ClusterClient,
        source: QueueSource,
        *,
        max_held: int,
        max_read: int,
        clock: Callable[[], float] = time.monotonic,
        journal_interval: float = 0.25,
    ) -> None:
        self.source = source
        self.max_held, self.max_read = max_held, max_read
        self.spool = Path(options.checkpoint).absolute() / SPOOL_DIR
        self.spool.mkdir(parents=True, exist_ok=True)  # before StreamPlanner checks its directory
        self.ledger = SettledLedger(self.spool.parent / "settled")
        self._ledger_batch = 1 + max(
            (int(p.stem.split("-")[1]) for p in self.ledger.folder.glob("batch-*.json")), default=0
        )
        self.stats = QueueRunStats()  # what the broker was told (the drain's counters)
        self._ids: dict[int, dict[int, str]] = {}  # spool file number -> byte offset -> broker id
        self._held: set[str] = set()  # spooled ids not yet settled at the broker
        self._roots, self._idents = _EMPTY, _EMPTY  # trees started for held messages
        self._seen = 0  # rounds whose emission log is in _roots
        self._idle = 0  # empty micro-batches in a row that committed nothing
        self._drained = False  # availableNow: a read found nothing new
        super().__init__(options, cluster, clock=clock, journal_interval=journal_interval)
        # A spool file a killed planner renamed in but did not admit yet: admit it, so its messages count
        # as held (a pull would otherwise spool their redeliveries a second time).
        StreamPlanner._register_new(self)
        for file in self.files:  # what a planner before this one spooled
            self._held.update(mid for mid in self._index(file.index).values() if mid not in self.ledger)
        self._seen = self._read_upto  # the rounds the book read back; _catch_up reads the later ones
        for round_no in range(1, self._seen + 1):
            self._add_round(round_no)

    # -- the spool ------------------------------------------------------------------------------

    def _index(self, file_index: int) -> dict[int, str]:
        """Byte offset -> broker id of a spool file's lines (read once per planner)."""
        index = self._ids.get(file_index)
        if index is None:
            index, at = {}, 0
            with open(self.spool / self.files[file_index].name, "rb") as f:
                for line in f:
                    index[at] = spool_record(line.decode())[0]
                    at += len(line)
            self._ids[file_index] = index
        return index

    def _message_ids(self, idents: np.ndarray) -> list[str]:
        files, offsets = split_idents(idents)
        return [self._index(f)[o] for f, o in zip(files.tolist(), offsets.tolist())]

    def _room(self) -> int:
        """How many messages the next pull may take: ``max_read``, within ``max_held`` held unsettled."""
        return min(self.max_read, self.max_held - len(self._held))

    def _pull(self) -> int:
        """Read what the broker has (within the room), settle what the ledger knows, spool the rest.

        Returns how many messages the read brought that were new to it (0: none is waiting).
        """
        room = self._room()
        if room <= 0:
            return 0
        # A Redis read returns this consumer's pending entries first: ask for them plus the room.
        messages = self.source.read(room + (len(self._held) if self.source.rereads_held else 0))
        fresh = [m for m in messages if m.id not in self._held]  # redeliveries of spooled messages are skipped
        # A Redis read returns the held entries every time: only the others say the queue had more. A RabbitMQ
        # read returns a held message only once (redelivered after a restart, held again now): it counts.
        brought = len(fresh) if self.source.rereads_held else len(messages)
        fresh = _fresh(self.source, self.ledger, fresh, self.policy.max_attempts, self.stats)
        if len(fresh) > room:
            # More than the room came (a Redis read claimed other consumers' idle entries beyond the ones
            # it held): hand the rest back for a later pull.
            self.source.release([m.id for m in fresh[room:]])
            fresh = fresh[:room]
        if not fresh:
            return brought
        names = sorted(p.name for p in self.spool.glob("*.jsonl"))
        number = int(names[-1].split(".")[0]) + 1 if names else 1
        path = self.spool / f"{number:08d}.jsonl"
        tmp = self.spool / f".{path.name}.tmp"  # a dot name: StreamPlanner does not admit it
        with open(tmp, "wb") as out:
            for message in fresh:
                out.write(spool_line(message))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # whole or absent: the offsets name bytes of it
        self._held.update(m.id for m in fresh)
        log.info("spooled %d messages from %s to %s", len(fresh), self.source.describe(), path.name)
        return brought

    def _pull_available(self) -> None:
        """``availableNow``: pull while there is room, until a read finds nothing new (the queue is drained)."""
        while not self._drained and self._room() > 0:
            if not self._pull():
                self._drained = True

    # -- StreamPlanner's hooks ----------------------------------------------------------------------

    def _register_new(self) -> None:
        """Pull from the broker into a new spool file, then admit it (StreamPlanner calls this while not full)."""
        if self._frozen is None:
            self._pull()
            super()._register_new()
            return
        # availableNow: StreamPlanner reads the files admitted when it froze; here the spool grows until the
        # queue is drained (max_held may hold less than the queue has), so admit the new files and freeze again.
        self._pull_available()
        self._frozen = None
        super()._register_new()
        self._frozen = len(self.files)

    def freeze(self) -> None:
        """``Trigger.AvailableNow``: read until the queue is found empty (within ``max_held``), then no more."""
        self._pull_available()
        super().freeze()

    def _plan(self, start: dict[str, int], max_files: int | None, max_bytes: int | None) -> dict[str, int]:
        end = super()._plan(start, max_files, max_bytes)
        if end != start:
            self._idle = 0
            return end
        if self._idle < _IDLE_ROUNDS and self._awaiting_commit():
            # Nothing to read, but ACKED trees wait for a commit: an empty micro-batch runs foreachBatch,
            # whose StreamOutput.write commits them; the next planning call acks them at the broker.
            self._idle += 1
            if self._idle == _IDLE_ROUNDS:
                log.warning(
                    "%d empty micro-batches committed no ACKED tree of %s: their messages stay unacknowledged at"
                    " the broker. Does foreachBatch write through StreamOutput with the checkpoint %s?",
                    _IDLE_ROUNDS,
                    self.source.describe(),
                    self.checkpoint.path,
                )
            return {**start, "round": int(start["round"]) + 1}
        return end

    def busy(self) -> bool:
        """Also busy while a held message waits for its commit, or the queue is not drained yet (availableNow)."""
        if self._frozen is not None and not self._drained and self._room() > 0:
            return True  # the next plan pulls again
        return super().busy() or (self._idle < _IDLE_ROUNDS and self._awaiting_commit())

    def _catch_up(self, done_round: int) -> None:
        """Settle the micro-batches up to ``done_round`` (StreamPlanner), then tell the broker what is final."""
        super()._catch_up(done_round)
        for round_no in range(self._seen + 1, done_round + 1):
            self._add_round(round_no)
        self._seen = max(self._seen, done_round)
        self._settle_at_broker()

    def _add_round(self, round_no: int) -> None:
        """Keep the trees micro-batch ``round_no`` started for held messages (the others are settled already)."""
        emitted = read_round(self.checkpoint.path, round_no)
        if not len(emitted.roots):
            return
        keep = np.array([mid in self._held for mid in self._message_ids(emitted.idents)], dtype=bool)
        self._roots = np.concatenate((self._roots, emitted.roots[keep]))
        self._idents = np.concatenate((self._idents, emitted.idents[keep]))

    def _dead_payloads(self, dead: DeadRecords) -> list[Any]:
        """Dead letters keyed by broker id, with the payload and the cause an executor gave (if any)."""
        rows = []
        causes = dead.causes()
        for i, (_, line, reason, attempts) in enumerate(super()._dead_payloads(dead)):
            message_id, payload = spool_record(line) if line is not None else (None, None)
            if message_id is None:  # the spool line could not be read: name the message by its identity
                message_id = self._message_ids(dead.idents[i : i + 1])[0]
            rows.append((message_id, payload, reason, attempts, causes[i]))
        return rows

    # -- the broker ----------------------------------------------------------------------------------

    def _settle_at_broker(self) -> None:
        """Ack the held messages whose rows are committed and dead-letter the dead ones: ledger first, then broker."""
        if not self._held:
            return
        committed = self._idents[np.isin(self._roots, committed_roots(self.checkpoint.path))]
        acked = {mid for mid in self._message_ids(committed) if mid in self._held}
        # Which messages are dead, by this stream's own dead journal: the dead-letter table may be shared with
        # other streams, whose letters could carry the same broker ids. The table gives the cause.
        dead_idents = self.checkpoint.read_dead()
        dead_idents = dead_idents[np.isin(dead_idents, self._idents)]
        dead: dict[str, str] = {}
        if len(dead_idents):
            dead = dict.fromkeys(
                (mid for mid in self._message_ids(dead_idents) if mid in self._held and mid not in acked),
                "DEAD after its last attempt",
            )
            for letter in self.dead_letters.all() if self.dead_letters is not None and dead else []:
                if letter.key in dead:
                    dead[letter.key] = _cause(letter)
        if not acked and not dead:
            return
        self.ledger.record(self._ledger_batch, acked, dead)  # durable before the broker hears of it
        self._ledger_batch += 1
        self.stats.dead_lettered_at_broker += self.source.dead_letter(sorted(dead.items()))
        self.stats.acked_at_broker += self.source.ack(sorted(acked))
        done = acked | set(dead)
        self._held -= done
        self._idle = 0
        keep = np.array([mid not in done for mid in self._message_ids(self._idents)], dtype=bool)
        self._roots, self._idents = self._roots[keep], self._idents[keep]
        log.info(
            "%s: %d messages acked after their commit, %d dead-lettered", self.source.describe(), len(acked), len(dead)
        )

    def _awaiting_commit(self) -> bool:
        """True if a held message's tree ACKED and its rows are not in a done commit yet."""
        if not len(self._roots):
            return False
        _, acked = journal_outcomes(self.checkpoint)  # ACKED as a commit sees it: by the first outcome
        return bool(np.isin(self._roots, acked).any())

    def close(self) -> None:
        """Stop the outcome streams and close the broker connection (what it still holds goes back to the queue)."""
        try:
            super().close()
        finally:
            self.source.close()
