"""acker-bench --mode mass-timeout: N trees expire at once while probes time the acker's answers.

One acker (``AckerServer`` in this process, on a free port) runs on an injected
clock. N trees are initialised and never acked; a raw Subscribe of their spout
is open. Then the clock jumps past the timeout, and while the acker expires all
N trees at once a probe thread keeps calling the gRPC health check and a small
Apply on connections of their own, recording each latency. The run ends when the
subscriber has counted N TIMED_OUT outcomes (or a deadline passes).

Figures: worst and p99 health-check and Apply latency during the expiry, outcomes
delivered, outcomes dropped, and how long the expiry took.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import Outcome
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["MassTimeoutResult", "run_mass_timeout"]

SPOUT = "mass-timeout"
_PROBE_SPOUT = "probe"
_INIT_BATCH = 65_536
_PROBE_DEADLINE = 5.0  # seconds: a probe slower than this counts as failed (a liveness probe would fail too)


@dataclass
class MassTimeoutResult:
    """What one mass-timeout run measured (latencies in milliseconds)."""

    engine: str
    trees: int
    outcomes_delivered: int = 0
    outcomes_dropped: int = 0
    expiry_seconds: float = 0.0
    health_checks: int = 0
    health_failed: int = 0
    applies: int = 0
    apply_failed: int = 0
    health_ms: list[float] = field(default_factory=list, repr=False)
    apply_ms: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        """The figures as one JSON-ready dict."""

        def worst(xs: list[float]) -> float | None:
            return round(max(xs), 2) if xs else None

        def p99(xs: list[float]) -> float | None:
            return round(float(np.percentile(xs, 99)), 2) if xs else None

        return {
            "mode": "mass-timeout",
            "engine": self.engine,
            "trees": self.trees,
            "outcomes_delivered": self.outcomes_delivered,
            "outcomes_dropped": self.outcomes_dropped,
            "expiry_seconds": round(self.expiry_seconds, 3),
            "health_checks": self.health_checks,
            "health_failed": self.health_failed,
            "health_worst_ms": worst(self.health_ms),
            "health_p99_ms": p99(self.health_ms),
            "applies": self.applies,
            "apply_failed": self.apply_failed,
            "apply_worst_ms": worst(self.apply_ms),
            "apply_p99_ms": p99(self.apply_ms),
        }


class _Subscriber(threading.Thread):
    """A raw Subscribe stream that counts TIMED_OUT outcomes and reported drops."""

    def __init__(self, channel: grpc.Channel, expected: int) -> None:
        super().__init__(name="mass-timeout-subscriber", daemon=True)
        self.call = acker_pb2_grpc.AckerStub(channel).Subscribe(acker_pb2.SubscribeRequest(spout=SPOUT))
        self.expected = expected
        self.timed_out = 0
        self.dropped = 0
        self.confirmed = threading.Event()  # the first message: the subscription is in place
        self.done = threading.Event()
        self.last_at = 0.0

    def run(self) -> None:
        timed_out_code = int(Outcome.TIMED_OUT)
        try:
            for message in self.call:
                self.confirmed.set()
                self.dropped += message.dropped
                if message.outcomes:
                    self.timed_out += sum(1 for o in message.outcomes if o == timed_out_code)
                    self.last_at = time.perf_counter()
                if self.timed_out >= self.expected:
                    break
        except grpc.RpcError:
            pass  # cancelled at the end of the run
        finally:
            self.confirmed.set()
            self.done.set()


def _probe(address: str, stop: threading.Event, result: MassTimeoutResult, interval: float) -> None:
    """Health check and a one-tree Apply, each on its own connection, every ``interval`` seconds."""
    options = grpc_options.client_options()
    with grpc.insecure_channel(address, options=options) as hc, grpc.insecure_channel(address, options=options) as ac:
        health = health_pb2_grpc.HealthStub(hc)
        acker = acker_pb2_grpc.AckerStub(ac)
        root = 1 << 62  # far from the bench's trees (1..N)
        while not stop.is_set():
            began = time.perf_counter()
            try:
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=_PROBE_DEADLINE)
                result.health_ms.append((time.perf_counter() - began) * 1e3)
            except grpc.RpcError:
                result.health_failed += 1
            result.health_checks += 1
            root += 1
            # A tree that starts and completes in one call (init v, ack v): Apply's full path.
            request = acker_pb2.ApplyRequest(
                kinds=[acker_pb2.OP_KIND_INIT, acker_pb2.OP_KIND_ACK],
                root_ids=[root, root],
                values=[7, 7],
                spouts=[_PROBE_SPOUT],
            )
            began = time.perf_counter()
            try:
                acker.Apply(request, timeout=_PROBE_DEADLINE)
                result.apply_ms.append((time.perf_counter() - began) * 1e3)
            except grpc.RpcError:
                result.apply_failed += 1
            result.applies += 1
            stop.wait(interval)


def run_mass_timeout(
    trees: int,
    engine: str = "native",
    *,
    message_timeout: float = 6.0,
    retain_outcomes: int = 100_000,
    probe_interval: float = 0.01,
    deadline: float | None = None,
) -> MassTimeoutResult:
    """Start an acker, let ``trees`` trees expire at once while probing it; return what was measured."""
    from acker_client.testing import ManualClock

    from acker_service.config import ServerConfig
    from acker_service.server import AckerServer

    clock = ManualClock()
    config = ServerConfig(
        port=0, message_timeout=message_timeout, engine=engine, max_batch=_INIT_BATCH, retain_outcomes=retain_outcomes
    )
    result = MassTimeoutResult(engine=engine, trees=trees)
    with AckerServer(config, clock=clock) as server:
        address = server.address
        with grpc.insecure_channel(address, options=grpc_options.client_options()) as channel:
            subscriber = _Subscriber(channel, trees)
            subscriber.start()
            if not subscriber.confirmed.wait(10):
                raise TimeoutError("the Subscribe stream did not open within 10 s")
            stub = acker_pb2_grpc.AckerStub(channel)
            roots = np.arange(1, trees + 1, dtype=np.uint64)
            for start in range(0, trees, _INIT_BATCH):
                chunk = roots[start : start + _INIT_BATCH]
                stub.Apply(
                    acker_pb2.ApplyRequest(
                        kinds=[acker_pb2.OP_KIND_INIT] * len(chunk),
                        root_ids=chunk.tolist(),
                        values=[0x5EED] * len(chunk),
                        spouts=[SPOUT],
                    ),
                    timeout=60,
                )
            stop = threading.Event()
            probe = threading.Thread(
                target=_probe, args=(address, stop, result, probe_interval), name="mass-timeout-probe", daemon=True
            )
            probe.start()
            time.sleep(0.2)  # a few probes before the expiry, so the connections are warm
            result.health_ms.clear()
            result.apply_ms.clear()
            result.health_checks = result.applies = 0
            began = time.perf_counter()
            # Every tree is due now; the acker's own ticker finds it out, as in production.
            clock.advance(message_timeout + config.rotation_period)
            limit = deadline if deadline is not None else 30.0 + trees / 10_000
            subscriber.done.wait(limit)
            result.expiry_seconds = max(0.0, (subscriber.last_at or time.perf_counter()) - began)
            time.sleep(0.1)  # probes just after the last outcome count too
            stop.set()
            probe.join()
            subscriber.call.cancel()
            subscriber.join(5)
        result.outcomes_delivered = subscriber.timed_out
        result.outcomes_dropped = max(subscriber.dropped, int(server.call(lambda: server.hub.dropped_total)))
    return result
