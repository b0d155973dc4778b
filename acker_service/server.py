"""One acker shard: a grpc.aio server on its own thread and event loop, with health, reflection and metrics.

The :class:`~acker_service.shard.Shard` is touched only from that event loop
(RPC handlers and the rotation ticker), so it needs no locks. grpc.aio keeps open
Subscribe streams from starving Apply: a stream waiting for outcomes holds no
thread.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .auth import Authenticator, AuthInterceptor
from .config import ServerConfig
from .decode_guard import DecodeGuardInterceptor
from .interceptors import MetricsInterceptor
from .ledger import Ledger
from .metrics import AckerMetrics, MetricsHttpServer
from .moving.catchup_peer import catch_up, peer_channel
from .moving.peers import catchup_security
from .operate import AGE_BUCKETS
from .outcome_hub import OutcomeHub
from .reflection import enable_reflection
from .servicer import AckerServicer, add_acker_servicer
from .shard import EXPIRY_SLICE, Shard

__all__ = ["AckerServer", "PortInUse", "serve", "SERVICE_NAME", "start_line"]

log = logging.getLogger("acker_service")

SERVICE_NAME = acker_pb2.DESCRIPTOR.services_by_name["Acker"].full_name
T = TypeVar("T")
# The ticker wakes at least this often, so retention ages out promptly even with long timeouts.
_MAX_TICK_SECONDS = 1.0
# Pause between expiry slices. Not sleep(0): the loop must block in its selector
# now and then, which releases the GIL, or gRPC's completion-queue thread (which
# hands new calls and health checks to the loop) waits for the switch interval.
_EXPIRY_PAUSE_SECONDS = 0.001
# An expiry of at least this many trees at once is logged as a mass timeout.
MASS_TIMEOUT_LOG_THRESHOLD = 10_000


class PortInUse(OSError):
    """The gRPC or metrics address could not be bound (another process holds the port)."""


def _host_port(host: str, port: int) -> str:
    """'host:port', with IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _port_in_use_message(address: str) -> str:
    return (
        f"cannot listen on {address}: the port is taken by another process, or the address is not "
        "one of this machine's; choose another --port or stop the other process"
    )


def _cannot_bind(host: str, port: int) -> bool:
    """True if ``host:port`` is taken or not this machine's (a plain bind, as gRPC's, without SO_REUSEPORT).

    A race with another process binding right after this check is still caught
    by gRPC's own bind (with its log line).
    """
    if port == 0:
        return False
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # gRPC reports what it makes of the name
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                    return True
    return False


class AckerServer:
    """An acker shard running in a background thread; ``start()``/``stop()`` or a ``with`` block.

    ``clock`` drives the ledger and outcome retention: tests pass a fake one
    and call :meth:`advance` instead of sleeping.
    """

    def __init__(self, config: ServerConfig, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.shard = Shard(config, clock)
        self.servicer = AckerServicer(self.shard)
        self.auth = (
            Authenticator(config.auth_tokens, config.auth_policy, self.shard.metrics.registry)
            if config.auth_policy
            else None
        )
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._http: MetricsHttpServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._ticker: asyncio.Task | None = None
        self._catchup: asyncio.Task | None = None
        self._done: asyncio.Event | None = None

    @property
    def incarnation(self) -> int:
        """The random id of this server's lifetime (a restarted shard has a new one)."""
        return self.shard.incarnation

    @property
    def ledger(self) -> Ledger:
        """The shard's ledger (touch it only through :meth:`call`)."""
        return self.shard.ledger

    @property
    def hub(self) -> OutcomeHub:
        """The shard's outcome hub (touch it only through :meth:`call`)."""
        return self.shard.hub

    @property
    def metrics(self) -> AckerMetrics:
        """The shard's Prometheus metrics."""
        return self.shard.metrics

    @property
    def address(self) -> str:
        """'host:port' clients connect to (valid after start)."""
        if self.port is None:
            raise RuntimeError("the acker server is not started")
        return _host_port(self.config.host, self.port)

    @property
    def metrics_url(self) -> str | None:
        """The metrics endpoint, or None when metrics are off."""
        if self.metrics_port is None:
            return None
        scheme = "https" if self.config.metrics_tls_cert else "http"
        return f"{scheme}://{_host_port(self.config.effective_metrics_host, self.metrics_port)}/metrics"

    def start(self, timeout: float = 30.0) -> AckerServer:
        """Bind, start serving and report SERVING; raise :class:`PortInUse` if a port is taken."""
        if self._thread is not None:
            raise RuntimeError("the acker server was already started")
        ready = threading.Event()
        outcome: dict[str, BaseException] = {}
        self._thread = threading.Thread(
            target=self._run,
            args=(ready, outcome),
            name=f"acker-shard-{self.config.shard_index}",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"the acker server did not start within {timeout} s")
        if "error" in outcome:
            self._thread.join()
            self._thread = None
            raise outcome["error"]
        # Counted when the registry is collected, on the loop that owns the ledger (never from the HTTP thread).
        self.shard.metrics.tree_ages = self._tree_ages
        c = self.config
        if c.metrics_port is not None:
            try:
                self._http = MetricsHttpServer(
                    self.shard.metrics.registry,
                    c.effective_metrics_host,
                    c.metrics_port,
                    certfile=c.metrics_tls_cert,
                    keyfile=c.metrics_tls_key,
                    client_cafile=c.metrics_tls_client_ca,
                )
            except OSError as exc:
                self.stop(0)
                where = _host_port(c.effective_metrics_host, c.metrics_port)
                raise PortInUse(exc.errno, f"cannot serve metrics on {where}: {exc.strerror or exc}") from exc
            self.metrics_port = self._http.port
        return self

    def _run(self, ready: threading.Event, outcome: dict[str, BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready, outcome))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: threading.Event, outcome: dict[str, BaseException]) -> None:
        try:
            await self._open()
        except BaseException as exc:  # handed to the starting thread, which raises it
            outcome["error"] = exc
            ready.set()
            return
        self._done = asyncio.Event()
        self._ticker = asyncio.create_task(self._tick())
        if self.shard.membership.catchup.holding:
            # Restarted with --replicas 2 and --peers: copy both ranges from the partners (moving/catchup.py).
            self._catchup = asyncio.create_task(
                catch_up(
                    dict(self.shard.membership.catchup.waiting),
                    self.shard.membership.catchup_peers,
                    self.shard.membership.catchup.shard_count,
                    self.shard.membership.install_snapshot,
                    delay=self.config.catchup_delay,
                    give_up_after=self.config.message_timeout,
                    channel=peer_channel(catchup_security(self.config)),
                )
            )
        ready.set()
        await self._done.wait()

    async def _open(self) -> None:
        config = self.config
        address = _host_port(config.host, config.port)
        if _cannot_bind(config.host, config.port):
            # Asked before gRPC binds: its failure also prints a raw C++ log line to stderr.
            raise PortInUse(_port_in_use_message(address))
        server = grpc.aio.server(
            options=grpc_options.server_options(
                config.max_message_bytes,
                max_streams_per_connection=config.max_streams_per_connection,
                min_ping_interval_ms=round(config.min_ping_interval * 1000),
            ),
            # grpc answers RESOURCE_EXHAUSTED above this; open Subscribe streams count too.
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
            # Metrics outermost, so refusals of undecodable requests are counted by code too.
            # Authorization innermost: it sees only requests that decoded.
            interceptors=[MetricsInterceptor(self.shard.metrics), DecodeGuardInterceptor()]
            + ([AuthInterceptor(self.auth)] if self.auth is not None else []),
        )
        add_acker_servicer(self.servicer, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)
        try:
            credentials = server_credentials(config)
            if credentials is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            # grpc reports only "Failed to bind"; with so_reuseport=0 the usual cause is a taken port.
            await server.stop(None)
            raise PortInUse(_port_in_use_message(address)) from exc
        await server.start()
        self._server = server
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def _tick(self) -> None:
        """Rotate the ledger when due and age out retained outcomes."""
        cap = min(_MAX_TICK_SECONDS, self.shard.ledger.rotation_period / 4)
        while True:
            await asyncio.sleep(min(max(self.shard.ledger.seconds_until_rotation(), 0.001), cap))
            try:
                await self._expire_in_slices()
            except Exception:  # a bug here must not stop expiry for good; it is logged and retried
                log.exception("advancing the ledger failed")

    async def _expire_in_slices(self) -> int:
        """Expire what is due one slice at a time, yielding to the loop in between; return how many timed out.

        Health checks, Apply and Subscribe run between slices, so a mass
        timeout delays them by one slice, not by the whole expiry.
        """
        started = time.monotonic()
        total = 0
        while True:
            timed_out, more = self.shard.advance_slice(EXPIRY_SLICE)
            total += timed_out
            if not more:
                break
            await asyncio.sleep(_EXPIRY_PAUSE_SECONDS)
        if total >= MASS_TIMEOUT_LOG_THRESHOLD:
            log.warning(
                "mass timeout: %d trees timed out at once on shard %d, expired in %.2f s; "
                "their spouts get TIMED_OUT and replay them",
                total,
                self.config.shard_index,
                time.monotonic() - started,
            )
        return total

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the server's event loop and return its result (tests, diagnostics)."""
        if self._loop is None or self._done is None:
            raise RuntimeError("the acker server is not running")

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _tree_ages(self) -> tuple[Sequence[float], list[int], float, float]:
        """Pending trees by age, and the oldest one's age, for a metrics scrape (runs on the event loop; bounded wait)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("the acker server is not running")  # a scrape after stop: no coroutine left pending
        counts, total, oldest = self.call(self.shard.tree_ages, timeout=5.0)
        return AGE_BUCKETS, counts, total, oldest

    def reload_auth(self) -> bool:
        """Read the tokens and policy files again (SIGHUP); False if they are broken (the old ones stay)."""
        return self.auth.reload() if self.auth is not None else False

    def advance(self) -> int:
        """Expire what the clock says is due, now; return how many trees timed out."""
        return self.call(self.shard.advance)

    def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, end streams, stop with ``grace`` seconds for running calls, join."""
        if self._http is not None:
            self._http.close()
            self._http = None
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if self._done is not None and not loop.is_closed():
            grace = self.config.grace if grace is None else grace
            asyncio.run_coroutine_threadsafe(self._shutdown(grace), loop).result()
        thread.join()
        self._thread = None

    async def _shutdown(self, grace: float) -> None:
        assert self._server is not None and self._health is not None and self._done is not None
        # Load balancers and health checks see NOT_SERVING before any call is refused.
        await self._health.enter_graceful_shutdown()
        stopping = asyncio.ensure_future(self._server.stop(grace))
        await asyncio.sleep(0)  # new calls are refused from here on
        self.shard.close()
        await stopping
        for task in (self._ticker, self._catchup):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._done.set()

    def __enter__(self) -> AckerServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port (requiring client certificates with --tls-client-ca), or None."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    with open(config.tls_key, "rb") as key, open(config.tls_cert, "rb") as cert:
        pair = (key.read(), cert.read())
    client_ca = None
    if config.tls_client_ca is not None:
        with open(config.tls_client_ca, "rb") as ca:
            client_ca = ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def start_line(server: AckerServer) -> str:
    """The one line logged at start: shard, addresses, timeout, buckets and ledger engine."""
    c = server.config
    index, count = server.shard.membership.place  # the layout file's when it overrode the flags
    metrics = f"metrics on {server.metrics_url}" if server.metrics_url else "metrics off"
    transport = ", mutual TLS" if c.tls_client_ca else ", TLS" if c.tls_cert else ""
    epoch = server.shard.membership.layout.current.epoch
    layout = f", layout epoch {epoch}" if epoch else ""
    return (
        f"acker shard {index}/{count} serving on {server.address}, {metrics}, "
        f"timeout {c.message_timeout:g}s, {c.buckets} buckets, {c.engine} ledger engine{transport}{layout}, "
        # The incarnation lets a launcher tell its own child from another server on the same port.
        f"incarnation {server.incarnation:#018x}"
    )


# How often the main thread of serve() wakes to run signal handlers recorded on other threads.
_SIGNAL_CHECK_SECONDS = 0.2


def serve(config: ServerConfig) -> None:
    """Run one shard until SIGTERM or SIGINT (SIGHUP reloads tokens and policy), then stop with grace."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = AckerServer(config).start()
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: server.reload_auth())
        log.info(start_line(server))
        try:
            # In slices, not one unbounded wait: the kernel may deliver SIGTERM to any
            # thread (gRPC's pollers among them); CPython then only records it, and runs
            # the handler when the main thread next executes Python code. A main thread
            # asleep in one long wait would never see it and the server would not stop.
            while not stop.wait(_SIGNAL_CHECK_SECONDS):
                pass
            index, count = server.shard.membership.place
            log.info("acker shard %d/%d stopping (grace %gs)", index, count, config.grace)
        finally:
            server.stop(config.grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
