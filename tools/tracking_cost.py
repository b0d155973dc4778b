"""Per-word executor cost of tracking in the demo's RDD job, measured without Spark.

Runs the demo's two bolt functions the way the RDD job does, over the same
generated sentences, tracked (``BoltCollector`` in hold mode with
``DeterministicEdgeIds``, as ``Bolt.run_partition`` uses them) and untracked
(``UntrackedCollector``): the split stage, pickling the ``(word, tuple)``
pairs in batches of 1,024 as PySpark's shuffle does, unpickling them, and the
count stage's acks with the commit. The collectors commit to a client that
discards what it is given, so the figure is the Python work per tuple, not
the network. Prints the best of ``--repeats`` runs per stage, in µs per word,
and the pickled bytes per word.

    python scripts/tracking_cost.py --records 20000 --repeats 7
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import time
from typing import Any

from acker_client import BoltCollector, MessageId, TrackedTuple, new_id
from acker_demo.wordcount import split_words
from acker_spark.sources import Delivery, generated_sentences
from acker_spark.steps.executor import UntrackedCollector
from acker_spark.steps.ids import DeterministicEdgeIds

STAGES = ("split", "pickle", "unpickle", "ack")


class DiscardingClient:
    """The parts of a ClusterClient a committing collector calls, doing nothing."""

    def ack(self, root: int, value: int, dedup_key: int = 0) -> None:
        """Drop the ack."""

    def fail(self, root: int, dedup_key: int = 0) -> None:
        """Drop the fail."""

    def ack_columns(self, roots: Any, values: Any, dedup_key: int = 0) -> None:
        """Drop the acks."""

    def flush(self) -> None:
        """Nothing to send."""


def _batches(items: list, size: int = 1024) -> list[bytes]:
    return [pickle.dumps(items[i : i + size], pickle.HIGHEST_PROTOCOL) for i in range(0, len(items), size)]


def one_run(records: list, tracked: bool) -> tuple[dict[str, float], int, int]:
    """Seconds per stage, words and pickled bytes of one pass over ``records``."""
    sentences = [
        TrackedTuple(Delivery(key, text, 1), MessageId.single(new_id(), new_id()) if tracked else MessageId.EMPTY)
        for key, text in records
    ]
    sentences = [t for blob in _batches(sentences) for t in pickle.loads(blob)]  # as the driver ships them
    gc.collect()
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    split: Any = BoltCollector(DiscardingClient(), edge_ids=DeterministicEdgeIds(12345), hold=True)
    if not tracked:
        split = UntrackedCollector()
    pairs = [(t.value.word, t) for t in split_words(iter(sentences), split)]
    if tracked:
        split.commit(1)
    seconds["split"] = time.perf_counter() - started
    started = time.perf_counter()
    blobs = _batches(pairs)
    seconds["pickle"] = time.perf_counter() - started
    started = time.perf_counter()
    words = [t for blob in blobs for _, t in pickle.loads(blob)]
    seconds["unpickle"] = time.perf_counter() - started
    started = time.perf_counter()
    count: Any = BoltCollector(DiscardingClient(), hold=True) if tracked else UntrackedCollector()
    for t in words:
        count.ack(t)
    if tracked:
        count.commit(2)
    seconds["ack"] = time.perf_counter() - started
    return seconds, len(words), sum(map(len, blobs))


def measure(record_count: int, repeats: int) -> dict:
    """Best-of-``repeats`` µs per word for each stage, tracked and untracked, and the difference."""
    records = list(generated_sentences(record_count))
    best: dict[bool, dict[str, float]] = {False: {}, True: {}}
    size: dict[bool, int] = {}
    words = 0
    for _ in range(repeats):
        for tracked in (False, True):
            seconds, words, size[tracked] = one_run(records, tracked)
            for stage, value in seconds.items():
                best[tracked][stage] = min(best[tracked].get(stage, value), value)
    result: dict = {"records": record_count, "words": words, "repeats": repeats}
    for stage in STAGES:
        untracked_us, tracked_us = (best[t][stage] / words * 1e6 for t in (False, True))
        result[f"{stage}_untracked_us"] = round(untracked_us, 2)
        result[f"{stage}_tracked_us"] = round(tracked_us, 2)
        result[f"{stage}_overhead_us"] = round(tracked_us - untracked_us, 2)
    result["overhead_us_per_word"] = round(sum(result[f"{s}_overhead_us"] for s in STAGES), 2)
    result["pickled_bytes_per_word"] = {
        "untracked": round(size[False] / words, 1),
        "tracked": round(size[True] / words, 1),
    }
    return result


def main() -> None:
    """Command line: print the figures as one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="generated sentences (default 20,000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant; the best is kept (default 5)")
    args = parser.parse_args()
    if args.records < 1 or args.repeats < 1:
        parser.error("--records and --repeats must be >= 1")
    print(json.dumps(measure(args.records, args.repeats), indent=2))


if __name__ == "__main__":
    main()
