"""The spout behind the streaming source: emits records as trees into a log of offsets, replays failures.

:class:`StreamSpout` is what the stream reader drives from Spark's planning
calls, with no Spark in it: :meth:`advance` starts trees for records due for
replay and new records (at most ``max_pending`` in flight) and appends their
rows to an in-memory log; :meth:`rows` slices the log by offset; :meth:`commit`
drops what Spark has processed. Outcomes arrive on the spout's callback
thread: acks and dead letters are written to SQLite, failures are queued for
replay as new trees after an exponential backoff.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from acker_client import ClusterClient, Spout, new_id
from acker_protocol.wire import Outcome

from .dead_letter import DeadLetterStore
from .frames import pack_ids
from .replays import ReplayPolicy, ReplaySchedule
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
        self.spout = Spout(cluster, on_ack=self._on_ack, on_fail=self._on_fail, name=name, max_pending=max_pending)
        self._cond = threading.Condition()
        self._inflight: dict[tuple[str, int], Delivery] = {}
        self._schedule = ReplaySchedule(self.policy, clock)
        self._pending_records: Iterator[Record] = iter(())
        self._log: deque[Row] = deque()
        self._first = 0  # the offset of self._log[0]
        self._closing = False
        self.run = f"{new_id():016x}"  # tags this reader's rows in the progress table

    def start(self) -> StreamSpout:
        """Subscribe to the ackers' outcomes."""
        self.spout.start()
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
        emitted = 0
        while max_rows is None or emitted < max_rows:
            delivery = self._next_delivery()
            if delivery is None:
                break
            message_id = (delivery.key, delivery.attempt)
            with self._cond:
                self._inflight[message_id] = delivery  # before emit: the outcome may come at once
            tracked = self.spout.try_emit(delivery, message_id)
            if tracked is None:  # max_pending trees in flight
                with self._cond:
                    del self._inflight[message_id]
                self._push_back(delivery)
                break
            with self._cond:
                self._log.append((delivery.key, delivery.value, delivery.attempt, pack_ids(tracked.message_id)))
            emitted += 1
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
        with self._cond:
            return bool(self._inflight) or not self._schedule.empty

    def wait_for_work(self, timeout: float) -> None:
        """Block until a replay is due, nothing is in flight or waiting any more, or ``timeout`` passed."""
        deadline = self.clock() + timeout
        with self._cond:
            while self._inflight or self._schedule.waiting:
                now, due = self.clock(), self._schedule.next_due()
                if now >= deadline or (due is not None and due <= now):
                    return
                self._cond.wait(min(due if due is not None else deadline, deadline) - now)

    def close(self) -> None:
        """Close the spout: trees still pending end LOST, recorded but not replayed (the query is over)."""
        with self._cond:
            self._closing = True
        self.spout.close()

    # -- internals ---------------------------------------------------------------

    def _next_delivery(self) -> Delivery | None:
        with self._cond:
            delivery = self._schedule.pop_due()
        if delivery is not None:
            return delivery
        record = next(self._pending_records, None)
        if record is None:
            self._pending_records = self.feed.poll()
            record = next(self._pending_records, None)
        return None if record is None else Delivery(str(record[0]), record[1], 1)

    def _push_back(self, delivery: Delivery) -> None:
        with self._cond:
            self._schedule.push_back(delivery)

    def _on_ack(self, message_id: tuple[str, int]) -> None:
        with self._cond:
            delivery = self._inflight[message_id]
        try:
            self.ledger.record(self.run, delivery.key, delivery.attempt, Outcome.ACKED, final=True, at=time.time())
        finally:
            self._settle(message_id)

    def _on_fail(self, message_id: tuple[str, int], reason: Outcome) -> None:
        with self._cond:
            delivery = self._inflight[message_id]
            # A tree cut short by close() is no failure of the record: it is recorded but
            # neither replayed nor dead-lettered, so it stays unsettled in the table.
            # Queued before the SQLite writes: a write error must not lose the replay.
            final = not self._closing and not self._schedule.retry(delivery)
        try:
            if final:
                self.dead_letters.add(delivery.key, delivery.value, reason, delivery.attempt)
            self.ledger.record(self.run, delivery.key, delivery.attempt, reason, final=final, at=time.time())
        finally:
            self._settle(message_id)

    def _settle(self, message_id: tuple[str, int]) -> None:
        # Only after its rows are written: busy() turning False may end an AvailableNow
        # query, and whoever then reads the tables must find every outcome there.
        with self._cond:
            del self._inflight[message_id]
            self._cond.notify_all()
