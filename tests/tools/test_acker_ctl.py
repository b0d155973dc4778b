"""acker-ctl against real acker servers: status, inspect, top and fail, in tables and JSON (issue 21)."""

from __future__ import annotations

import json

import grpc
import pytest
from acker_client.testing import ManualClock, local_cluster, unreachable_addresses
from acker_ctl.cli import main
from acker_ctl.cluster import Cluster
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

INIT = 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ackers(clock):
    """Two in-process shards on a fake clock."""
    with local_cluster(2, message_timeout=300.0, clock=clock) as cluster:
        yield cluster


def start_trees(ackers, roots: list[int], spout: str = "orders") -> None:
    """INIT each root on the shard that owns it (root % 2)."""
    for shard, address in enumerate(ackers.addresses):
        owned = [r for r in roots if r % 2 == shard]
        if owned:
            with grpc.insecure_channel(address) as channel:
                acker_pb2_grpc.AckerStub(channel).Apply(
                    acker_pb2.ApplyRequest(
                        kinds=[INIT] * len(owned), root_ids=owned, values=[7] * len(owned), spouts=[spout]
                    )
                )


def ctl(ackers, *args: str) -> tuple[int, str]:
    """Run acker-ctl with --ackers and --json; (exit status, printed text)."""
    printed: list[str] = []
    code = main(["--ackers", ",".join(ackers.addresses), "--json", *args], out=printed.append)
    return code, "\n".join(printed)


def test_inspect_routes_each_root_to_its_shard(ackers, clock):
    start_trees(ackers, [10, 11])
    clock.advance(2.0)
    code, text = ctl(ackers, "inspect", "11", "10", "0x21")
    assert code == 0
    rows = json.loads(text)
    assert [(r["root"], r["shard"], r["status"], r["spout"]) for r in rows] == [
        (11, 1, "pending", "orders"),
        (10, 0, "pending", "orders"),
        (33, 1, "absent", None),
    ]
    assert rows[0]["age_seconds"] == 2.0


def test_top_lists_the_oldest_trees_of_the_whole_cluster(ackers, clock):
    for root in (21, 30, 41, 50):
        start_trees(ackers, [root])
        clock.advance(1.0)
    code, text = ctl(ackers, "top", "--oldest", "3")
    assert code == 0
    assert [(r["root"], r["age_seconds"]) for r in json.loads(text)] == [(21, 4.0), (30, 3.0), (41, 2.0)]


def test_fail_roots_and_fail_a_spout(ackers):
    start_trees(ackers, [2, 3, 4, 5], spout="orders")
    start_trees(ackers, [6, 7], spout="billing")
    code, text = ctl(ackers, "fail", "3", "4", "99")
    assert code == 0
    assert json.loads(text) == {"failed": [3, 4], "timed_out": 0, "not_failed": [99]}
    code, text = ctl(ackers, "fail", "--spout", "orders")
    assert (code, json.loads(text)["failed"]) == (0, 2)
    assert sum(server.shard.pending_trees for server in ackers.servers) == 2, "billing's trees stay"


def test_status_reports_every_shard_with_rates(ackers, clock):
    start_trees(ackers, [10, 11, 13])
    clock.advance(5.0)
    with Cluster(ackers.addresses, None) as cluster:
        status = cluster.status(interval=0.0, sleep=lambda _: start_trees(ackers, [100, 102, 104]))
    shard0, shard1 = status["shards"]
    assert status["pending_trees"] == 6
    assert (shard0["pending_trees"], shard1["pending_trees"]) == (4, 2)
    assert (shard1["oldest_root"], shard1["oldest_age_seconds"]) == (11, 5.0)
    assert shard0["started_per_s"] > 0 and shard1["started_per_s"] == 0
    assert shard0["incarnation"] == f"{ackers.servers[0].incarnation:016x}"


def test_table_output_names_the_columns(ackers):
    start_trees(ackers, [10])
    printed: list[str] = []
    assert main(["--ackers", ",".join(ackers.addresses), "inspect", "10"], out=printed.append) == 0
    header, row = printed[0].splitlines()
    assert header.split()[:4] == ["root", "shard", "status", "age_seconds"]
    assert row.split()[:3] == ["10", "0", "pending"]


def test_addresses_out_of_shard_order_are_refused(ackers, capsys):
    reversed_order = ",".join(reversed(ackers.addresses))
    assert main(["--ackers", reversed_order, "status", "--interval", "0"]) == 1
    assert "list every acker, in shard order" in capsys.readouterr().err


def test_an_unreachable_acker_is_named(capsys):
    (address,) = unreachable_addresses(1)
    assert main(["--ackers", address, "--deadline", "2", "top"]) == 1
    assert f"shard 0 ({address})" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as no_ackers:
        main(["top"])
    assert no_ackers.value.code == 2
    with pytest.raises(SystemExit) as both:
        main(["--ackers", "x:1", "fail", "5", "--spout", "s"])
    assert both.value.code == 2


@pytest.mark.parametrize("replicas", [1, 2])
def test_status_says_whether_trees_are_replicated(replicas):
    """status shows each shard's --replicas and says in words what it means (JSON: the number)."""
    with local_cluster(2, message_timeout=300.0, replicas=replicas) as cluster:
        printed: list[str] = []
        assert main(["--ackers", ",".join(cluster.addresses), "status", "--interval", "0"], out=printed.append) == 0
        code, text = ctl(cluster, "status", "--interval", "0")
    assert code == 0 and json.loads(text)["replicas"] == replicas
    assert {s["replicas"] for s in json.loads(text)["shards"]} == {replicas}
    assert (
        f"replicas: {replicas} (every tree is kept by {'its shard and the next one' if replicas == 2 else 'one acker'}"
        in printed[0]
    )
