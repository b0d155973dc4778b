"""Record sources for the driver's spout: in-memory, generated sentences, a directory of text files.

A source is any iterable of :class:`Record`. Keys must be unique within a run:
replays, the dead-letter table and idempotent sinks all identify a record by it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Record", "Delivery", "records_from", "generated_sentences", "TextDirectorySource"]


class Record(NamedTuple):
    """One source record: a unique key and its payload."""

    key: str
    value: Any


class Delivery(NamedTuple):
    """The value of a spout tuple: the record plus which delivery of it this is (1 = first)."""

    key: str
    value: Any
    attempt: int


def records_from(values: Iterable[Any], *, prefix: str = "r") -> Iterator[Record]:
    """Wrap plain values as records keyed ``<prefix><index>`` (an in-memory source)."""
    for index, value in enumerate(values):
        yield Record(f"{prefix}{index:08d}", value)


# A small vocabulary with a skewed (Zipf-like) draw, so some words are hot keys
# in the shuffle, as in real text.
_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "acker spark storm tuple tree root edge spout bolt shard ledger replay stream record word"
).split()


def generated_sentences(count: int, *, seed: int = 42, min_words: int = 3, max_words: int = 12) -> Iterator[Record]:
    """``count`` pseudo-random sentences, the same for the same seed, keyed ``s<index>``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    # Driver-side only and seeded on purpose: the data must be reproducible, unlike ids.
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(len(_WORDS))]
    for index in range(count):
        length = rng.randint(min_words, max_words)
        yield Record(f"s{index:08d}", " ".join(rng.choices(_WORDS, weights, k=length)))


class TextDirectorySource:
    """Every non-blank line of the files under a directory, keyed ``<relative path>:<line number>``.

    Files are read in sorted path order, so keys and order are stable across runs.
    """

    def __init__(self, directory: str | Path, pattern: str = "**/*", encoding: str = "utf-8") -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise NotADirectoryError(f"source directory {self.directory} does not exist or is not a directory")
        self.pattern = pattern
        self.encoding = encoding

    def files(self) -> list[Path]:
        """The files this source reads, in order (hidden files skipped)."""
        return sorted(
            path
            for path in self.directory.glob(self.pattern)
            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(self.directory).parts)
        )

    def __iter__(self) -> Iterator[Record]:
        for path in self.files():
            name = path.relative_to(self.directory).as_posix()
            with path.open(encoding=self.encoding) as lines:
                for number, line in enumerate(lines, start=1):
                    text = line.rstrip("\r\n")
                    if text.strip():
                        yield Record(f"{name}:{number}", text)
