"""`acker-healthcheck`: probe an acker's standard gRPC health service, exit 0 iff SERVING.

Container images and operators' machines cannot be assumed to carry the usual
`grpc_health_probe` binary, so the package ships its own probe. It speaks
`grpc.health.v1.Health/Check`, which every acker serves for the service name ""
(the whole server) and answers SERVING until shutdown begins.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity, open_channel
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["probe", "is_serving", "main", "EXIT_SERVING", "EXIT_NOT_SERVING"]

EXIT_SERVING = 0
EXIT_NOT_SERVING = 1


def probe(address: str, service: str = "", timeout: float = 2.0, security: ChannelSecurity | None = None) -> str:
    """Return the health status name ("SERVING", "NOT_SERVING", ...) reported by `address`.

    Raises grpc.RpcError when the acker cannot be reached within `timeout`
    seconds (UNAVAILABLE for a closed port, DEADLINE_EXCEEDED for a hung one).
    """
    with open_channel(address, security, grpc_options.client_options()) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # wait_for_ready stays off: a closed port must fail now, not at the deadline.
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def is_serving(address: str, service: str = "", timeout: float = 2.0, security: ChannelSecurity | None = None) -> bool:
    """True iff `address` answers the health check with SERVING within `timeout` seconds."""
    try:
        return probe(address, service, timeout, security) == "SERVING"
    except grpc.RpcError:
        return False


def _default_address() -> str:
    """The address to probe when none is given: this machine's acker, as the image configures it."""
    explicit = os.environ.get("ACKER_HEALTHCHECK_ADDRESS")
    if explicit:
        return explicit
    # Inside the container the server binds ACKER_HOST (often 0.0.0.0) on ACKER_PORT;
    # loopback reaches it either way.
    return f"127.0.0.1:{os.environ.get('ACKER_PORT', '7100')}"


def _parser() -> argparse.ArgumentParser:
    """Command-line flags, each with an environment fallback named in --help."""
    parser = argparse.ArgumentParser(
        prog="acker-healthcheck",
        description="Ask an acker's grpc.health.v1 service for its status. "
        "Exit 0 if SERVING, 1 otherwise (not serving, unreachable or timed out).",
    )
    parser.add_argument(
        "--address",
        default=_default_address(),
        help="host:port of the acker (env ACKER_HEALTHCHECK_ADDRESS, else 127.0.0.1:$ACKER_PORT, "
        "else 127.0.0.1:7100; default: %(default)s)",
    )
    parser.add_argument(
        "--service",
        default=os.environ.get("ACKER_HEALTHCHECK_SERVICE", ""),
        help='health service name; "" is the whole server (env ACKER_HEALTHCHECK_SERVICE; default: "")',
    )
    env = ChannelSecurity.from_env(prefix="ACKER_HEALTHCHECK_")
    for flag, default, what in (
        ("--tls-ca", env.tls_ca, "PEM CA that signed the acker's certificate: probe over TLS"),
        ("--tls-cert", env.tls_cert, "PEM client certificate, for an acker that requires mutual TLS"),
        ("--tls-key", env.tls_key, "PEM key of --tls-cert"),
        ("--server-name", env.server_name, "name to check the acker's certificate against (default: the host)"),
    ):
        env_name = "ACKER_HEALTHCHECK_" + flag[2:].upper().replace("-", "_")
        parser.add_argument(flag, default=default, help=f"{what} (env {env_name})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("ACKER_HEALTHCHECK_TIMEOUT", "2")),
        help="seconds to wait for the answer (env ACKER_HEALTHCHECK_TIMEOUT; default: %(default)s)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the probe; print the status on stdout (or the failure on stderr) and return the exit code."""
    args = _parser().parse_args(argv)
    try:
        security = ChannelSecurity(
            tls=bool(args.tls_ca or args.tls_cert),
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            server_name=args.server_name,
        )
    except ValueError as exc:
        print(f"acker-healthcheck: {exc}", file=sys.stderr)
        return EXIT_NOT_SERVING
    try:
        status = probe(args.address, args.service, args.timeout, security)
    except grpc.RpcError as err:
        code = err.code().name if hasattr(err, "code") else "UNKNOWN"
        details = err.details() if hasattr(err, "details") else str(err)
        print(f"acker-healthcheck: {args.address}: {code}: {details}", file=sys.stderr)
        return EXIT_NOT_SERVING
    print(f"{args.address}: {status}")
    return EXIT_SERVING if status == "SERVING" else EXIT_NOT_SERVING


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
