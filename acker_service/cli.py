"""The ``acker-server`` command: flags with ACKER_* environment fallbacks, then serve one shard."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ._version import __version__
from .config import ConfigError, ServerConfig
from .moving.layout_file import LayoutFileError
from .server import PortInUse, serve
from .shard_identity import FROM_HOSTNAME_ENV, ShardIdentityError, environ_with_shard_index

__all__ = ["main", "build_parser", "config_from_args", "ENV_PREFIX"]

ENV_PREFIX = "ACKER_"
_DEFAULTS = {f.name: f.default for f in fields(ServerConfig)}


def _optional_port(text: str) -> int | None:
    """A port number, or 'off' / '' for no metrics server."""
    return None if text.strip().lower() in ("", "off", "none") else int(text)


def _switch(text: str) -> bool:
    """1/true/yes/on or 0/false/no/off (so an ACKER_* variable can turn an option on)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1 or 0, got {text!r}")


def _optional_text(text: str) -> str | None:
    """A name, or '' for none (an empty ACKER_* variable means unset)."""
    return text or None


def _optional_path(text: str) -> str | None:
    """A file path, or '' for none (so an empty ACKER_* variable means off)."""
    return text or None


@dataclass(frozen=True)
class _Flag:
    name: str  # ServerConfig field (and flag --name-with-dashes, env ACKER_NAME)
    type: Callable[[str], Any]
    help: str


_FLAGS = (
    _Flag("host", str, "address to listen on (0.0.0.0 for every interface)"),
    _Flag("port", int, "gRPC port; 0 picks a free one"),
    _Flag("shard_index", int, "this acker's shard: it owns roots with root %% shard_count == shard_index"),
    _Flag("shard_count", int, "number of acker shards in the cluster"),
    _Flag(
        "replicas",
        int,
        "replication factor, the same on every shard: 1, or 2 to keep every tree also on the next shard "
        "(an acker crash then replays nothing)",
    ),
    _Flag(
        "join",
        _switch,
        "1: a --shard-index at or above --shard-count starts this acker outside the layout, owning no roots, "
        "until acker-ctl reshard gives it a place (a pod added to a StatefulSet)",
    ),
    _Flag(
        "layout_file",
        _optional_path,
        "file where this acker keeps the last layout it committed (written atomically at each acker-ctl reshard); "
        "read at start, it overrides --shard-index/--shard-count when newer; a corrupt file refuses the start",
    ),
    _Flag("message_timeout", float, "seconds a tree may stay pending before it times out"),
    _Flag("buckets", int, "RotatingMap buckets; trees expire within timeout + timeout/(buckets-1)"),
    _Flag(
        "timeout_mode",
        str,
        "fixed: a tree's timeout runs from its init or last RESET_TIMEOUT; progress: every applied ack restarts it "
        "(needs --max-tree-lifetime)",
    ),
    _Flag(
        "max_tree_lifetime",
        float,
        "seconds after its init at which any tree ends LIFETIME_EXCEEDED, however it is kept alive; 0 for no cap",
    ),
    _Flag("metrics_host", str, "address of the Prometheus endpoint (default: --host)"),
    _Flag("metrics_port", _optional_port, "Prometheus /metrics port; 0 picks a free one; 'off' for none"),
    _Flag("max_batch", int, "most operations accepted in one Apply call (RESOURCE_EXHAUSTED above)"),
    _Flag("max_message_bytes", int, "largest gRPC message accepted or sent, in bytes"),
    _Flag("retain_outcomes", int, "outcomes kept per spout for delivery and resume"),
    _Flag("retain_seconds", float, "seconds an outcome is kept for delivery and resume"),
    _Flag(
        "subscriber_buffer_bytes",
        int,
        "bytes of outcomes kept per subscribed spout while its stream catches up (a mass timeout); "
        "only a backlog beyond this is evicted",
    ),
    _Flag("grace", float, "seconds running calls get to finish at shutdown"),
    _Flag("engine", str, "ledger engine: native (the Rust core) or reference (the Python model)"),
    _Flag(
        "max_concurrent_rpcs",
        int,
        "most RPCs in progress at once, open Subscribe streams included (RESOURCE_EXHAUSTED above); 0 for no limit",
    ),
    _Flag(
        "max_streams_per_connection",
        int,
        "most concurrent HTTP/2 streams one client connection may open "
        "(further calls wait for a free stream); 0 for gRPC's default",
    ),
    _Flag(
        "max_subscriptions",
        int,
        "most open Subscribe streams, all spouts (RESOURCE_EXHAUSTED above; a takeover "
        "of an open one is allowed); 0 for no limit",
    ),
    _Flag(
        "max_held_operations",
        int,
        "most operations held unapplied for trees still moving to this acker (layout change) or for "
        "ranges awaiting their partner's copy (catch-up after a restart with --peers); "
        "UNAVAILABLE above, the client retries; 0 for no limit",
    ),
    _Flag(
        "min_ping_interval",
        float,
        "seconds a client must leave between keepalive pings; one pinging more often is disconnected (too_many_pings)",
    ),
    _Flag(
        "peers",
        _optional_path,
        "with --replicas 2: every shard's host:port in shard order, comma-separated; a restarted acker then "
        "copies its two ranges from its partners before it applies anything (catch-up)",
    ),
    _Flag(
        "catchup_delay",
        float,
        "seconds a restarted acker holds Apply before copying its ranges (longer than the clients' reconnect backoff)",
    ),
    _Flag(
        "peer_token_file",
        _optional_path,
        "file holding the bearer token the catch-up sends its partners (its principal needs admin = true)",
    ),
    _Flag("tls_cert", _optional_path, "PEM certificate (chain) of this acker: serve gRPC over TLS"),
    _Flag("tls_key", _optional_path, "PEM private key of --tls-cert"),
    _Flag("tls_client_ca", _optional_path, "PEM CA bundle: require client certificates it signed (mutual TLS)"),
    _Flag("metrics_tls_cert", _optional_path, "PEM certificate: serve /metrics over HTTPS"),
    _Flag("metrics_tls_key", _optional_path, "PEM private key of --metrics-tls-cert"),
    _Flag("metrics_tls_client_ca", _optional_path, "PEM CA bundle: require scrapers' certificates it signed"),
    _Flag(
        "peer_tls_ca",
        _optional_path,
        "PEM CA bundle that signed the other ackers' certificates, for the handoffs of a layout change "
        "(default: --tls-client-ca, else the system's roots)",
    ),
    _Flag(
        "peer_tls_cert",
        _optional_path,
        "PEM client certificate this acker presents to the other ackers under mutual TLS (default: --tls-cert)",
    ),
    _Flag("peer_tls_key", _optional_path, "PEM private key of --peer-tls-cert"),
    _Flag(
        "peer_server_name",
        _optional_text,
        "name to check the other ackers' certificates against instead of the host of their layout address",
    ),
    _Flag(
        "auth_tokens", _optional_path, "file of 'name sha256-hex' lines, the accepted bearer tokens; reloaded on SIGHUP"
    ),
    _Flag(
        "auth_policy", _optional_path, "TOML file: what each principal may do (docs/security.md); reloaded on SIGHUP"
    ),
)


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; defaults come from ``environ`` (ACKER_*) when set there."""
    parser = argparse.ArgumentParser(
        prog="acker-server",
        description="Run one acker shard: Storm's XOR tuple-tree tracking as a gRPC service.",
        epilog="Every flag falls back to the environment variable shown; a flag on the command line wins. "
        f"{FROM_HOSTNAME_ENV}=1 takes the shard index from a host name ending in -<ordinal> "
        "(a Kubernetes StatefulSet pod).",
    )
    try:
        env = environ_with_shard_index(os.environ if environ is None else environ)
    except ShardIdentityError as exc:
        parser.error(str(exc))
    for flag in _FLAGS:
        env_name = _env_name(flag.name)
        default = _DEFAULTS[flag.name]
        if env_name in env:
            try:
                default = flag.type(env[env_name])
            except ValueError:
                parser.error(f"{env_name}={env[env_name]!r} is not a valid value for --{_dashed(flag.name)}")
        shown = {"metrics_port": "off", "metrics_host": "same as --host"}.get(flag.name, _DEFAULTS[flag.name])
        if shown is None:
            shown = "off"
        parser.add_argument(
            f"--{_dashed(flag.name)}",
            dest=flag.name,
            type=flag.type,
            default=default,
            help=f"{flag.help} [env {env_name}; default {shown}]",
        )
    log_default = env.get(_env_name("log_level"), "INFO")
    parser.add_argument(
        "--log-level",
        default=log_default,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help=f"logging threshold for stderr [env {_env_name('log_level')}; default INFO]",
    )
    parser.add_argument("--version", action="version", version=f"acker-server {__version__}")
    return parser


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build the (validated) server configuration from parsed arguments."""
    return ServerConfig(**{flag.name: getattr(args, flag.name) for flag in _FLAGS})


EXIT_WITH_PARENT_ENV = "ACKER_EXIT_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def exit_with_parent(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """With ``ACKER_EXIT_WITH_PARENT=<pid>`` (set by acker-cluster), get SIGTERM when that parent dies (Linux).

    A launcher killed with ``kill -9`` signals no one; the kernel's parent-death
    signal does. Set here, in the server, rather than by the launcher between fork
    and exec: Python code run in a forked child (``preexec_fn``) also runs the
    launcher's at-fork hooks, which can disturb sockets it shares with the parent.
    If the parent is already gone, stop at once.
    """
    parent = environ.get(EXIT_WITH_PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if str(os.getppid()) != parent.strip():
        raise SystemExit(f"acker-server: the launcher (pid {parent}) is gone; not starting")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, serve until SIGTERM/SIGINT; exit 0 on a clean stop, 2 on bad settings, a taken port or a corrupt layout file."""
    exit_with_parent()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level, format="%(message)s", stream=sys.stderr)
    try:
        serve(config)
    except (PortInUse, LayoutFileError) as exc:
        print(f"acker-server: {exc}", file=sys.stderr)
        return 2
    return 0
