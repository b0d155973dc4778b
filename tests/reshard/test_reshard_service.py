"""Resharding real acker servers under a running client (issue 29): 3 -> 4 -> 3 and a drain lose, replay and false-ack nothing.

In-process servers on 127.0.0.1 free ports, real gRPC, the real client (which
learns each new layout from a refusal and Describe) and the operator's
``reshard`` steps as acker-ctl runs them.
"""

from __future__ import annotations

import json

import grpc
import pytest
from acker_client import ClusterClient
from acker_ctl.cli import main as acker_ctl
from acker_ctl.cluster import CtlError
from acker_ctl.reshard import drain_addresses, reshard
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import Outcome

from acker_service.config import ServerConfig
from acker_service.server import AckerServer

from .workload import Outcomes, Trees

TIMEOUT = 3.0  # incomplete trees time out within one window after the last move


@pytest.fixture
def servers():
    started: list[AckerServer] = []

    def make(index: int, count: int, **more) -> AckerServer:
        config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, shard_index=index, shard_count=count,
                              message_timeout=TIMEOUT, **more)  # fmt: skip
        server = AckerServer(config)
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop(0)


def _describe(address: str) -> acker_pb2.DescribeResponse:
    with grpc.insecure_channel(address) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=5)


def test_reshard_3_to_4_to_3_then_drain_keeps_every_rule(servers):
    """Trees started before each move end after it: complete ones ACKED once, incomplete ones never ACKED, none lost."""
    three = [servers(i, 3).address for i in range(3)]
    fourth = servers(3, 4).address
    client = ClusterClient(three, flush_interval=0.001)
    outcomes = Outcomes(client)
    trees = Trees(client)
    try:
        trees.start(300)
        client.flush()
        four = [*three, fourth]
        moved = reshard(three, four, None)
        assert moved["to_shards"] == 4 and moved["moved_trees"] > 0
        trees.finish(120)  # routed by 3 shards until a refusal teaches the client the 4 of epoch 1
        trees.start(200)
        client.flush()
        assert client.layout_epoch == 1 and client.shard_count == 4
        assert [_describe(a).layout.epoch for a in four] == [1, 1, 1, 1]
        printed: list[str] = []
        assert acker_ctl(["--ackers", ",".join(four), "--json", "status", "--interval", "0"], out=printed.append) == 0
        status = json.loads(printed[0])
        assert [(s["layout_epoch"], s["move_state"]) for s in status["shards"]] == [(1, "serving")] * 4

        back = reshard(four, three, None, wait_leaving=2 * TIMEOUT)
        assert back["epoch"] == 2 and back["to_shards"] == 3
        trees.finish(150)
        client.flush()
        drained = drain_addresses(three, 1)
        gone = reshard(three, drained, None, wait_leaving=2 * TIMEOUT)
        assert gone["to_shards"] == 2 and list(gone["leaving"]) == [three[1]]
        trees.finish()
        client.flush()
        assert client.shard_count == 2 and client.stats.batches_rerouted > 0
        assert outcomes.wait_for(trees.done | trees.incomplete, timeout=6 * TIMEOUT)
        verdict = trees.verdict(outcomes)
        assert verdict["emitted"] == 500
        assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
            0, 0, 0, 0,
        )  # fmt: skip
        assert all(outcomes.by_root[r] == [Outcome.TIMED_OUT] for r in trees.incomplete)
    finally:
        outcomes.close()
        client.close()


def test_drain_refuses_an_unknown_or_last_shard():
    """drain names a listed shard and never the last acker."""
    with pytest.raises(CtlError, match="not one of"):
        drain_addresses(["x:1", "y:2"], 2)
    with pytest.raises(CtlError, match="last acker"):
        drain_addresses(["x:1"], 0)


def test_a_joining_acker_owns_nothing_until_a_reshard_places_it(servers):
    """--join with index = count (a pod added to a StatefulSet of the old count): refused Apply, then a shard after reshard."""
    three = [servers(i, 3).address for i in range(3)]
    joining = servers(3, 3, join=True).address
    with grpc.insecure_channel(joining) as channel:
        stub = acker_pb2_grpc.AckerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Apply(acker_pb2.ApplyRequest(kinds=[1], root_ids=[3], values=[5], spouts=["s"]), timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "until acker-ctl reshard gives it one" in refused.value.details()
    with ClusterClient(three) as client:
        for root in range(1, 101):
            client.init(root, 5, "s")
        client.flush()
    moved = reshard(three, [*three, joining], None)
    assert moved["to_shards"] == 4
    placed = _describe(joining)
    assert (placed.layout.shard_index, placed.layout.shard_count, placed.pending_trees) == (3, 4, 25)


def test_join_is_needed_for_an_index_at_or_above_the_count():
    """Without --join an index at or above the count is a mistake, refused with the way out; a negative one always."""
    from acker_service.config import ConfigError

    with pytest.raises(ConfigError, match="--join 1 starts an acker outside the layout"):
        ServerConfig(port=0, shard_index=3, shard_count=3)
    with pytest.raises(ConfigError, match="shard index must be 0..2"):
        ServerConfig(port=0, shard_index=-1, shard_count=3, join=True)
    assert not ServerConfig(port=0, shard_index=3, shard_count=3, join=True).in_layout


def test_a_prepare_whose_layout_file_cannot_be_written_is_unavailable_and_changes_nothing(servers, tmp_path):
    """The layout file's directory gone: PrepareLayout answers UNAVAILABLE naming the file; the acker keeps serving."""
    folder = tmp_path / "state"
    folder.mkdir()
    a = servers(0, 1, layout_file=str(folder / "layout.json")).address
    folder.rmdir()
    with grpc.insecure_channel(a) as channel:
        stub = acker_pb2_grpc.AckerStub(channel)
        layout = acker_pb2.Layout(epoch=1, shard_count=1, shard_index=0, addresses=[a])
        with pytest.raises(grpc.RpcError) as refused:
            stub.PrepareLayout(acker_pb2.PrepareLayoutRequest(layout=layout), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert str(folder / "layout.json") in refused.value.details() and "nothing changed" in refused.value.details()
        stub.Apply(acker_pb2.ApplyRequest(kinds=[1], root_ids=[2], values=[5], spouts=["s"]), timeout=5)
    described = _describe(a)
    assert (described.move_state, described.layout.epoch, described.pending_trees) == ("serving", 0, 1)
