"""``acker-ctl dead-letters``: list a dead-letter table by cause, redrive a selection through a job, abandon a redrive.

``list`` reads the SQLite store only (no ackers). ``redrive`` starts a local
SparkSession (or the master ``spark-submit --master`` gave), connects to
``--ackers`` and calls :meth:`SourcePipeline.redrive` with the job that
``--job module:function`` builds: ``function(addresses)`` returns the job
(``job(df)``, the same the run used; it needs the addresses for its bolts).
A job that returns its output DataFrame needs the output the run had:
``--output FORMAT:PATH`` (with ``--partition-by COL``), or an ``OUTPUT``
attribute of the job's module (a ``FileOutput``, ``TableOutput`` or
``BatchOutput``); the rows are appended. Without either, such a job is
refused before a letter is taken. A redrive killed midway is finished by
running the same command again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Add ``dead-letters list|redrive|abandon`` to acker-ctl's subcommands."""
    dl = sub.add_parser("dead-letters", help="dead letters by cause; redrive a selection through the job again")
    actions = dl.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="dead letters grouped by cause kind, with counts and examples")
    listing.add_argument("--store", required=True, help="the dead-letter SQLite file")
    listing.add_argument("--examples", type=int, default=3, metavar="N", help="example keys per cause (default 3)")

    redrive = actions.add_parser(
        "redrive", help="send dead letters through the job again as new deliveries, each at most once"
    )
    redrive.add_argument("--store", required=True, help="the dead-letter SQLite file")
    redrive.add_argument(
        "--job", required=True, metavar="MODULE:FUNCTION", help="FUNCTION(addresses) returns the job(df) to run"
    )
    redrive.add_argument(
        "--checkpoint", required=True, help="the pipeline's checkpoint folder (redrives go under its redrives/)"
    )
    redrive.add_argument("--cause", action="append", default=[], help="a cause kind to take, e.g. ValueError (repeat)")
    redrive.add_argument("--key", action="append", default=[], help="a dead letter's key to take (repeat)")
    redrive.add_argument("--all", action="store_true", help="take every letter not yet acked by a redrive")
    redrive.add_argument("--rate", type=float, help="most records sent per second (default uncapped)")
    redrive.add_argument("--key-column", help="the column the run was keyed by (default: found from the letters)")
    redrive.add_argument("--schema", help='Spark DDL to cast the stored rows to, e.g. "amount double"')
    redrive.add_argument("--master", help="Spark master (default: spark-submit's, else local)")
    redrive.add_argument(
        "--output",
        metavar="FORMAT:PATH",
        help="where the job's returned rows go, appended exactly once, e.g. parquet:/data/orders (default: the job "
        "module's OUTPUT; none for a job that ends with an action over a sink bolt)",
    )
    redrive.add_argument(
        "--partition-by", action="append", default=[], metavar="COL", help="partition --output by COL (repeat)"
    )
    redrive.add_argument(
        "--budget",
        default="none",
        metavar="FRACTION|none",
        help="stop the redrive once more than this fraction of its letters die again (default none: every letter "
        "ends acked or dead again)",
    )

    abandon = actions.add_parser("abandon", help="give up an unfinished redrive (its letters may be taken again)")
    abandon.add_argument("--store", required=True, help="the dead-letter SQLite file")
    abandon.add_argument("redrive_id", metavar="REDRIVE_ID")


def run(args: argparse.Namespace, out: Callable[[str], None], error: Callable[[str], None]) -> int:
    """Run one ``dead-letters`` action; 0 done, 1 failed (``error`` says why), 2 bad usage."""
    from acker_spark.dead_letter import DeadLetterStore

    if not Path(args.store).is_file():
        error(f"no dead-letter store at {args.store}")
        return 2
    store = DeadLetterStore(args.store)
    if args.action == "list":
        if args.examples < 0:
            error("--examples must be >= 0")
            return 2
        return _list(store, args, out)
    if args.action == "abandon":
        count = store.abandon_redrive(args.redrive_id)
        out(json.dumps({"abandoned": args.redrive_id, "released": count}) if args.json else
            f"redrive {args.redrive_id} abandoned: {count} letters may be taken again")  # fmt: skip
        return 0
    return _redrive(store, args, out, error)


def _list(store: Any, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    groups = store.groups(args.examples)
    unfinished = store.unfinished_redrive()
    if args.json:
        out(
            json.dumps(
                {
                    "total": sum(g.count for g in groups),
                    "causes": [
                        {
                            "cause": g.kind,
                            "count": g.count,
                            "statuses": g.statuses,
                            "examples": [{"key": e.key, "cause": e.last_cause} for e in g.examples],
                        }
                        for g in groups
                    ],
                    "unfinished_redrive": unfinished.redrive_id if unfinished else None,
                },
                indent=2,
            )
        )
        return 0
    if not groups:
        out("no dead letters")
        return 0
    lines = [f"{sum(g.count for g in groups)} dead letters"]
    for g in groups:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(g.statuses.items()))
        lines.append(f"{g.count:>8}  {g.kind}  ({statuses})")
        for e in g.examples:
            lines.append(f"          {e.key}: {(e.last_cause or '-')[:160]}")
    if unfinished is not None:
        lines.append(
            f"unfinished redrive {unfinished.redrive_id} (selection {unfinished.selection}): run the same redrive "
            "again to finish it"
        )
    out("\n".join(lines))
    return 0


def _job(spec: str, addresses: list[str]) -> tuple[Any, Any]:
    """The job ``--job MODULE:FUNCTION`` builds, and the module's ``OUTPUT`` (None if it has none)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--job takes MODULE:FUNCTION, got {spec!r}")
    loaded = importlib.import_module(module)
    factory = getattr(loaded, name, None)
    if not callable(factory):
        raise ValueError(f"--job {spec}: {module} has no function {name!r}")
    return factory(addresses), getattr(loaded, "OUTPUT", None)


def _output(args: argparse.Namespace, module_output: Any) -> Any:
    """The redrive's output: ``--output FORMAT:PATH`` (partitioned by ``--partition-by``), else the module's."""
    from acker_spark.output import FileOutput

    if args.output is None:
        if args.partition_by:
            raise ValueError("--partition-by needs --output FORMAT:PATH")
        return module_output
    fmt, sep, path = args.output.partition(":")
    if not sep or not fmt or not path:
        raise ValueError(f"--output takes FORMAT:PATH, e.g. parquet:/data/orders, got {args.output!r}")
    return FileOutput(path, format=fmt, partition_by=tuple(args.partition_by), mode="append")


def _budget(text: str) -> Any:
    """``--budget``: ``none`` or a fraction of the letters that may die again."""
    from acker_spark.budget import FailureBudget

    if text.lower() == "none":
        return None
    try:
        fraction = float(text)
    except ValueError:
        raise ValueError(f"--budget takes a fraction between 0 and 1 or 'none', got {text!r}") from None
    return FailureBudget(fraction=fraction)


def _redrive(store: Any, args: argparse.Namespace, out: Callable[[str], None], error: Callable[[str], None]) -> int:
    from acker_client import ClusterClient
    from acker_spark import local_session
    from acker_spark.dead_letter import Select
    from acker_spark.executor_read.source_pipeline import SourcePipeline

    if not args.ackers:
        error("give the ackers: --ackers host:port,... in shard order (or ACKER_CTL_ACKERS)")
        return 2
    if args.all == bool(args.cause or args.key):
        error("choose the letters: --cause KIND and/or --key KEY, or --all")
        return 2
    if args.rate is not None and not args.rate > 0:
        error("--rate must be > 0 records/s")
        return 2
    addresses = [a.strip() for a in args.ackers.split(",") if a.strip()]
    try:
        job, module_output = _job(args.job, addresses)
        output = _output(args, module_output)
        budget = _budget(args.budget)
    except (ImportError, ValueError) as exc:
        error(str(exc))
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    spark = local_session(args.master, app_name="acker-ctl-redrive")
    try:
        with ClusterClient(addresses) as client:
            pipeline = SourcePipeline(spark, client, args.checkpoint, output=output)
            report = pipeline.redrive(
                store,
                job,
                select=Select(cause=tuple(args.cause), keys=tuple(args.key)),
                rate=args.rate,
                key=args.key_column,
                schema=args.schema,
                budget=budget,
            )
    except Exception as exc:  # noqa: BLE001 - the command reports any failure and exits 1
        message = str(exc)
        if "OutputForgotten" in message:
            message += " (acker-ctl: give the run's output with --output FORMAT:PATH [--partition-by COL])"
        error(f"redrive failed: {type(exc).__name__}: {message}")
        return 1
    result = report.as_dict()
    out(
        json.dumps(result, indent=2)
        if args.json
        else (
            f"redrive {report.redrive_id} ({report.selection}): {report.sent} redriven, {report.acked} acked, "
            f"{report.dead} dead again, {report.still_failing} still failing of {report.claimed} claimed in "
            f"{report.seconds:.1f} s; output {report.output}"
            + (" (finished a killed redrive)" if report.resumed else "")
        )
    )
    return 0
