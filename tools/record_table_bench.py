"""The executor-read driver's record table at a million roots: the timings its code's choices rest on.

Each line is the best of three runs on this machine, in milliseconds; what each
pair compares is a choice made in ``acker_spark.tracking.record_table`` or
``emission_log`` (docs/benchmarks.md keeps the figures):

    python tools/record_table_bench.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from acker_spark.tracking.emission_log import Emissions
from acker_spark.tracking.record_table import RecordTable

ROOTS = 1_000_000


def best_ms(run: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``run``, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(min(times) * 1000, 1)


def main() -> None:
    """Print one line per comparison."""
    rng = np.random.default_rng(1)
    roots = np.unique(rng.integers(1, 2**63, ROOTS, dtype=np.uint64))
    count = len(roots)
    first = Emissions(roots, roots ^ np.uint64(7), np.ones(count, np.uint16), 0)
    shuffled = rng.permutation(roots)

    def merged() -> None:
        table = RecordTable()
        table.add(Emissions(roots[:1] - np.uint64(1), roots[:1], np.ones(1, np.uint16), 0), 0)
        table.add(first, 1)  # a table that is not empty merges the round in

    print("first round: taken as read", best_ms(lambda: RecordTable().add(first, 0)), "merged", best_ms(merged))

    def settle(outcomes: np.ndarray) -> Callable[[], object]:
        tables = []

        def run() -> None:
            table = RecordTable()
            table.add(first, 0)
            tables.append(table)
            table.settle(shuffled, outcomes, 1)

        return run

    acked, mixed = np.ones(count, np.int8), rng.choice(np.array([1, 2], np.int8), count)
    print("settle (table built too): one outcome code", best_ms(settle(acked)), "mixed codes", best_ms(settle(mixed)))
    print(
        "searchsorted: sorted queries",
        best_ms(lambda: np.searchsorted(roots, roots)),
        "random queries",
        best_ms(lambda: np.searchsorted(roots, shuffled)),
    )
    runs = np.concatenate([np.sort(part) for part in np.array_split(shuffled, 8)])
    print(
        "driver's sort: 8 sorted runs (emission files)",
        best_ms(lambda: np.argsort(runs, kind="stable")),
        "random roots",
        best_ms(lambda: np.argsort(shuffled, kind="stable")),
    )
    table = RecordTable()
    table.add(first, 0)
    print("compaction (keep every entry)", best_ms(lambda: table.keep(np.ones(len(table), dtype=bool))))


if __name__ == "__main__":
    main()
