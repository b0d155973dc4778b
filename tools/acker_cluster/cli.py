"""The `acker-cluster` command: run n acker shards on this machine until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from acker_service.process_cluster import ClusterError, ProcessCluster, layout_conflicts

__all__ = ["main"]

log = logging.getLogger("acker_cluster")


def _optional_port(text: str) -> int | None:
    """Parse a port flag where "off", "none" or "" means no port (argparse reports a bad value)."""
    if text.strip().lower() in ("", "none", "off"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 or off, got {text!r}") from None


# (flag, type, environment default, help). Each flag falls back to
# ACKER_CLUSTER_<FLAG>; defaults stay strings so argparse converts (and
# reports) environment values exactly like typed ones.
_FLAGS: tuple[tuple[str, Callable[[str], object], str | None, str], ...] = (
    ("--count", int, "3", "number of shards"),
    ("--host", str, "127.0.0.1", "interface every shard binds"),
    ("--base-port", int, "7100", "shard i listens on BASE_PORT+i; 0 picks free ports"),
    ("--metrics-base-port", _optional_port, "off",
     "shard i serves /metrics on METRICS_BASE_PORT+i; 0 picks free ports; off = no metrics"),
    ("--message-timeout", float, "30", "seconds before a pending tree times out"),
    ("--buckets", int, "3", "rotating-map buckets per shard"),
    ("--startup-timeout", float, "30", "seconds to wait for all shards to be healthy"),
    ("--log-dir", str, None,
     "keep each shard's output in LOG_DIR/shard-<i>.log (default: a temporary directory removed on exit)"),
    ("--layout-dir", str, None,
     "keep each shard's committed layout in LAYOUT_DIR/shard-<i>.layout.json, so a restarted shard comes back "
     "in the layout of the last acker-ctl reshard (default: none, a restart takes --count)"),
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    """Command-line flags, each with its ACKER_CLUSTER_* fallback named in --help."""
    p = argparse.ArgumentParser(
        prog="acker-cluster",
        description="Run n acker shards on this machine. Prints the addresses, in the order clients "
        "must list them, on one line of stdout once all are healthy; stops them all on Ctrl-C or "
        "SIGTERM. Arguments after `--` go to every acker-server verbatim.",
    )
    for flag, kind, default, text in _FLAGS:
        env = "ACKER_CLUSTER_" + flag[2:].upper().replace("-", "_")
        shown = "" if default is None else "; default: %(default)s"
        p.add_argument(flag, type=kind, default=os.environ.get(env, default), help=f"{text} (env {env}{shown})")
    # On by default: a dead shard that stays dead stalls every job whose trees it owns.
    restart_env = os.environ.get("ACKER_CLUSTER_RESTART", "1").lower() not in ("0", "false", "no", "off")
    p.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=restart_env,
        help="restart a shard that exits unexpectedly, same shard and ports (the default); with --no-restart "
        "the launcher stops every shard and exits 1 when one exits (env ACKER_CLUSTER_RESTART=0)",
    )
    p.add_argument("server_args", nargs="*", metavar="-- SERVER_ARGS", help="extra acker-server flags for every shard")
    return p


def _install_stop_handlers(stop: threading.Event) -> None:
    """Make SIGTERM and SIGINT (Ctrl-C) request a clean stop instead of killing the launcher."""

    def request_stop(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def main(argv: list[str] | None = None) -> int:
    """Run `acker-cluster`: start, print the addresses, supervise until signalled, stop; return exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    conflicts = layout_conflicts(args.server_args)
    if conflicts:
        parser.error("; ".join(conflicts))  # exit 2 before anything starts
    logging.basicConfig(level=logging.INFO, format="acker-cluster: %(message)s", stream=sys.stderr)
    stop = threading.Event()
    _install_stop_handlers(stop)
    cluster = ProcessCluster(
        count=args.count,
        host=args.host,
        base_port=args.base_port or None,
        metrics_base_port=args.metrics_base_port,
        message_timeout=args.message_timeout,
        buckets=args.buckets,
        extra_args=args.server_args,
        restart=args.restart,
        log_dir=args.log_dir,
        layout_dir=args.layout_dir,
    )
    try:
        cluster.start(timeout=args.startup_timeout)
    except ClusterError as err:
        # One line; the shard's full output is in its log (kept with --log-dir).
        print(f"acker-cluster: could not start: {err.headline}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"acker-cluster: could not start: {err}", file=sys.stderr)
        return 1
    code = 0
    try:
        _announce(cluster)
        while not stop.wait(0.5):
            # With --no-restart a missing shard is never coming back: clients would wait on it
            # for nothing, so stop the rest and say which one (its exit is logged above).
            dead = [] if args.restart else [i for i in range(cluster.count) if not cluster.is_alive(i)]
            if dead:
                log.error("acker shard %s exited and --no-restart is set; stopping every shard", dead[0])
                code = 1
                break
        else:
            log.info("stopping %d shards", cluster.count)
    finally:
        cluster.stop()
    return code


def _announce(cluster: ProcessCluster) -> None:
    """Print the address line on stdout and one status line per shard on stderr."""
    print(",".join(cluster.addresses), flush=True)
    urls: list[str] | list[None] = cluster.metrics_urls or [None] * cluster.count
    for i, (address, url) in enumerate(zip(cluster.addresses, urls, strict=True)):
        metrics = f", metrics {url}" if url else ""
        log.info("shard %d/%d SERVING on %s (pid %s%s)", i, cluster.count, address, cluster.pid(i), metrics)
    log.info("logs in %s; Ctrl-C or SIGTERM stops all shards", cluster.log_dir)


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
