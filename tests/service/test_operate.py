"""Inspect, ForceFail, progress timeouts and the tree-age histogram on real acker servers (issue 21)."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind, Outcome

from acker_service.cli import build_parser, config_from_args
from acker_service.config import ConfigError, ServerConfig

INIT, ACK, RESET = int(OpKind.INIT), int(OpKind.ACK), int(OpKind.RESET_TIMEOUT)


def apply(stub, kinds, roots, values, spouts=("orders",)):
    return stub.Apply(acker_pb2.ApplyRequest(kinds=kinds, root_ids=roots, values=values, spouts=list(spouts)))


def first_batch_with_outcomes(stream) -> acker_pb2.OutcomeBatch:
    for batch in stream:
        if batch.root_ids:
            return batch
    raise AssertionError("the stream ended without outcomes")


@pytest.mark.reference_engine
def test_inspect_reports_trees_and_the_oldest(make_server, connect, clock):
    """Each requested root's state in request order, then the oldest pending trees, oldest first."""
    server = make_server(clock=clock, message_timeout=30.0)
    stub = connect(server)
    apply(stub, [INIT, INIT], [11, 12], [5, 5])
    clock.advance(4.0)
    apply(stub, [INIT, ACK, RESET], [13, 11, 11], [5, 1, 0])
    clock.advance(1.0)
    reply = stub.Inspect(acker_pb2.InspectRequest(root_ids=[11, 99], oldest=2))
    tree, absent = reply.trees
    assert (tree.root_id, tree.status, tree.spout) == (11, acker_pb2.TREE_STATUS_PENDING, "orders")
    assert (tree.age_seconds, tree.resets, tree.failed) == (5.0, 1, False)
    assert (absent.root_id, absent.status) == (99, acker_pb2.TREE_STATUS_ABSENT)
    assert [t.root_id for t in reply.oldest] == [11, 12]
    assert (reply.pending_trees, reply.incarnation) == (3, server.incarnation)


def test_inspect_refuses_roots_of_another_shard_and_zero(make_server, connect):
    """The same refusals as Apply: a zero root (INVALID_ARGUMENT), another shard's root (FAILED_PRECONDITION)."""
    stub = connect(make_server(shard_index=0, shard_count=2))
    with pytest.raises(grpc.RpcError) as zero:
        stub.Inspect(acker_pb2.InspectRequest(root_ids=[0]))
    assert zero.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as other:
        stub.Inspect(acker_pb2.InspectRequest(root_ids=[3]))
    assert other.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "shard 1" in other.value.details()
    with pytest.raises(grpc.RpcError) as too_many:
        stub.Inspect(acker_pb2.InspectRequest(oldest=10**6))
    assert too_many.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_inspect_on_a_replica_sees_the_roots_it_follows(make_server, connect):
    """With --replicas 2, shard 1 of 3 answers for roots it follows (shard 0's) and refuses shard 2's, as Apply."""
    stub = connect(make_server(shard_index=1, shard_count=3, replicas=2))
    apply(stub, [INIT], [6], [5])  # 6 % 3 == 0: followed by shard 1
    (tree,) = stub.Inspect(acker_pb2.InspectRequest(root_ids=[6])).trees
    assert tree.status == acker_pb2.TREE_STATUS_PENDING
    with pytest.raises(grpc.RpcError) as other:
        stub.Inspect(acker_pb2.InspectRequest(root_ids=[5]))  # 5 % 3 == 2: kept by shards 2 and 0
    assert other.value.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_force_fail_roots_reaches_the_spout_as_failed_now(make_server, connect, clock):
    """The subscriber gets FAILED for the named pending tree at once; other trees stay pending."""
    server = make_server(clock=clock, message_timeout=30.0)
    stub = connect(server)
    stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout="orders"))
    apply(stub, [INIT, INIT], [21, 22], [5, 5])
    reply = stub.ForceFail(acker_pb2.ForceFailRequest(root_ids=[21, 404]))
    assert (reply.failed, reply.timed_out, list(reply.failed_root_ids)) == (1, 0, [21])
    batch = first_batch_with_outcomes(stream)
    stream.cancel()
    assert (list(batch.root_ids), list(batch.outcomes)) == ([21], [Outcome.FAILED])
    assert server.shard.pending_trees == 1
    assert server.metrics.sample("acker_trees_force_failed_total") == 1


def test_force_fail_spout_fails_all_of_its_trees(make_server, connect):
    """Every pending tree of the named spout, and none of another spout's."""
    server = make_server()
    stub = connect(server)
    apply(stub, [INIT] * 4, [1, 2, 3, 4], [5] * 4, spouts=["orders"])
    apply(stub, [INIT], [5], [5], spouts=["billing"])
    assert stub.ForceFail(acker_pb2.ForceFailRequest(spout="orders")).failed == 4
    assert server.shard.pending_trees == 1


@pytest.mark.parametrize(
    "request_",
    [acker_pb2.ForceFailRequest(), acker_pb2.ForceFailRequest(root_ids=[1], spout="orders")],
    ids=["neither", "both"],
)
def test_force_fail_needs_roots_or_a_spout(make_server, connect, request_):
    """Neither or both is INVALID_ARGUMENT, and nothing fails."""
    server = make_server()
    stub = connect(server)
    apply(stub, [INIT], [1], [5])
    with pytest.raises(grpc.RpcError) as refused:
        stub.ForceFail(request_)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert server.shard.pending_trees == 1


def test_progress_mode_server_keeps_an_acked_tree_alive_and_caps_it(make_server, connect, clock):
    """Acks keep a tree pending past the timeout; the cap ends it LIFETIME_EXCEEDED; Describe says so."""
    server = make_server(clock=clock, message_timeout=2.0, timeout_mode="progress", max_tree_lifetime=6.0)
    stub = connect(server)
    info = stub.Describe(acker_pb2.DescribeRequest())
    assert (info.timeout_mode, info.max_tree_lifetime_seconds) == ("progress", 6.0)
    stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout="orders"))
    apply(stub, [INIT], [7], [5])
    for _ in range(8):
        clock.advance(1.0)
        apply(stub, [ACK], [7], [0])
        server.advance()
    batch = first_batch_with_outcomes(stream)
    stream.cancel()
    assert (list(batch.root_ids), list(batch.outcomes)) == ([7], [Outcome.LIFETIME_EXCEEDED])
    assert server.metrics.sample("acker_trees_lifetime_exceeded_total") == 1


def test_tree_ages_are_counted_at_scrape_time(make_server, connect, clock):
    """The histogram of pending trees' ages is computed when /metrics is read."""
    server = make_server(clock=clock, message_timeout=300.0, metrics_port=0)
    stub = connect(server)
    apply(stub, [INIT, INIT], [1, 2], [5, 5])
    clock.advance(45.0)
    apply(stub, [INIT], [3], [5])
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    lines = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("acker_pending_tree_age")
    }
    assert lines['acker_pending_tree_age_seconds_bucket{le="30.0"}'] == 1
    assert lines['acker_pending_tree_age_seconds_bucket{le="60.0"}'] == 3
    assert lines["acker_pending_tree_age_seconds_sum"] == 90.0


def _scrape(server) -> dict[str, float]:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("acker_")}


def test_oldest_pending_age_is_a_gauge_counted_at_scrape_time(make_server, connect, clock):
    """acker_oldest_pending_tree_age_seconds: the oldest pending tree's age, 0 with none (the autoscaling signal)."""
    server = make_server(clock=clock, message_timeout=300.0, metrics_port=0)
    stub = connect(server)
    assert _scrape(server)["acker_oldest_pending_tree_age_seconds"] == 0.0
    apply(stub, [INIT], [1], [5])
    clock.advance(40.0)
    apply(stub, [INIT], [2], [5])
    clock.advance(2.5)
    sample = _scrape(server)
    assert sample["acker_oldest_pending_tree_age_seconds"] == 42.5
    assert sample["acker_pending_trees"] == 2
    apply(stub, [ACK], [1], [5])  # the oldest ends: the next oldest is 2.5 s old
    assert _scrape(server)["acker_oldest_pending_tree_age_seconds"] == 2.5


def test_timeout_flags_and_environment(monkeypatch):
    """--timeout-mode and --max-tree-lifetime, with ACKER_* fallbacks; progress without a cap is refused."""
    args = build_parser({"ACKER_TIMEOUT_MODE": "progress", "ACKER_MAX_TREE_LIFETIME": "600"}).parse_args([])
    config = config_from_args(args)
    assert (config.timeout_mode, config.max_tree_lifetime) == ("progress", 600.0)
    with pytest.raises(ConfigError, match="needs --max-tree-lifetime"):
        ServerConfig(timeout_mode="progress")
    with pytest.raises(ConfigError, match="timeout mode must be one of"):
        ServerConfig(timeout_mode="sometimes")
    with pytest.raises(ConfigError, match="at least the message timeout"):
        ServerConfig(message_timeout=30.0, max_tree_lifetime=10.0)


def test_force_fail_refuses_a_bad_spout_name(make_server, connect):
    """A spout name longer than the wire allows is INVALID_ARGUMENT, as in Subscribe."""
    stub = connect(make_server())
    with pytest.raises(grpc.RpcError) as refused:
        stub.ForceFail(acker_pb2.ForceFailRequest(spout="x" * 300))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "spout name" in refused.value.details()
