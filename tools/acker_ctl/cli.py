"""The ``acker-ctl`` command: status, inspect, top, fail, reshard and drain against a running acker cluster; a pipeline's progress and dead letters.

``acker-ctl progress`` reads a running pipeline's figures from its checkpoint;
``acker-ctl dead-letters list|redrive|abandon`` works on a pipeline's
dead-letter table (:mod:`acker_ctl.dead_letters`).

Flags fall back to ACKER_CTL_* environment variables (``ACKER_CTL_ACKERS``,
``ACKER_CTL_TLS_CA``, ...). Output is a table, or with ``--json`` one JSON
document (the same data). Exit status: 0 done, 1 an acker could not be reached
or refused the call (stderr says which and why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from acker_protocol.credentials import ChannelSecurity

from . import dead_letters
from .cluster import Cluster, CtlError
from .progress import progress_text, read_progress
from .records import add_records
from .reshard import drain_addresses, reshard

__all__ = ["main", "build_parser"]


def _root(text: str) -> int:
    """A root id, decimal or 0x-hex."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a root id (decimal or 0x hex), got {text!r}") from None


def _env(name: str) -> str | None:
    return os.environ.get("ACKER_CTL_" + name) or None


def _add_shared(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The flags every subcommand takes, before or after its name.

    On the top-level parser they carry their defaults; on each subcommand's they
    default to nothing (``SUPPRESS``), so a flag given before the subcommand is
    not reset by the subcommand's parser.
    """

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    p.add_argument(
        "--ackers",
        default=default(_env("ACKERS")),
        help="comma-separated host:port of every acker, in shard order (env ACKER_CTL_ACKERS)",
    )
    p.add_argument(
        "--json", action="store_true", default=default(False), help="print one JSON document instead of a table"
    )
    p.add_argument("--deadline", type=float, default=default(10.0), help="seconds each call may take (default 10)")
    p.add_argument("--tls-ca", default=default(_env("TLS_CA")), help="the ackers serve TLS: PEM CA that signed them")
    p.add_argument("--tls-cert", default=default(_env("TLS_CERT")), help="client certificate (ackers with mutual TLS)")
    p.add_argument("--tls-key", default=default(_env("TLS_KEY")), help="key of --tls-cert")
    p.add_argument(
        "--token-file",
        default=default(_env("TOKEN_FILE")),
        help="file holding a bearer token (ackers with --auth-tokens; fail needs a principal with admin = true)",
    )
    p.add_argument(
        "--server-name", default=default(_env("SERVER_NAME")), help="name to check the ackers' certificates against"
    )


class _SharedSubparsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands that take the shared flags too (``acker-ctl status --json`` as well as ``acker-ctl --json status``)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = super().add_parser(name, **kwargs)
        _add_shared(parser, defaults=False)
        parser.register("action", "parsers", _SharedSubparsers)  # nested ones too (dead-letters list --json)
        return parser


def build_parser() -> argparse.ArgumentParser:
    """The flags and subcommands, each flag with its ACKER_CTL_* fallback; shared flags go before or after the
    subcommand."""
    p = argparse.ArgumentParser(
        prog="acker-ctl",
        description="Look at and act on a running acker cluster: status, inspect trees, the oldest trees, "
        "fail trees now so their spouts replay them.",
    )
    _add_shared(p, defaults=True)
    p.register("action", "parsers", _SharedSubparsers)
    sub = p.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="shards, incarnations, pending trees, the oldest tree, rates")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between the two samples of the rates")
    records = (
        "a SourcePipeline's checkpoint directory: name each tree's record (its key, or file and position), "
        "attempt and round"
    )
    inspect = sub.add_parser("inspect", help="the state of given roots")
    inspect.add_argument("roots", nargs="+", type=_root, metavar="ROOT")
    inspect.add_argument("--checkpoint", metavar="DIR", help=records)
    top = sub.add_parser("top", help="the oldest pending trees of the cluster")
    top.add_argument("--oldest", type=int, default=10, metavar="N", help="how many (default 10)")
    top.add_argument("--checkpoint", metavar="DIR", help=records)
    fail = sub.add_parser("fail", help="end trees FAILED now, so their spouts replay them")
    what = fail.add_mutually_exclusive_group(required=True)
    what.add_argument("roots", nargs="*", type=_root, default=[], metavar="ROOT")
    what.add_argument("--spout", help="fail every pending tree of this spout")
    dead_letters.add_parser(sub)
    progress = sub.add_parser(
        "progress",
        help="a SourcePipeline's figures (read, acked, pending, replaying, dead, rate, ETA) from its checkpoint",
    )
    progress.add_argument("--checkpoint", required=True, metavar="DIR", help="the pipeline's checkpoint directory")
    output = sub.add_parser("output", help="a SourcePipeline's exactly-once output")
    output_actions = output.add_subparsers(dest="action", required=True)
    finish = output_actions.add_parser(
        "finish", help="finish a commit a killed driver left half-published (FileOutput): readers see it whole"
    )
    finish.add_argument("--checkpoint", required=True, metavar="DIR", help="the pipeline's checkpoint directory")
    reshard = sub.add_parser(
        "reshard", help="move the running cluster to M shards at --addresses (prepare, cut, commit on every acker)"
    )
    reshard.add_argument("--shards", type=int, required=True, metavar="M", help="the number of shards after the move")
    reshard.add_argument(
        "--addresses", required=True, help="comma-separated host:port of the M ackers of the new layout, in shard order"
    )
    drain = sub.add_parser("drain", help="move every tree off one acker (reshard to the others) so it can leave")
    drain.add_argument("shard", type=int, metavar="SHARD", help="the shard index (position in --ackers) to drain")
    drain.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="wait this long for the drained acker's last due trees to time out there (default: do not wait)",
    )  # fmt: skip
    return p


def _security(args: argparse.Namespace) -> ChannelSecurity | None:
    if not (args.tls_ca or args.tls_cert or args.token_file):
        return None
    return ChannelSecurity(
        tls=True,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        token_file=args.token_file,
        server_name=args.server_name,
    )


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns (None shows as '-')."""
    cells = [[("-" if row[c] is None else str(row[c])) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


_TREE_COLUMNS = ("root", "shard", "status", "age_seconds", "spout", "failed", "resets", "dedup_keys")
_STATUS_COLUMNS = (
    "shard", "address", "incarnation", "pending_trees", "oldest_age_seconds", "oldest_root",
    "started_per_s", "acked_per_s", "failed_per_s", "timed_out_per_s", "timeout_mode", "replicas", "catchup",
)  # fmt: skip


def _summary(status: dict[str, Any]) -> str:
    """The status table's last lines: pending trees, and how many ackers keep each tree."""
    replicas = status["replicas"]
    if replicas == 2:
        kept = "replicas: 2 (every tree is kept by its shard and the next one: one acker's loss replays nothing)"
    elif replicas == 1:
        kept = "replicas: 1 (every tree is kept by one acker: its loss replays that acker's trees)"
    else:
        kept = f"replicas: shards disagree ({replicas}): start every acker with the same --replicas"
    catching = [str(s["shard"]) for s in status["shards"] if s.get("catchup") == "catching-up"]
    if catching:
        kept += (
            f"\ncatching up: shard {', '.join(catching)} (restarted; holds Apply until it copied its ranges "
            "from its partners; a partner lost meanwhile replays those trees)"
        )
    return f"pending trees: {status['pending_trees']}\n{kept}"


def _tree_columns(trees: list[dict[str, Any]], checkpoint: str | None) -> Sequence[str]:
    """The tree table's columns; with a checkpoint, each tree gets its record, attempt and round first."""
    if checkpoint is None:
        return _TREE_COLUMNS
    add_records(trees, checkpoint)
    return ("root", "record", "attempt", "round", *_TREE_COLUMNS[1:])


def _move(args: argparse.Namespace, addresses: list[str], security: ChannelSecurity | None) -> tuple[Any, str]:
    """reshard / drain: (JSON-ready result, its text)."""
    if args.command == "drain":
        new = drain_addresses(addresses, args.shard)
        result = reshard(addresses, new, security, max(args.deadline, 30.0), wait_leaving=args.wait)
    else:
        new = [a.strip() for a in args.addresses.split(",") if a.strip()]
        if len(new) != args.shards:
            raise CtlError(f"--shards {args.shards} but --addresses lists {len(new)} ackers; list one per shard")
        result = reshard(addresses, new, security, max(args.deadline, 30.0))
    text = (
        f"layout epoch {result['epoch']}: {result['from_shards']} -> {result['to_shards']} shards; "
        f"moved {result['moved_trees']} pending trees ({result['moved_entries']} entries) in "
        f"{result['move_seconds']} s (cut to commit {result['cut_seconds']} s)\n"
        f"clients now send to: {','.join(result['addresses'])}"
    )
    for address, pending in result["leaving"].items():
        text += f"\n{address} left the layout; {pending} due trees still end there (stop it when 0: acker-ctl status)"
    return result, text


def _run(args: argparse.Namespace, cluster: Cluster) -> tuple[Any, str]:
    """(JSON-ready result, its table) for the chosen subcommand."""
    if args.command == "status":
        result = cluster.status(args.interval)
        return result, _table(result["shards"], _STATUS_COLUMNS) + "\n" + _summary(result)
    if args.command in ("inspect", "top") and args.checkpoint is not None and not os.path.isdir(args.checkpoint):
        raise CtlError(f"{args.checkpoint} is not a directory: give the pipeline's checkpoint directory")
    if args.command == "inspect":
        trees = cluster.inspect(args.roots)
        return trees, _table(trees, _tree_columns(trees, args.checkpoint))
    if args.command == "top":
        trees = cluster.top(args.oldest)
        return trees, _table(trees, _tree_columns(trees, args.checkpoint)) if trees else "no pending trees"
    if args.spout:
        result = cluster.fail_spout(args.spout)
        text = _table(result["shards"], ("shard", "failed", "timed_out"))
        return result, text + f"\nfailed {result['failed']} trees of spout {args.spout}"
    result = cluster.fail_roots(args.roots)
    text = f"failed: {' '.join(map(str, result['failed'])) or '-'}"
    if result["not_failed"]:
        text += (
            f"\nnot failed (not pending, awaiting their init, or timed out): {' '.join(map(str, result['not_failed']))}"
        )
    return result, text


def _finish_output(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """``acker-ctl output finish``: complete the checkpoint's unfinished FileOutput commit."""
    from acker_spark.output.commits import finish_checkpoint

    try:
        rows, number = finish_checkpoint(args.checkpoint)
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"acker-ctl: {exc}", file=sys.stderr)
        return 1
    result = {"commit": number, "rows": rows}
    out(
        json.dumps(result)
        if args.json
        else (f"commit {number} finished: {rows} rows" if number is not None else "no unfinished commit")
    )
    return 0


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    """Run one subcommand; 0 done, 1 an acker failed the call, 2 bad usage."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "dead-letters":
        return dead_letters.run(args, out, lambda text: print(f"acker-ctl: {text}", file=sys.stderr))
    if args.command == "progress":  # the checkpoint alone: no acker is asked
        try:
            figures = read_progress(args.checkpoint)
        except CtlError as exc:
            print(f"acker-ctl: {exc}", file=sys.stderr)
            return 1
        out(json.dumps(figures, indent=2) if args.json else progress_text(figures))
        return 0
    if args.command == "output":  # the checkpoint and the output folder alone: no acker is asked
        return _finish_output(args, out)
    if not args.ackers:
        parser.error("give the ackers: --ackers host:port,... in shard order (or ACKER_CTL_ACKERS)")
    if args.command == "top" and args.oldest < 1:
        parser.error("--oldest must be at least 1")
    try:
        security = _security(args)
    except ValueError as exc:
        parser.error(str(exc))
    addresses = [a.strip() for a in args.ackers.split(",") if a.strip()]
    try:
        if args.command in ("reshard", "drain"):
            result, text = _move(args, addresses, security)
        else:
            with Cluster(addresses, security, args.deadline) as cluster:
                result, text = _run(args, cluster)
    except CtlError as exc:
        print(f"acker-ctl: {exc}", file=sys.stderr)
        return 1
    out(json.dumps(result, indent=2) if args.json else text)
    return 0
