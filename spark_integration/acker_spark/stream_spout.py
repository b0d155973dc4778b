"""The spout behind the streaming source: emits records as trees into a log of offsets, replays failures.

:class:`StreamSpout` is what the stream reader drives from Spark's planning
calls, with no Spark in it: :meth:`advance` starts trees for records due for
replay and new records (at most ``max_pending`` in flight) and appends their
rows to an in-memory log; :meth:`rows` slices the log by offset; :meth:`commit`
drops what Spark has processed. Emitting and replaying is the
:class:`~acker_spark.replaying_spout.ReplayingSpout` the batch pipeline uses
too; outcomes arrive on its callback thread a batch at a time and are written
to SQLite per batch (every delivery's outcome in one transaction, the batch's
dead letters in another).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from acker_client import ClusterClient, new_id
from acker_protocol.wire import Outcome

from .dead_letter import DeadLetterStore
from .frames import pack_ids
from .replaying_spout import ReplayingSpout
from .replays import ReplayPolicy
from .sources import Delivery, Record
from .stream_ledger import StreamLedger

__all__ = ["StreamSpout", "DirectoryFeed", "Row"]

log = logging.getLogger(__name__)

Row = tuple[str, str, int, bytes]
"""One emitted delivery as the stream's row: key, value, attempt, packed MessageId."""


class DirectoryFeed:
    """The lines of the text files in a directory, picking up files that appear later.

    Each poll reads the files not read before, in sorted order, keyed as
    :class:`~acker_spark.sources.TextDirectorySource` keys them. Put a file in
    place complete (write elsewhere, then rename), as for Spark's file source.
    """

    def __init__(self, directory: str | Path) -> None:
        from .sources import TextDirectorySource

        self.source = TextDirectorySource(directory)
        self._seen: set[Path] = set()
        self._frozen: list[Path] | None = None

    def freeze(self) -> None:
        """Read only the files present now, from here on (``Trigger.AvailableNow``)."""
        self._frozen = self.source.files()

    def poll(self) -> Iterator[Record]:
        """The records of the files not read yet."""
        files = self._frozen if self._frozen is not None else self.source.files()
        for path in files:
            if path not in self._seen:
                self._seen.add(path)
                yield from self._lines(path)

    def _lines(self, path: Path) -> Iterator[Record]:
        # Keyed and filtered exactly as TextDirectorySource does, so both sources agree on keys.
        name = path.relative_to(self.source.directory).as_posix()
        with path.open(encoding=self.source.encoding) as lines:
            for number, line in enumerate(lines, start=1):
                text = line.rstrip("\r\n")
                if text.strip():
                    yield Record(f"{name}:{number}", text)


class _FixedFeed:
    """A finite iterable of records, read once (e.g. generated sentences)."""

    def __init__(self, records: Iterable[Record]) -> None:
        self._records: Iterator[Record] | None = iter(records)

    def freeze(self) -> None:
        """Nothing to do: the feed never grows."""

    def poll(self) -> Iterator[Record]:
        records, self._records = self._records, None
        return records if records is not None else iter(())


class StreamSpout:
    """Emits records as tuple trees into an offset log and settles each record exactly once."""

    def __init__(
        self,
        cluster: ClusterClient,
        feed: DirectoryFeed | Iterable[Record],
        *,
        database: str | Path,
        name: str | None = None,
        max_pending: int = 1_000,
        policy: ReplayPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.feed = feed if isinstance(feed, DirectoryFeed) else _FixedFeed(feed)
        self.policy = policy or ReplayPolicy()
        self.clock = clock
        self.dead_letters = DeadLetterStore(database)
        self.ledger = StreamLedger(database)
        self._cond = threading.Condition()
        self.replaying = ReplayingSpout(
            cluster,
            on_outcomes=self._record,
            name=name,
            max_pending=max_pending,
            policy=self.policy,
            clock=clock,
            cond=self._cond,
        )
        self.spout = self.replaying.spout  # the client spout: stats, wait_idle
        self._pending_records: Iterator[Record] = iter(())
        self._log: deque[Row] = deque()
        self._first = 0  # the offset of self._log[0]
        # (key, attempt) -> roots of deliveries in flight: a timeout of one whose acks an
        # executor reported undelivered is recorded as ACKS_UNDELIVERED.
        self._roots: dict[tuple[str, int], tuple[int, ...]] = {}
        self.run = f"{new_id():016x}"  # tags this reader's rows in the progress table

    def start(self) -> StreamSpout:
        """Subscribe to the ackers' outcomes."""
        self.replaying.start()
        return self

    @property
    def end(self) -> int:
        """The offset after the last row emitted."""
        with self._cond:
            return self._first + len(self._log)

    def rebase(self, offset: int) -> None:
        """Continue numbering at ``offset`` (a query restarted from a checkpoint; only with an empty log)."""
        with self._cond:
            if self._log:
                raise RuntimeError("cannot rebase a stream spout that holds rows")
            self._first = offset

    def freeze(self) -> None:
        """Stop taking records that arrive from now on (``Trigger.AvailableNow``)."""
        self.feed.freeze()

    # -- planning calls --------------------------------------------------------

    def advance(self, max_rows: int | None = None) -> int:
        """Emit due replays, then new records, while trees may be started; return the new end offset."""
        emitted = self.replaying.take(max_rows, self._fresh)
        rows = [(t.value.key, t.value.value, t.value.attempt, pack_ids(t.message_id)) for t in emitted]
        with self._cond:
            self._log.extend(rows)
            for tracked in emitted:
                self._roots[(tracked.value.key, tracked.value.attempt)] = tuple(tracked.message_id.roots)
        return self.end

    def rows(self, start: int, end: int) -> list[Row]:
        """The rows at offsets ``[start, end)`` still held (rows before a commit are gone)."""
        with self._cond:
            lo, hi = max(start, self._first) - self._first, max(end - self._first, 0)
            rows = list(itertools.islice(self._log, lo, hi))
        if len(rows) < end - start:
            # A batch planned by an earlier run of the query: its records were in that
            # reader's memory; this reader reads the source again from the start.
            log.warning("offsets %d..%d are not held by this reader (a restarted query?): skipped", start, end)
        return rows

    def commit(self, end: int) -> None:
        """Forget the rows before ``end``: Spark has processed them."""
        with self._cond:
            while self._log and self._first < end:
                self._log.popleft()
                self._first += 1

    def busy(self) -> bool:
        """True while a record is in flight or waiting for its replay."""
        return self.replaying.busy()

    def wait_for_work(self, timeout: float) -> None:
        """Block until a replay is due, nothing is in flight or waiting any more, or ``timeout`` passed."""
        deadline = self.clock() + timeout
        with self._cond:
            while self.replaying.unsettled or self.replaying.schedule.waiting:
                now, due = self.clock(), self.replaying.schedule.next_due()
                if now >= deadline or (due is not None and due <= now):
                    return
                self._cond.wait(min(due if due is not None else deadline, deadline) - now)

    def close(self) -> None:
        """Close the spout: trees still pending end LOST, recorded but not replayed (the query is over)."""
        self.replaying.close()

    # -- internals ---------------------------------------------------------------

    def _fresh(self) -> Delivery | None:
        """The first delivery of the feed's next record, polling the feed for more when it runs dry."""
        record = next(self._pending_records, None)
        if record is None:
            self._pending_records = self.feed.poll()
            record = next(self._pending_records, None)
        return None if record is None else Delivery(str(record[0]), record[1], 1)

    def _record(self, acked: list[Delivery], failed: list[tuple[Delivery, Outcome, bool]]) -> None:
        """Write a batch of outcomes, and a dead letter for each final failure (the callback thread)."""
        # A tree cut short by close() comes here not final: recorded, neither replayed
        # nor dead-lettered, so it stays unsettled in the table. The ReplayingSpout
        # counts the deliveries as settled only after this returns: busy() turning False
        # may end an AvailableNow query, and whoever then reads the tables must find
        # every outcome there.
        with self._cond:
            roots = [()] * len(acked) + [self._roots.pop((d.key, d.attempt), ()) for d, _, _ in failed]
            for d in acked:
                self._roots.pop((d.key, d.attempt), None)
        rows = [(d.key, d.attempt, Outcome.ACKED, True) for d in acked]
        rows += [(d.key, d.attempt, o, final) for d, o, final in failed]
        # The ledger names a timeout or loss of a tree whose acks an executor dropped ACKS_UNDELIVERED.
        stored = self.ledger.record_many(self.run, rows, at=time.time(), roots=roots)
        outcomes = stored[len(acked) :]
        self.dead_letters.add_many(
            (d.key, d.value, o, d.attempt) for (d, _, final), o in zip(failed, outcomes) if final
        )
