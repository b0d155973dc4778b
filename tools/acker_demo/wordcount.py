"""The demo's tracked word count: split sentences, shuffle by word, write an idempotent SQLite sink.

Sink rows are keyed by (record key, word position), so a replayed sentence or a
re-run task rewrites the same rows; word counts come from ``GROUP BY word`` over
the rows of records that were not dead-lettered.
"""

from __future__ import annotations

import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from acker_spark.dead_letter import DeadLetterStore
from acker_spark.sources import Record
from acker_spark.sqlite import open_db, upsert
from acker_spark.steps.executor import Bolt
from acker_spark.steps.ids import stable_id
from acker_spark.steps.rdd_rows import tracked_rdd

__all__ = [
    "Word",
    "InjectedCrash",
    "FailureInjection",
    "tokenize",
    "split_words",
    "CountWords",
    "create_sink",
    "sink_counts",
    "expected_counts",
    "build_job",
    "build_source_job",
    "Job",
]

Job = Callable[[Any], object]
"""A job: given the records (an RDD of tracked tuples, or a DataFrame), runs the actions that complete the work."""

_WORD = re.compile(r"[\w']+")

_SINK_SCHEMA = """
CREATE TABLE IF NOT EXISTS words (
    record_key TEXT NOT NULL,
    position   INTEGER NOT NULL,
    word       TEXT NOT NULL,
    PRIMARY KEY (record_key, position)
) WITHOUT ROWID
"""


class Word(NamedTuple):
    """One word of a record, with the delivery attempt it came from."""

    key: str
    position: int
    word: str
    attempt: int


class InjectedCrash(RuntimeError):
    """Raised by the demo's crash injection to make Spark retry a task."""


def tokenize(text: str) -> list[str]:
    """Lower-cased words of ``text``."""
    return _WORD.findall(text.lower())


def split_words(tuples: Iterator[Any], collector: Any) -> Iterator[Any]:
    """Bolt function: emit each word of a sentence anchored to it, then ack the sentence."""
    for sentence in tuples:
        delivery = sentence.value
        for position, word in enumerate(tokenize(delivery.value)):
            yield collector.emit(Word(delivery.key, position, word, delivery.attempt), anchors=[sentence])
        collector.ack(sentence)


def word_of(tracked: Any) -> str:
    """The shuffle key of a tracked Word."""
    return tracked.value.word


def stable_partition(word: str) -> int:
    """A partitioner hash that is the same in every process and run (re-runs must see the same rows)."""
    return zlib.crc32(word.encode("utf-8"))


@dataclass(frozen=True)
class FailureInjection:
    """Deterministic faults for the demo and tests.

    ``fail_percent``: a word fails when a hash of (key, position, attempt) falls
    under it, so a replay gets a fresh draw. ``crash_partition``: the counting
    task of that partition raises on its first attempt after ``crash_after``
    tuples (or at its end, if smaller). ``crash_marker``: a file the crashing
    task creates, so that one task of the whole run crashes rather than one in
    every Spark job (a tracked run runs a job per batch of replays: dozens of
    crashes, each a retried task in a fresh Python worker); None crashes once
    per job. The marker lives beside the sink, which the executors write too. ``always_fail``: keys whose words fail on
    every attempt; ``fail_first``: keys whose words fail on the first attempt only.
    """

    fail_percent: float = 0.0
    crash_partition: int | None = None
    crash_after: int = 50
    crash_marker: str | None = None
    always_fail: frozenset[str] = frozenset()
    fail_first: frozenset[str] = frozenset()

    def should_fail(self, word: Word) -> bool:
        """True if this delivery of this word is to be failed."""
        if word.key in self.always_fail or (word.attempt == 1 and word.key in self.fail_first):
            return True
        if self.fail_percent <= 0:
            return False
        draw = stable_id(f"{word.key}\0{word.position}\0{word.attempt}".encode())
        return draw / 2**64 * 100 < self.fail_percent

    def crashes(self, partition: int, attempt: int) -> bool:
        """True if the task attempt for ``partition`` must crash (with a marker: the first such attempt only)."""
        if self.crash_partition != partition or attempt != 0:
            return False
        if self.crash_marker is None:
            return True
        try:  # the one attempt that creates the marker crashes; O_EXCL makes it one across processes
            os.close(os.open(self.crash_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


class CountWords:
    """Bolt function: write each word's row to the SQLite sink, then ack it (or fail it, if injected)."""

    def __init__(self, db_path: str | Path, injection: FailureInjection = FailureInjection(), chunk: int = 256) -> None:
        self.db_path = str(db_path)
        self.injection = injection
        self.chunk = chunk

    def __call__(self, tuples: Iterator[Any], collector: Any) -> Iterable[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        crash = context is not None and self.injection.crashes(context.partitionId(), context.attemptNumber())
        written: list[Any] = []
        with open_db(self.db_path) as conn:
            rows: list[tuple[str, int, str]] = []
            for index, tracked in enumerate(tuples):
                if crash and index == self.injection.crash_after:
                    raise InjectedCrash(f"injected crash after {index} words (first attempt)")
                word = tracked.value
                if self.injection.should_fail(word):
                    collector.fail(tracked)
                    continue
                rows.append((word.key, word.position, word.word))
                written.append(tracked)
                if len(rows) >= self.chunk:
                    # Committed in chunks on purpose: a crash leaves partial rows,
                    # which the retry rewrites (the sink is idempotent).
                    upsert(conn, "words", ("record_key", "position", "word"), rows)
                    conn.commit()
                    rows.clear()
            upsert(conn, "words", ("record_key", "position", "word"), rows)
            if crash:
                raise InjectedCrash("injected crash at the end of the partition (first attempt)")
        # The rows are committed: only now may their tuples be acked.
        for tracked in written:
            collector.ack(tracked)
        return ()


def create_sink(db_path: str | Path, *, clear: bool = False) -> None:
    """Create the ``words`` and ``dead_letters`` tables; ``clear`` empties them for a fresh run."""
    DeadLetterStore(db_path)
    with open_db(db_path) as conn:
        conn.execute(_SINK_SCHEMA)
        if clear:
            conn.execute("DELETE FROM words")
            conn.execute("DELETE FROM dead_letters")


def sink_counts(db_path: str | Path) -> Counter[str]:
    """Word counts in the sink, leaving out the rows of dead-lettered records.

    A dead-lettered record may have written some of its words on a failed
    attempt; excluding its key here (rather than deleting rows) cannot race with
    a task still writing them.
    """
    with open_db(db_path) as conn:
        rows = conn.execute(
            "SELECT word, COUNT(*) FROM words"
            " WHERE record_key NOT IN (SELECT record_key FROM dead_letters) GROUP BY word"
        ).fetchall()
    return Counter(dict(rows))


def expected_counts(records: Iterable[Record], exclude: Sequence[str] | set[str] = ()) -> Counter[str]:
    """Word counts computed directly from the input records, without the ``exclude`` keys."""
    excluded = set(exclude)
    counts: Counter[str] = Counter()
    for key, text in records:
        if key not in excluded:
            counts.update(tokenize(text))
    return counts


def build_job(
    addresses: Sequence[str] | None,
    db_path: str | Path,
    *,
    partitions: int = 4,
    injection: FailureInjection = FailureInjection(),
) -> tuple[Job, tuple[Bolt, Bolt]]:
    """The word-count job over an RDD of tracked ``Delivery``-shaped tuples (``addresses=None``: the same job untracked)."""
    split = Bolt(split_words, addresses, name="split")
    count = Bolt(CountWords(db_path, injection), addresses, name="count")

    def job(rdd: Any) -> None:
        words = split.apply(rdd)
        # Hash partitioning (not repartition()'s round robin): a recomputed
        # partition must receive the same records as the first computation.
        by_word = words.keyBy(word_of).partitionBy(partitions, stable_partition).values()
        count.apply(by_word).count()

    return job, (split, count)


def build_source_job(
    addresses: Sequence[str] | None,
    db_path: str | Path,
    *,
    partitions: int = 4,
    injection: FailureInjection = FailureInjection(),
) -> tuple[Job, tuple[Bolt, Bolt]]:
    """The same RDD word count for ``SourcePipeline.run(records, job)``: RDD bolts over the pipeline's frame.

    The frame names the record ``_record_key`` and its delivery ``_attempt``;
    the bolts read ``key``, ``value`` and ``attempt``, so the job renames them,
    then hands the rows to the RDD job as tracked tuples (``tracked_rdd``).
    """
    inner, bolts = build_job(addresses, db_path, partitions=partitions, injection=injection)

    def job(df: Any) -> None:
        inner(tracked_rdd(df.selectExpr("_record_key AS key", "value", "_attempt AS attempt", "_acker_ids")))

    return job, bolts
