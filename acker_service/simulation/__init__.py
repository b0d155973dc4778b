"""A seeded, deterministic simulation of ackers, clients, replicas and handoffs.

Each run is drawn from one seed: one ``random.Random(seed)`` decides the
cluster, the traffic, the faults (message loss, duplication, reordering by
random delays, crashes) and the moves (a reshard, a drain, a restart and its
catch-up). Time is a simulated clock that drives the real
:class:`~acker_service.reference_ledger.ReferenceLedger` of every acker; there
are no threads and no wall clock, so a failing seed replays exactly.

Every run checks the four invariants of docs/acker-semantics.md (no false
ack, exactly one outcome per emit, conservation, bounded memory) and, in runs
whose faults allow it, that nothing is replayed. The protocols simulated are
written down in :mod:`acker_service.simulation.acker` and in
docs/simulation.md.

>>> from acker_service.simulation import run_seed
>>> run_seed(3).failures
[]
"""

from .run import BROKEN_VARIANTS, SimResult, run_seed, run_seeds

__all__ = ["BROKEN_VARIANTS", "SimResult", "run_seed", "run_seeds"]
