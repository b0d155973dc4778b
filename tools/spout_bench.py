"""Driver CPU per record of the client spout: emit + settle, per record or in bulk.

The acker runs as a separate process (``local_cluster(processes=True)``), so the
CPU time measured here (``time.process_time``: every thread of this process,
gRPC's included) is the driver's alone. Each batch is emitted, then its trees
are completed in columns (``ack_columns``, a ``--fail-every``-th of them
``fail_columns``), so the outcomes stream back as a mix of ACKED and FAILED.
That columnar ack costs the same few nanoseconds per record in every mode.

    python scripts/spout_bench.py --mode scalar    # emit() + on_ack/on_fail
    python scripts/spout_bench.py --mode bulk      # emit_many() + on_outcomes
    python scripts/spout_bench.py --mode bulk-per-record  # emit_many() + on_ack/on_fail
    python scripts/spout_bench.py --mode columns   # emit_columns() + on_outcomes
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
from acker_client import ClusterClient, Spout
from acker_client.testing import local_cluster

MODES = ("scalar", "bulk", "bulk-per-record", "columns")


class Tally:
    """Counts callbacks in whichever style the spout was given."""

    def __init__(self) -> None:
        self.acked = 0
        self.failed = 0
        self.lock = threading.Lock()

    def on_ack(self, message_id: object) -> None:
        """Per-record ack."""
        self.acked += 1

    def on_fail(self, message_id: object, reason: object) -> None:
        """Per-record failure."""
        self.failed += 1

    def on_outcomes(self, acked: list, failed: list) -> None:
        """Bulk callback."""
        self.acked += len(acked)
        self.failed += len(failed)


def complete(client: ClusterClient, roots: np.ndarray, edges: np.ndarray, fail_every: int) -> None:
    """The bolts' part, in columns: fail every ``fail_every``-th tree, ack the others, send."""
    failing = np.zeros(roots.size, dtype=bool)
    if fail_every:
        failing[::fail_every] = True
    client.fail_columns(roots[failing])
    client.ack_columns(roots[~failing], edges[~failing])
    client.flush()


def ids_of(tracked: list) -> tuple[np.ndarray, np.ndarray]:
    """Root and edge ids of spout tuples, as columns."""
    pairs = [next(iter(t.message_id.items())) for t in tracked]
    return np.array([r for r, _ in pairs], dtype=np.uint64), np.array([e for _, e in pairs], dtype=np.uint64)


def run(mode: str, records: int, batch: int, fail_every: int, addresses: list[str]) -> dict:
    """Emit ``records`` in batches of ``batch`` through a spout in ``mode``; CPU and wall time per record."""
    tally = Tally()
    with ClusterClient(addresses) as client:
        if mode in ("bulk", "columns"):
            spout = Spout(client, on_outcomes=tally.on_outcomes, max_pending=4 * batch, timeout=600.0)
        else:
            spout = Spout(client, on_ack=tally.on_ack, on_fail=tally.on_fail, max_pending=4 * batch, timeout=600.0)
        spout.start()
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, records, batch):
            ids = list(range(start, min(start + batch, records)))
            if mode == "scalar":
                tracked = [spout.emit(i, i) for i in ids]
            elif mode == "columns":
                roots, edges = spout.emit_columns(ids)
            else:
                tracked = spout.emit_many(ids, ids)
            if mode != "columns":
                roots, edges = ids_of(tracked)
            complete(client, roots, edges, fail_every)
        if not spout.wait_idle(120):
            raise SystemExit(f"{spout.pending} records still pending after 120 s")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        stats = spout.stats
        spout.close()
    assert tally.acked + tally.failed == records, (tally.acked, tally.failed, records)
    return {
        "mode": mode,
        "records": records,
        "batch": batch,
        "acked": stats.acked,
        "failed": stats.failed,
        "cpu_us_per_record": round(cpu / records * 1e6, 2),
        "wall_us_per_record": round(wall / records * 1e6, 2),
    }


def main() -> None:
    """Parse the flags, start one acker process, run each mode asked for and print one JSON line per run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, action="append", help="repeatable; default: every mode")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--fail-every", type=int, default=10, help="fail every n-th record (0: none)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with local_cluster(1, processes=True, message_timeout=60.0) as ackers:
        for _ in range(args.repeat):
            for mode in args.mode or MODES:
                print(json.dumps(run(mode, args.records, args.batch, args.fail_every, ackers.addresses)), flush=True)


if __name__ == "__main__":
    main()
