"""The acker's Prometheus metrics: one registry per server, ledger counters read at scrape time.

The ledger and the outcome hub live on the server's event loop; scrapes come
from the metrics HTTP thread. The collector below therefore reads only plain
ints (ledger stats, hub counters, a pending/orphan snapshot the loop refreshes)
and copies of small numpy arrays; it never iterates a ledger structure. The one
count over the pending trees (their ages) is handed to the event loop as a call
and awaited with a bound (see ``AckerMetrics.tree_ages``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ._version import __version__
from .moving.catchup import CatchUp
from .moving.transfers import Transfers
from .outcome_hub import OutcomeHub
from .reference_ledger import LedgerStats

__all__ = ["AckerMetrics", "ExactHistogram", "LATENCY_BUCKETS", "BATCH_SIZE_BUCKETS", "MetricsHttpServer"]

log = logging.getLogger("acker_service")

# What the server hands the collector to count pending trees by age at scrape time:
# it runs the count on the event loop (the only thread that touches the ledger).
# It returns the bucket bounds, the count per bucket (then above all), the age sum, and the oldest tree's age.
TreeAges = Callable[[], tuple[Sequence[float], list[int], float, float]]

# fmt: off
# Init-to-outcome time: sub-millisecond local trees up to the longest sensible timeouts.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0)
BATCH_SIZE_BUCKETS = (1, 8, 64, 256, 1024, 4096, 16384, 65536)
GRPC_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0, 10.0)
# fmt: on


class ExactHistogram:
    """A histogram that observes a whole array at once (numpy), so every value is counted.

    Written from one thread; :meth:`family` may run on another and sees a
    consistent-enough copy (bucket counts are copied, then made cumulative).
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # last slot: above every bound
        self._sum = 0.0

    def observe_many(self, values: Sequence[float] | np.ndarray) -> None:
        """Count every value (Prometheus buckets are "less than or equal")."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            return
        slots = np.searchsorted(self._bounds, arr, side="left")
        self._counts += np.bincount(slots, minlength=len(self._counts))
        self._sum += float(arr.sum())

    def observe(self, value: float) -> None:
        """Count one value."""
        self.observe_many((value,))

    def family(self) -> HistogramMetricFamily:
        """The histogram as a Prometheus metric family (cumulative buckets)."""
        cumulative = np.cumsum(self._counts.copy()).tolist()
        bounds = [repr(float(b)) for b in self._bounds] + ["+Inf"]
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=list(zip(bounds, cumulative)), sum_value=self._sum
        )


class _AckerCollector(Collector):
    """Ledger and hub counters and gauges, computed when Prometheus scrapes."""

    def __init__(self, metrics: AckerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator:
        m = self._m
        s: LedgerStats = m.ledger_stats
        hub = m.hub
        yield CounterMetricFamily("acker_trees_initialized", "Trees whose init was applied.", value=s.inits)
        ops = CounterMetricFamily("acker_operations", "Ledger operations applied, by kind.", labels=["kind"])
        by_kind = (("init", s.inits), ("ack", s.acks), ("fail", s.fails), ("reset_timeout", s.resets))
        for kind, value in by_kind:
            ops.add_metric([kind], value)
        yield ops
        yield CounterMetricFamily(
            "acker_operations_deduplicated",
            "ACKs ignored because their dedup key was already applied.",
            value=s.deduplicated,
        )
        yield CounterMetricFamily(
            "acker_duplicate_inits",
            "INITs ignored because the tree's init was already applied.",
            value=s.duplicate_inits,
        )
        outcomes = CounterMetricFamily("acker_outcomes", "Tree outcomes, by outcome.", labels=["outcome"])
        for name, value in (("acked", s.acked), ("failed", s.failed), ("timed_out", s.timed_out)):
            outcomes.add_metric([name], value)
        yield outcomes
        yield CounterMetricFamily(
            "acker_orphaned",
            "Entries expired with no spout: acks whose init never came, and acks or fails that arrived after "
            "their tree ended.",
            value=s.orphaned,
        )
        yield GaugeMetricFamily("acker_pending_trees", "Trees initialised and not yet ended.", value=m.pending)
        yield GaugeMetricFamily(
            "acker_orphan_entries",
            "Entries created by acks or fails whose init has not arrived.",
            value=m.orphans,
        )
        yield GaugeMetricFamily("acker_subscribers", "Open Subscribe streams.", value=hub.subscribers)
        yield GaugeMetricFamily(
            "acker_spouts_tracked",
            "Spouts with outcome state on this acker; idle ones are forgotten after --retain-seconds.",
            value=hub.tracked_spouts,
        )
        yield GaugeMetricFamily(
            "acker_outcomes_retained", "Outcomes held for delivery or resume, all spouts.", value=hub.retained
        )
        yield CounterMetricFamily(
            "acker_outcomes_dropped",
            "Outcomes evicted from retention before any subscriber received them.",
            value=hub.dropped_total,
        )
        yield m.complete_latency.family()
        yield m.batch_operations.family()
        yield CounterMetricFamily(
            "acker_trees_lifetime_exceeded",
            "Trees ended LIFETIME_EXCEEDED at --max-tree-lifetime (also counted as timed_out).",
            value=s.outlived,
        )
        yield CounterMetricFamily(
            "acker_trees_force_failed",
            "Trees an operator ended FAILED with ForceFail (also counted as failed).",
            value=s.force_failed,
        )
        yield from self._transfers()
        yield from self._catchup()
        yield from self._tree_ages()

    def _transfers(self) -> Iterator[CounterMetricFamily]:
        """Trees and entries copied in and out by way: the terms of docs/acker-semantics.md's conservation identity."""
        t = self._m.transfers
        trees_in = CounterMetricFamily(
            "acker_trees_copied_in",
            "Pending trees taken in from another acker, by way: handoff (a layout change) or catchup (a partner's "
            "copy after a restart).",
            labels=["via"],
        )
        entries_in = CounterMetricFamily(
            "acker_entries_copied_in",
            "Entries taken in from another acker (pending trees and entries awaiting their init), by way.",
            labels=["via"],
        )
        for via, trees, entries in t.copied_in():
            trees_in.add_metric([via], trees)
            entries_in.add_metric([via], entries)
        trees_out = CounterMetricFamily(
            "acker_trees_copied_out",
            "Pending trees copied to another acker, by way: handoff (removed here at a layout change's cut) or "
            "snapshot (a copy for a restarted partner, kept here).",
            labels=["via"],
        )
        entries_out = CounterMetricFamily(
            "acker_entries_copied_out",
            "Entries copied to another acker (pending trees and entries awaiting their init), by way.",
            labels=["via"],
        )
        for via, trees, entries in t.copied_out():
            trees_out.add_metric([via], trees)
            entries_out.add_metric([via], entries)
        yield trees_in
        yield entries_in
        yield trees_out
        yield entries_out

    def _catchup(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """A restarted replica's catch-up (docs/acker-semantics.md, "Replicated trees"); nothing without one."""
        c = self._m.catchup
        if c is None or not c.enabled:
            return
        yield GaugeMetricFamily(
            "acker_catchup_state",
            "1 while this acker holds Apply to copy its ranges from its partners (restarted, --replicas 2), "
            "0 once caught up.",
            value=1 if c.holding else 0,
        )
        yield CounterMetricFamily(
            "acker_catchup_entries",
            "Entries copied from partners by the catch-up (pending trees and entries awaiting their init).",
            value=c.copied_entries,
        )
        yield GaugeMetricFamily(
            "acker_catchup_held_requests",
            "Apply requests (one part per range) held until their range is copied.",
            value=c.held.requests,
        )
        yield GaugeMetricFamily(
            "acker_catchup_held_operations",
            "Operations held until their range is copied (bounded by --max-held-operations).",
            value=c.held.operations,
        )
        yield CounterMetricFamily(
            "acker_catchup_refused",
            "Apply requests refused UNAVAILABLE during the catch-up: the held operations were at their bound.",
            value=c.refused,
        )
        yield CounterMetricFamily(
            "acker_catchup_lost_ranges",
            "Ranges whose partner had lost them too (both copies died): nothing to copy.",
            value=c.lost_ranges,
        )

    def _tree_ages(self) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
        """Pending trees by age and the oldest one's age, counted now; nothing (both left out) if the shard cannot answer."""
        source = self._m.tree_ages
        if source is None:
            return
        try:
            bounds, counts, total, oldest = source()
        except Exception as exc:  # a stopped or stalled server: the other metrics still count
            log.warning("pending tree ages not counted for this scrape: %s", exc or type(exc).__name__)
            return
        cumulative = np.cumsum(counts).tolist()
        yield HistogramMetricFamily(
            "acker_pending_tree_age_seconds",
            "Age (time since init) of the trees pending now, counted at scrape time.",
            buckets=list(zip([repr(float(b)) for b in bounds] + ["+Inf"], cumulative)),
            sum_value=total,
        )
        # The autoscaling signal beside acker_pending_trees: how long the oldest pending tree has waited.
        yield GaugeMetricFamily(
            "acker_oldest_pending_tree_age_seconds",
            "Age (time since init) of the oldest tree pending now, 0 with none; counted at scrape time.",
            value=oldest,
        )


class AckerMetrics:
    """All metrics of one acker server, on a registry of its own."""

    def __init__(
        self, ledger_stats: LedgerStats, hub: OutcomeHub, *, shard_index: int, shard_count: int, engine: str
    ) -> None:
        self.registry = CollectorRegistry()
        self.ledger_stats = ledger_stats
        self.hub = hub
        # Refreshed by the event loop after every ledger change (see refresh_gauges).
        self.pending = 0
        self.orphans = 0
        # Set by the server: counts pending trees by age on its event loop (see TreeAges).
        self.tree_ages: TreeAges | None = None
        # Set by the shard: its catch-up (read at scrape time; None or not enabled: no catch-up metrics).
        self.catchup: CatchUp | None = None
        # Trees and entries copied in and out (plain ints the shard's event loop increments).
        self.transfers = Transfers()
        self.complete_latency = ExactHistogram(
            "acker_complete_latency_seconds",
            "Time from a tree's init to its outcome, every tree (exact, not sampled).",
            LATENCY_BUCKETS,
        )
        self.batch_operations = ExactHistogram(
            "acker_apply_batch_operations",
            "Operations per Apply request (a unary call or an ApplyStream message).",
            BATCH_SIZE_BUCKETS,
        )
        self.registry.register(_AckerCollector(self))
        ProcessCollector(registry=self.registry)
        Info("acker_build", "Version, shard and ledger engine of this acker.", registry=self.registry).info(
            {
                "version": __version__,
                "shard_index": str(shard_index),
                "shard_count": str(shard_count),
                "engine": engine,
            }
        )
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.grpc_started = Counter(
            "grpc_server_started", "RPCs started on the server.", labels, registry=self.registry
        )
        self.grpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code.",
            labels + ["grpc_code"],
            registry=self.registry,
        )
        self.grpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time to handle an RPC (streams: until the stream ends).",
            labels,
            buckets=GRPC_SECONDS_BUCKETS,
            registry=self.registry,
        )

    def refresh_gauges(self, pending: int, orphans: int) -> None:
        """Store the ledger's sizes for the next scrape (called on the event loop)."""
        self.pending = pending
        self.orphans = orphans

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample's current value by name (for tests and diagnostics)."""
        return self.registry.get_sample_value(name, labels or {})


class MetricsHttpServer:
    """prometheus_client's HTTP exposition of one registry, on its own daemon thread.

    With ``certfile``/``keyfile`` it serves HTTPS (prometheus_client's own TLS
    support); with ``client_cafile`` too, scrapers must present a certificate
    that CA signed.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        client_cafile: str | None = None,
    ) -> None:
        self._server, self._thread = start_http_server(
            port,
            addr=host,
            registry=registry,
            certfile=certfile,
            keyfile=keyfile,
            client_cafile=client_cafile,
            client_auth_required=client_cafile is not None,
        )
        self.port: int = self._server.server_port
        self.host = host
        self.scheme = "https" if certfile else "http"

    def close(self) -> None:
        """Stop serving and release the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
