"""The replay book of the executor-read drivers: what was started, what ended, what is due, what is final.

:class:`~acker_spark.executor_read.source_pipeline.SourcePipeline` and
:class:`~acker_spark.streaming.stream_planner.StreamPlanner` differ in what a round
reads and how (a Spark job over a DataFrame, a micro-batch of file ranges);
what they do with the trees a round started is the same, and it is this
book. It keeps:

- the record table (:class:`~acker_spark.tracking.record_table.RecordTable`): every
  root the executors started, read from the round's emission log;
- the outcomes the :class:`~acker_spark.tracking.outcome_feed.OutcomeFeed` journaled,
  settled by root in bulk; an outcome that comes before its root was read
  can wait for the next round (a stray);
- the rounds' backstop deadlines, after which their pending trees are LOST;
- the roots whose acks a bolt could not deliver (their timeouts end as
  ``ACKS_UNDELIVERED``), journaled in the checkpoint;
- each failed delivery's replay time (the :class:`~acker_spark.replay_policy.ReplayPolicy`
  backoff), and the deliveries that used their last attempt: their dead
  letters are written, journaled, and they are final;
- the failure budget's counts for this driver's run (records first read,
  records dead-lettered and their causes by kind), and the tally of a round
  whose job is running (:meth:`ReplayBook.round_tally`), so both drivers stop
  a run past its :class:`~acker_spark.budget.FailureBudget` the same way.

All of it is rebuilt from the checkpoint (:meth:`ReplayBook.restore`), so a
restarted driver continues where the last one stopped.

It also answers what a driver asks of it without reaching into the table:
the filter of the next round (:meth:`ReplayBook.first_read`,
:meth:`ReplayBook.replay_filter`), the records a replay did not find again,
the deliveries whose output is still to commit, and, for the dead letters,
:class:`DeadRecords` handed to the driver's :class:`PayloadReader`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from acker_client import ClusterClient, ShardUnavailable
from acker_client.columns import distinct, member_of
from acker_protocol.wire import Outcome

from ..budget import BudgetExceeded, CauseTally, FailureBudget
from ..causes import CauseReader
from ..dead_letter import DeadLetterStore
from ..replay_policy import ReplayPolicy
from ..run_report import RunStats
from .checkpoint import Checkpoint
from .emission_log import Emissions, RoundFilter, read_round
from .identity import derive_roots
from .record_table import ACKED, DEAD, FAILED, PENDING, REPLAYED, RecordTable
from .round_tally import RoundTally

__all__ = ["DeadLetterRow", "DeadRecords", "PayloadReader", "ReplayBook", "round_slot"]

log = logging.getLogger(__name__)

_UNUSED = np.zeros(0, dtype=np.uint64)
_NO_OUTCOMES = np.zeros(0, dtype=np.int8)
_SETTLED = (ACKED, REPLAYED, DEAD)
_UNDELIVERABLE = (int(Outcome.TIMED_OUT), int(Outcome.LOST))  # the ends a dropped ack turns into ACKS_UNDELIVERED
_COMPACT_AT = 100_000  # table entries before settled ones may be dropped

ALL_ROWS = RoundFilter("all", _UNUSED, np.zeros(0, dtype=np.uint16))
"""The filter of a round that reads every record (a first run's first round)."""

DeadLetterRow = tuple[Any, ...]
"""One dead letter as a store takes it: ``(key, payload, reason, attempts)``, and optionally its cause."""


@dataclass(frozen=True)
class DeadRecords:
    """The records a book dead-letters now, entry by entry: identity, last attempt, reason (an Outcome) and root."""

    idents: np.ndarray
    attempts: np.ndarray
    reasons: np.ndarray
    roots: np.ndarray
    cause_of: Callable[[int], str | None]  # why a root's delivery failed, if an executor said

    def causes(self) -> list[str | None]:
        """Each record's cause, in entry order (read from the executors' files: only when a driver asks)."""
        return [self.cause_of(root) for root in self.roots.tolist()]


class PayloadReader(Protocol):
    """A driver's way to read dead records again: one dead letter per record found (those not found are left out)."""

    def __call__(self, dead: DeadRecords) -> Sequence[DeadLetterRow]:
        """The dead letters of ``dead``: ``(key, payload, reason, attempts)`` and optionally the cause."""
        ...


def round_slot(round_no: int) -> int:
    """The round number as the table keeps it (16 bits: a long stream's numbers wrap, its old rounds are settled)."""
    return round_no & 0xFFFF


class ReplayBook:
    """One run's started deliveries and their ends, kept from the checkpoint and the outcome feed.

    ``salt`` is the run's id salt (a replay's root is derived from it);
    ``clock`` the driver's clock for replay times and deadlines. The outcome
    feed is attached once it runs (:meth:`attach`): the book takes its
    outcomes and journals through it the LOST ends it decides itself.
    """

    def __init__(self, checkpoint: Checkpoint, salt: int, policy: ReplayPolicy, clock: Callable[[], float]) -> None:
        self.checkpoint = checkpoint
        self.salt = salt
        self.policy = policy
        self.clock = clock
        self.table = RecordTable()
        self.deadlines: dict[int, float] = {}  # round slot -> when its pending trees count as lost
        self.undelivered = _UNUSED  # roots whose acks a bolt dropped (sorted)
        self._strays: tuple[np.ndarray, np.ndarray] = (_UNUSED, _NO_OUTCOMES)
        self._feed: Any = None
        self.causes = CauseReader(checkpoint.path)  # why deliveries failed, as the executors wrote it
        self.poisoned = _UNUSED  # roots whose cause dead-letters at once (sorted)
        # The failure budget's counts, for this driver's run only (a rerun after a fix starts
        # afresh): records first read, records dead-lettered, and the latter's causes by kind.
        # A record an earlier driver read is not charged to this run's budget (a rerun after a fix
        # must not stop on the leftovers of the run that stopped): their identities, sorted.
        self.read_count = 0
        self.dead_count = 0
        self.dead_causes = CauseTally()
        self._earlier = _UNUSED

    def attach(self, feed: Any) -> None:
        """The outcome feed this book takes outcomes from and journals its own LOST ends to."""
        self._feed = feed

    # -- what was started -------------------------------------------------------------------

    def restore(self, rounds: Iterable[int]) -> None:
        """Rebuild the book from the checkpoint: the rounds' emission logs, then every journaled end.

        A failed delivery's backoff ran while no driver was up: it is due now.
        """
        for round_no in rounds:
            self.table.add(read_round(self.checkpoint.path, round_no), round_slot(round_no))
        self.undelivered = distinct(self.checkpoint.read_undelivered())
        roots, outcomes = self.checkpoint.read_outcomes()
        self.settle_outcomes(roots, outcomes, keep_strays=False)
        # Superseded deliveries first: only a dead record's last delivery is DEAD (one per record).
        self.table.mark_replayed(self.salt, self.table.idents, self.table.attempts)
        dead = self.checkpoint.read_dead()
        if len(dead):
            self.table.state[np.isin(self.table.idents, dead) & (self.table.state == FAILED)] = DEAD
        if len(self.undelivered):
            self.mark_undelivered()
        self.table.due[self.table.state == FAILED] = self.clock()
        self._earlier = distinct(self.table.idents)

    def fail_left_in_flight(self, cluster: ClusterClient, rounds: Iterable[int], backstop: float, by: str) -> None:
        """After :meth:`restore`: fail at the ackers the trees the previous ``by`` (driver, query) left pending.

        Its tasks are gone: whatever they did not finish never will. Failing the
        trees settles them now; a tree that completed meanwhile keeps its
        retained outcome. The backstop still bounds the wait for those outcomes.
        """
        pending = self.table.pending()
        if not len(pending):
            return
        log.info("resuming: failing %d trees left in flight by the previous %s", len(pending), by)
        try:
            cluster.fail_columns(self.table.roots[pending])
            cluster.flush()
        except ShardUnavailable as err:  # the error listener marked the shards for the ShardDown bound
            log.warning("could not fail the trees left in flight (they will count as lost): %s", err)
        for round_no in rounds:
            self.start_deadline(round_no, backstop)

    def add_round(self, emissions: Emissions, round_no: int) -> int:
        """Add the roots a round started (a re-run round repeats some); return how many were new.

        A new attempt supersedes the one before it, and outcomes that came
        before their roots were read are matched now (then dropped).
        """
        before = int((self.table.attempts == 1).sum())
        added = self.table.add(emissions, round_slot(round_no))
        if added:
            self.table.mark_replayed(self.salt, emissions.idents, emissions.attempts)
            self.read_count += int((self.table.attempts == 1).sum()) - before
        strays_roots, strays_outcomes = self._strays
        if len(strays_roots):
            self._strays = (_UNUSED, _NO_OUTCOMES)
            self.settle_outcomes(strays_roots, strays_outcomes, keep_strays=False)
        return added

    def start_deadline(self, round_no: int, backstop: float) -> None:
        """The round's pending trees count as lost ``backstop`` seconds from now."""
        self.deadlines[round_slot(round_no)] = self.clock() + backstop

    # -- what ended ---------------------------------------------------------------------------

    def settle_feed(self, *, keep_strays: bool = True) -> None:
        """Settle every outcome the feed journaled since the last call."""
        self.settle_outcomes(*self._feed.take(), keep_strays=keep_strays)

    def settle_outcomes(self, roots: np.ndarray, outcomes: np.ndarray, *, keep_strays: bool = True) -> None:
        """Apply outcomes by root; each failed delivery gets its replay time.

        With ``keep_strays``, an outcome whose root is not in the table yet (its
        round's job is still running) waits for the next :meth:`add_round`.
        """
        if not len(roots):
            return
        settled, unknown = self.table.settle(roots, outcomes, int(Outcome.ACKED))
        if len(settled.failed):
            if len(self.undelivered):
                self.mark_undelivered(settled.failed)
            self._find_poisoned(settled.failed)
            attempts = self.table.attempts[settled.failed]
            delays = np.array([self.policy.delay(int(a)) for a in range(int(attempts.max()) + 1)])
            self.table.due[settled.failed] = self.clock() + delays[attempts]
        if keep_strays and len(unknown):
            mask = np.isin(roots, unknown)
            self._strays = (
                np.concatenate((self._strays[0], roots[mask])),
                np.concatenate((self._strays[1], outcomes[mask])),
            )

    def _find_poisoned(self, failed: np.ndarray) -> None:
        """Failed deliveries whose cause the policy dead-letters at once (a malformed record is not retried)."""
        causes = self.causes.refresh()
        if not causes:
            return
        roots = self.table.roots[failed]
        poison = [r for r in roots.tolist() if not self.policy.retries(causes.get(r))]
        if poison:
            self.poisoned = np.union1d(self.poisoned, np.asarray(poison, dtype=np.uint64))

    def cause_of(self, root: int) -> str | None:
        """Why the delivery ``root`` failed, if an executor said."""
        return self.causes.refresh().get(root)

    def expire(self) -> None:
        """Pending trees of rounds past their backstop deadline are LOST (journaled, then settled)."""
        roots = self.table.take_late(self.deadlines, self.clock())
        if len(roots):
            log.warning("%d trees had no outcome within the backstop timeout: replaying them as LOST", len(roots))
            self._feed.record(roots, Outcome.LOST)
            self.settle_outcomes(roots, np.full(len(roots), int(Outcome.LOST), dtype=np.int8), keep_strays=False)

    def fail_round(self, cluster: ClusterClient, round_no: int) -> None:
        """A failed job: fail its unsettled trees at the ackers so they are replayed without waiting for timeouts."""
        pending = self.table.pending(np.asarray([round_slot(round_no)], dtype=np.uint16))
        if not len(pending):
            return
        try:
            cluster.fail_columns(self.table.roots[pending])
            cluster.flush()
        except ShardUnavailable as err:
            log.warning("could not fail the trees of a failed job (the backstop will): %s", err)

    # -- acks a bolt could not deliver -------------------------------------------------------

    def add_undelivered(self, roots: np.ndarray) -> None:
        """Roots whose acks a bolt dropped: journaled (a restarted driver names them the same), then marked."""
        new = self.checkpoint.add_undelivered(roots[~np.isin(roots, self.undelivered)])
        if len(new):
            self.undelivered = np.union1d(self.undelivered, new)
        self.mark_undelivered()

    def reload_undelivered(self) -> None:
        """Read the undelivered journals again (another process, the query's driver, appends to them)."""
        roots = self.checkpoint.read_undelivered()
        if len(roots) != len(self.undelivered) or not np.isin(roots, self.undelivered).all():
            self.undelivered = distinct(roots)
            self.mark_undelivered()

    def mark_undelivered(self, positions: np.ndarray | None = None) -> None:
        """Entries that timed out or were lost and whose acks a bolt dropped: their reason is ACKS_UNDELIVERED."""
        table = self.table
        if positions is None:
            positions = np.flatnonzero(table.state != PENDING)
        hit = positions[np.isin(table.reason[positions], _UNDELIVERABLE)]
        hit = hit[np.isin(table.roots[hit], self.undelivered)]
        table.reason[hit] = int(Outcome.ACKS_UNDELIVERED)

    # -- what is due ----------------------------------------------------------------------------

    def due_replays(self) -> np.ndarray:
        """Positions of failed deliveries with attempts left whose backoff is over."""
        table = self.table
        waiting = (table.state == FAILED) & (table.attempts < self.policy.max_attempts) & ~self._poison_mask()
        return np.flatnonzero(waiting & (table.due <= self.clock()))

    def _poison_mask(self) -> np.ndarray:
        """Per entry: True if its delivery failed with a cause that dead-letters at once."""
        if not len(self.poisoned):
            return np.zeros(len(self.table), dtype=bool)
        return np.isin(self.table.roots, self.poisoned)

    def busy(self) -> bool:
        """True while a delivery is in flight or its record waits for a replay or its dead letter."""
        state = self.table.state
        return bool(((state == PENDING) | (state == FAILED)).any())

    def wait_time(self, limit: float) -> float:
        """How long the driver may wait for outcomes before a replay is due (at most ``limit`` seconds)."""
        waiting = (self.table.state == FAILED) & np.isfinite(self.table.due)  # a planned replay is not due
        timeout = limit
        if waiting.any():
            timeout = min(timeout, max(0.0, float(self.table.due[waiting].min()) - self.clock()))
        return timeout

    def first_read(self) -> RoundFilter:
        """The filter of a round reading the source whole: every record not read yet (all of them on a first run)."""
        skip = distinct(self.table.idents)
        return RoundFilter("skip", skip, np.zeros(len(skip), dtype=np.uint16)) if len(skip) else ALL_ROWS

    def replay_filter(self, due: np.ndarray) -> tuple[RoundFilter, np.ndarray]:
        """The filter of a round replaying the entries ``due`` (each with its next attempt), and their roots."""
        table = self.table
        attempts = (table.attempts[due] + 1).astype(np.uint16)
        return RoundFilter("select", table.idents[due], attempts), table.roots[due]

    def not_found(self, roots: np.ndarray) -> int:
        """How many of the deliveries ``roots`` (replayed by a round that read the whole source) are still FAILED."""
        return len(self.table.in_state(roots, FAILED))

    def started(self) -> int:
        """How many deliveries the book holds (0: no record was ever read)."""
        return len(self.table)

    def in_flight(self) -> bool:
        """True while a started tree has no outcome yet."""
        return bool(len(self.table.pending()))

    def round_stalled(self, round_no: int) -> int:
        """How many trees the round started if every one of them is still pending, else 0."""
        table = self.table
        mine = table.rounds == round_slot(round_no)
        if not mine.any() or (table.state[mine] != PENDING).any():
            return 0
        return int(mine.sum())

    def acked_since(self, committed: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """The ACKED deliveries whose root is not in ``committed`` (sorted): ``(roots, rounds, whole)``.

        ``whole``: every delivery of these rounds is among them, so a commit
        of their staged rows needs no selection.
        """
        table = self.table
        acked = np.flatnonzero(table.state == ACKED)
        fresh = acked[~member_of(table.roots[acked], committed)] if len(committed) else acked
        rounds = table.rounds[fresh]
        # The table holds each root once and ``fresh`` are entries of these rounds, so counting them is
        # enough (no lookup of every root: this runs over the whole table, once per commit).
        whole = bool(len(fresh)) and int(np.isin(table.rounds, np.unique(rounds)).sum()) == len(fresh)
        return table.roots[fresh], rounds, whole

    # -- what is final ------------------------------------------------------------------------

    def write_dead_letters(self, store: DeadLetterStore | None, payloads: PayloadReader) -> None:
        """Records that failed their last attempt: store their dead letters, journal that they are done.

        ``payloads(dead)`` reads each one's record again and gives its dead
        letter (the reason is the entry's, ACKS_UNDELIVERED included).
        """
        table = self.table
        last = (table.attempts >= self.policy.max_attempts) | self._poison_mask()
        dead = np.flatnonzero((table.state == FAILED) & last)
        if not len(dead):
            return
        # Charged to this run's budget: records it read, that failed for their own sake (acks a bolt
        # could not deliver are the ackers' reachability: AcksUndelivered and ShardDown report those).
        charged = ~member_of(table.idents[dead], self._earlier) & (table.reason[dead] != int(Outcome.ACKS_UNDELIVERED))
        self.dead_count += int(charged.sum())
        if store is not None:
            rows = payloads(
                DeadRecords(
                    table.idents[dead], table.attempts[dead], table.reason[dead], table.roots[dead], self.cause_of
                )
            )
            store.add_many(rows)
            for row in rows:  # the causes of the dead letters this run wrote, with their keys as examples
                self.dead_causes.add(str(row[0]), row[4] if len(row) > 4 else None)
        else:
            for root in table.roots[dead].tolist():
                self.dead_causes.add(f"root {root:016x}", self.cause_of(root))
            log.error(
                "%d records failed %d times; no dead-letter store to keep them", len(dead), self.policy.max_attempts
            )
        journal = self.checkpoint.dead_journal()
        try:
            journal.append(table.idents[dead])
        finally:
            journal.close()
        table.state[dead] = DEAD

    # -- the failure budget -------------------------------------------------------------------

    def round_tally(self, round_no: int, rows: RoundFilter) -> RoundTally:
        """A tally of the round about to run (read by the round watch while its job runs).

        Its failures are news unless their root is known already or their record is an earlier run's.
        """
        known = self.table.roots
        if rows.mode == "select" and len(self._earlier):
            earlier = member_of(rows.idents, self._earlier)
            replays = derive_roots(self.salt, rows.idents[earlier], rows.attempts[earlier])
            known = np.union1d(known, replays)
        return RoundTally(self.checkpoint.path, round_no, rows, self.salt, self.policy, np.sort(known))

    def budget_counts(self, tally: RoundTally | None = None) -> tuple[int, int]:
        """``(dead, read)`` of this run so far, with what the running round's ``tally`` saw (watch thread)."""
        if tally is None:
            return self.dead_count, self.read_count
        dead = self.dead_count + tally.failed_for_good()
        if not dead:
            # No budget is past with nothing dead: skip counting the round's emission files (the
            # watch asks ten times a second, and a healthy run has no dead records to weigh).
            return 0, self.read_count
        return dead, self.read_count + tally.read()

    def budget_error(self, budget: FailureBudget, tally: RoundTally | None = None) -> BudgetExceeded | None:
        """The error that stops the run if it is past ``budget`` (None if not), naming the top causes."""
        dead, read = self.budget_counts(tally)
        if not budget.exceeded(dead, read):
            return None
        causes = self.dead_causes if len(self.dead_causes) or tally is None else tally.kinds
        return budget.error(dead, read, causes.top())

    def compact(self) -> None:
        """Drop settled entries once the table is large (a stream runs for ever; the table must not grow with it)."""
        table = self.table
        if len(table) < _COMPACT_AT or table.count(PENDING) + table.count(FAILED) > len(table) // 2:
            return
        table.keep(~np.isin(table.state, _SETTLED))

    def fill_stats(self, stats: RunStats) -> None:
        """Write the table's counts into ``stats`` (the whole run's, from the checkpoint's state)."""
        table = self.table
        stats.emitted = int((table.attempts == 1).sum())
        stats.replayed = int((table.attempts > 1).sum())
        stats.attempts = len(table)
        stats.acked = table.count(ACKED)
        ended = table.state != PENDING
        stats.failed = int((ended & (table.reason == int(Outcome.FAILED))).sum())
        stats.timed_out = int((ended & (table.reason == int(Outcome.TIMED_OUT))).sum())
        stats.lost = int((ended & (table.reason == int(Outcome.LOST))).sum())
        stats.acks_undelivered = int((ended & (table.reason == int(Outcome.ACKS_UNDELIVERED))).sum())
        stats.dead_lettered = table.count(DEAD)
        stats.pending = table.count(PENDING)
        stats.awaiting_replay = table.count(FAILED)

    def dead_for_undelivered(self) -> bool:
        """True if a record was dead-lettered because its acks could not be delivered."""
        table = self.table
        return bool(((table.state == DEAD) & (table.reason == int(Outcome.ACKS_UNDELIVERED))).any())
