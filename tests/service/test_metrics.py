"""Prometheus metrics of a real server, read back over HTTP and from its registry."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import grpc
import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind
from prometheus_client.parser import text_string_to_metric_families

from acker_service.metrics import ExactHistogram

INIT, ACK, FAIL, RESET = (int(k) for k in OpKind)


def scrape(server) -> str:
    """The /metrics page of a server."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Parse an exposition into {(sample name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.reference_engine
def test_ledger_metrics_read_back_over_http(make_server, connect, apply, clock, engine):
    """Operations, outcomes, gauges and the exact latency histogram match what the test did."""
    server = make_server(clock=clock, metrics_port=0, message_timeout=10.0, retain_outcomes=2)
    stub = connect(server)
    apply(stub, [(INIT, 1, 5), (INIT, 2, 5), (INIT, 3, 5), (INIT, 4, 5), (ACK, 99, 1)])
    clock.advance(0.3)
    # The second ACK of root 1 comes after its tree ended: it makes an orphan entry.
    apply(stub, [(ACK, 1, 5), (FAIL, 2, 0), (RESET, 3, 0), (ACK, 1, 5), (INIT, 3, 5)])  # late ack, dup init
    clock.advance(1.7)
    apply(stub, [(ACK, 3, 4)], dedup_keys=[8])
    apply(stub, [(ACK, 3, 4)], dedup_keys=[8])  # deduplicated
    apply(stub, [(ACK, 3, 1)], dedup_keys=[9])
    m = samples(scrape(server))
    assert m[("acker_trees_initialized_total", ())] == 4
    kinds = ("init", "ack", "fail", "reset_timeout")
    ops = {kind: m[("acker_operations_total", (("kind", kind),))] for kind in kinds}
    assert ops == {"init": 4, "ack": 5, "fail": 1, "reset_timeout": 1}
    assert m[("acker_operations_deduplicated_total", ())] == 1
    assert m[("acker_duplicate_inits_total", ())] == 1
    outcomes = {o: m[("acker_outcomes_total", (("outcome", o),))] for o in ("acked", "failed", "timed_out")}
    assert outcomes == {"acked": 2, "failed": 1, "timed_out": 0}
    assert (m[("acker_pending_trees", ())], m[("acker_orphan_entries", ())]) == (1, 2)  # roots 99 and 1
    assert m[("acker_outcomes_retained", ())] == 2
    # Three outcomes and one timeout reset (root 3) for "s", retention 2, no subscriber.
    assert m[("acker_outcomes_dropped_total", ())] == 2
    # Latencies: root 1 acked at 0.3 s, root 2 failed at 0.3 s, root 3 acked at 2.0 s.
    bucket = lambda le: m[("acker_complete_latency_seconds_bucket", (("le", le),))]  # noqa: E731
    assert (bucket("0.25"), bucket("0.5"), bucket("1.0"), bucket("2.5"), bucket("+Inf")) == (0, 2, 2, 3, 3)
    assert m[("acker_complete_latency_seconds_sum", ())] == pytest.approx(2.6)
    assert m[("acker_apply_batch_operations_count", ())] == 5
    assert m[("acker_apply_batch_operations_sum", ())] == 13
    assert (
        m[
            (
                "acker_build_info",
                (
                    ("engine", engine),
                    ("shard_count", "1"),
                    ("shard_index", "0"),
                    ("version", __import__("acker_service").__version__),
                ),
            )
        ]
        == 1
    )
    assert m[("process_resident_memory_bytes", ())] > 0


def test_timeouts_and_orphans_are_counted(make_server, connect, apply, clock):
    """Expired trees count as timed_out, expired spout-less entries as orphaned."""
    server = make_server(clock=clock, message_timeout=1.0)
    stub = connect(server)
    apply(stub, [(INIT, 1, 5), (ACK, 2, 5)])
    clock.advance(2.5)
    server.advance()
    assert server.metrics.sample("acker_outcomes_total", {"outcome": "timed_out"}) == 1
    assert server.metrics.sample("acker_orphaned_total") == 1
    assert server.metrics.sample("acker_pending_trees") == 0
    assert server.metrics.sample("acker_complete_latency_seconds_count") == 1


def test_grpc_server_metrics_by_method_and_code(make_server, connect, apply):
    """grpc_server_* count unary and streaming calls with their final codes, including aborted ones."""
    server = make_server()
    stub = connect(server)
    apply(stub, [(INIT, 1, 5)])
    for request in (
        acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[0], values=[1], spouts=["s"]),
        acker_pb2.ApplyRequest(kinds=[ACK] * 2, root_ids=[1], values=[1, 1]),
    ):
        with pytest.raises(grpc.RpcError):
            stub.Apply(request, timeout=10)
    old = stub.Subscribe(acker_pb2.SubscribeRequest(spout="s"), timeout=30)
    next(old)
    new = stub.Subscribe(acker_pb2.SubscribeRequest(spout="s"), timeout=30)
    next(new)
    with pytest.raises(grpc.RpcError):
        next(old)  # ABORTED by the takeover
    new.cancel()
    # Stopping before the server saw the cancel would end the stream as UNAVAILABLE instead.
    deadline = time.monotonic() + 30
    while server.metrics.sample("acker_subscribers") != 0:
        assert time.monotonic() < deadline, "the server never saw the cancelled stream end"
        time.sleep(0.01)
    labels = {"grpc_service": "acker_service.v1.Acker"}
    apply_labels = {**labels, "grpc_type": "UNARY", "grpc_method": "Apply"}
    sub_labels = {**labels, "grpc_type": "SERVER_STREAM", "grpc_method": "Subscribe"}

    def sample(name, **extra):
        return server.metrics.sample(name, extra)

    # A handler's code is recorded as it finishes, which may be just after the
    # client saw the status: stopping the server waits for every handler.
    server.stop(grace=5.0)
    assert sample("grpc_server_started_total", **apply_labels) == 3
    assert sample("grpc_server_handled_total", **apply_labels, grpc_code="OK") == 1
    assert sample("grpc_server_handled_total", **apply_labels, grpc_code="INVALID_ARGUMENT") == 2
    assert sample("grpc_server_handling_seconds_count", **apply_labels) == 3
    assert sample("grpc_server_started_total", **sub_labels) == 2
    assert sample("grpc_server_handled_total", **sub_labels, grpc_code="ABORTED") == 1
    assert sample("grpc_server_handled_total", **sub_labels, grpc_code="CANCELLED") == 1
    assert server.metrics.sample("acker_subscribers") == 0


def test_two_servers_keep_separate_registries(make_server, connect, apply):
    """Metrics of one server do not leak into another in the same process."""
    first, second = make_server(), make_server()
    apply(connect(first), [(INIT, 1, 5)])
    assert first.metrics.sample("acker_trees_initialized_total") == 1
    assert second.metrics.sample("acker_trees_initialized_total") == 0


def test_exact_histogram_counts_every_value_at_bucket_edges():
    """Values equal to a bound fall in that bucket (Prometheus 'le'), and every value is counted."""
    histogram = ExactHistogram("h", "test", (1.0, 2.0))
    histogram.observe_many([0.5, 1.0, 1.5, 2.0, 7.0])
    histogram.observe(1.0)
    family = histogram.family()
    counts = {s.labels.get("le"): s.value for s in family.samples if s.name == "h_bucket"}
    assert counts == {"1.0": 3, "2.0": 5, "+Inf": 6}
    assert [s.value for s in family.samples if s.name == "h_sum"] == [13.0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) missing")
def test_exposition_passes_promtool_lint(make_server, connect, apply):
    """The /metrics page passes `promtool check metrics` (naming and format rules)."""
    server = make_server(metrics_port=0)
    apply(connect(server), [(INIT, 1, 5), (ACK, 1, 5)])
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=scrape(server), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
