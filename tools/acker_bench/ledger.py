"""acker-bench --mode ledger: the ledger alone, in-process, native engine against the reference model.

Trees go through in batches of ``batch_ops`` operations: each batch holds the
INITs of ``batch_ops / 2`` fresh trees and the ACKs that complete the trees of
the batch before, so every tree lives across one batch boundary and ends ACKED.
All batches are encoded before the clock starts. Both engines are timed on
the one ``Ledger`` contract the server calls (``apply``: serialized
ApplyRequest bytes in, decoded, validated and applied, outcome columns out),
in the same run.
"""

from __future__ import annotations

import gc
import secrets
import time
from collections.abc import Callable

import numpy as np

__all__ = ["run_ledger_bench", "ledger_batches"]

_SPOUT = "acker-bench-ledger"


def ledger_batches(trees: int, batch_ops: int, seed: int | None = None):
    """The benchmark's batches (``acker_service.batch.Batch``): INITs of new trees, ACKs of the previous ones."""
    from acker_protocol.wire import OpKind

    from acker_service.batch import Batch

    rng = np.random.default_rng(secrets.randbits(64) if seed is None else seed)
    per = max(1, batch_ops // 2)
    roots = rng.choice(np.iinfo(np.int64).max, size=trees, replace=False).astype(np.uint64) + np.uint64(1)
    values = rng.integers(1, 2**63, size=trees, dtype=np.uint64)
    batches = []
    for start in range(0, trees + per, per):
        new = slice(min(start, trees), min(start + per, trees))
        old = slice(max(0, start - per), min(start, trees))
        inits, acks = new.stop - new.start, old.stop - old.start
        kinds = np.concatenate([np.full(inits, int(OpKind.INIT)), np.full(acks, int(OpKind.ACK))])
        if not len(kinds):
            continue
        batches.append(
            Batch(
                kinds=kinds.astype(np.int64),
                roots=np.concatenate([roots[new], roots[old]]),
                values=np.concatenate([values[new], values[old]]),
                spouts=[_SPOUT],
            )
        )
    return batches


def _encode(batches) -> list[bytes]:
    from acker_protocol.v1 import acker_pb2

    return [
        acker_pb2.ApplyRequest(
            kinds=b.kinds.tolist(), root_ids=b.roots.tolist(), values=b.values.tolist(), spouts=b.spouts
        ).SerializeToString()
        for b in batches
    ]


def _timed(apply: Callable, items: list) -> tuple[float, float]:
    """(wall, CPU) seconds to apply every item, with the garbage collector off (it would time Python, not the ledger).

    CPU time is the calling thread's: the native ledger runs on it (with the GIL
    released), so on a shared, busy machine it still says what one core does.
    """
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        for item in items:
            apply(item)
        return time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        gc.enable()


def _best(run: Callable[[], tuple[float, float]], repeats: int) -> tuple[float, float]:
    """The fastest wall and CPU times of ``repeats`` runs (the least disturbed by other processes)."""
    times = [run() for _ in range(repeats)]
    return min(t[0] for t in times), min(t[1] for t in times)


def run_ledger_bench(
    trees: int = 1_000_000,
    batch_ops: int = 8192,
    reference_trees: int | None = None,
    repeats: int = 3,
    background: int = 1_000_000,
) -> dict:
    """Ops/s of the native and the reference ledger through the Ledger contract, same requests.

    Native figures are the best of ``repeats`` runs on fresh ledgers; the reference runs
    once (on ``reference_trees``, default ``trees``). ``ops_per_s_with_pending`` repeats
    the native run on a ledger already holding ``background`` pending trees, so the
    table no longer fits in the CPU caches.
    """
    from acker_service.batch import Batch
    from acker_service.ledger import UNLIMITED
    from acker_service.native_ledger import NativeLedger
    from acker_service.reference_ledger import ReferenceLedger

    batches = ledger_batches(trees, batch_ops)
    ops = sum(len(b) for b in batches)
    requests = _encode(batches)
    slots = []

    def native() -> tuple[float, float]:
        ledger = NativeLedger(3600.0)
        took = _timed(lambda data: ledger.apply(data, UNLIMITED), requests)
        assert ledger.stats.acked == trees and ledger.pending_trees == 0, ledger.stats
        slots.append(ledger.table_slots)
        return took

    def with_pending() -> tuple[float, float]:
        ledger = NativeLedger(3600.0)
        for batch in ledger_batches(background, 1 << 16):
            inits = batch.kinds == 1
            ledger.apply(_encode([Batch(batch.kinds[inits], batch.roots[inits], batch.values[inits], spouts=batch.spouts)])[0], UNLIMITED)  # fmt: skip
        assert ledger.pending_trees == background, ledger.pending_trees
        return _timed(lambda data: ledger.apply(data, UNLIMITED), requests)

    native_wall, native_cpu = _best(native, repeats)
    pending_wall, _ = _best(with_pending, 1) if background else (0.0, 0.0)
    ref_trees = trees if reference_trees is None else min(trees, reference_trees)
    ref_requests = requests if ref_trees == trees else _encode(ledger_batches(ref_trees, batch_ops))
    ref_ops = ops if ref_trees == trees else ref_trees * 2
    reference = ReferenceLedger(3600.0)
    ref_wall, ref_cpu = _timed(lambda data: reference.apply(data, UNLIMITED), ref_requests)
    assert reference.stats.acked == ref_trees, reference.stats
    return {
        "mode": "ledger",
        "engine": "native",
        "trees": trees,
        "batch_ops": batch_ops,
        "ops_per_s": round(ops / native_wall, 1),
        "ops_per_cpu_s": round(ops / native_cpu, 1),
        "ops_per_s_with_pending": round(ops / pending_wall, 1) if background else None,
        "pending_background": background,
        "reference_ops_per_s": round(ref_ops / ref_wall, 1),
        "reference_ops_per_cpu_s": round(ref_ops / ref_cpu, 1),
        "speedup": round(ref_wall / ref_ops * ops / native_wall, 1),
        "native_table_slots": max(slots),
    }
