"""``acker-bench --mode simulate``: many seeds of the handoff simulation, or one seed replayed with its trace.

The simulation itself is :mod:`acker_service.simulation`; this module only
parses the mode's options and prints. ``--seeds N --json`` prints ``seeds``,
``failures`` and ``first_failing_seed``; ``--seed S`` replays that run and
prints its trace and what failed (exit 1 if anything did).
"""

from __future__ import annotations

import argparse
import json

from acker_service.simulation import BROKEN_VARIANTS, run_seed, run_seeds

__all__ = ["add_simulate_arguments", "simulate_mode"]


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    """The simulate mode's options."""
    p.add_argument("--seeds", type=int, default=1000, help="simulate mode: seeds to run (default 1000)")
    p.add_argument("--first-seed", type=int, default=0, help="simulate mode: the first of --seeds seeds (default 0)")
    p.add_argument("--seed", type=int, help="simulate mode: replay this one seed and print its trace")
    p.add_argument(
        "--broken",
        choices=sorted(BROKEN_VARIANTS),
        help="simulate mode: run a deliberately wrong protocol, to see the checks catch it",
    )


def simulate_mode(args: argparse.Namespace) -> int:
    """Run the seeds (or replay one); exit 1 when a run broke an invariant."""
    if args.seed is not None:
        result = run_seed(args.seed, args.broken, trace=True)
        if args.json:
            print(json.dumps({"seed": result.seed, "scenario": result.scenario, "failures": result.failures,
                              "trees": result.trees, "outcomes": result.outcomes, "trace": result.trace}))  # fmt: skip
        else:
            print("\n".join(result.trace or ()))
            print(f"seed {result.seed} ({result.scenario}): " + ("; ".join(result.failures) or "every check held"))
        return 1 if result.failures else 0
    if args.seeds < 1:
        print("acker-bench: --seeds must be at least 1")
        return 2
    summary = run_seeds(range(args.first_seed, args.first_seed + args.seeds), args.broken)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['seeds']} seeds, {summary['failures']} failing, first failing seed "
            f"{summary['first_failing_seed']}, {summary['seconds']} s; scenarios {summary['scenarios']}"
        )
        if summary["first_failure"]:
            print(f"first failure: {summary['first_failure']}")
    return 1 if summary["failures"] else 0
