"""Resharding the compose cluster in real containers, 3 -> 4 -> 3, under a spout/bolt workload from this machine.

A project of its own (one copy of every tree, which resharding needs; the
suite's shared cluster keeps two) runs docker-compose.yml with the
docker-compose.reshard.yml override, which adds acker-3. The layout's addresses
are the ackers' IPs on the compose network: the ackers hand trees to each other
by them, and this machine reaches them too (a Linux bridge network), so the
workload's client can follow the new layout it learns from Describe. The grow
runs ``acker-ctl`` from this machine, the drain runs it inside acker-0's
container, as the two places an operator would run it. Then ackers restarted after a
grow come back in its layout, from the layout files on their named volumes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from .conftest import COMPOSE_FILE, REPO, ComposeCluster, _skip_reason, remove_stale_projects
from .workload import Workload

RESHARD_FILE = REPO / "deploy" / "docker-compose.reshard.yml"


@pytest.fixture(scope="module")
def reshard_cluster() -> Iterator[ComposeCluster]:
    """Four ackers (acker-3 idle until the reshard), one copy per tree, removed at the end even when the test fails."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    remove_stale_projects()
    cluster = ComposeCluster(shards=4, replicas=1, files=(COMPOSE_FILE, RESHARD_FILE))
    try:
        cluster.up(prometheus=False)
        yield cluster
    finally:
        cluster.down()


def _acked_more(load: Workload, than: int, what: str, timeout: float = 60.0) -> int:
    """Wait until the workload has more ACKED callbacks than ``than`` (load flows); the count."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        acked = load.acked_since()
        if acked > than:
            return acked
        time.sleep(0.2)
    raise AssertionError(f"no tree was acked {what} within {timeout} s")


def _host_ctl(*args: str) -> dict:
    """`acker-ctl --json ...` run on this machine; its JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "acker_ctl", "--json", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.chaos  # its own 4-acker project and a timed workload: run alone, as the other moves are
def test_grow_to_four_and_drain_back_to_three_under_load(reshard_cluster: ComposeCluster) -> None:
    """Every record acked, none replayed, no false ack, one callback per emit, across both moves."""
    addresses = [reshard_cluster.network_address(shard) for shard in range(4)]
    three, four = addresses[:3], addresses
    load = Workload(three, rate=200.0).start()
    try:
        acked = _acked_more(load, 50, "before the reshard")
        grown = _host_ctl("--ackers", ",".join(three), "reshard", "--shards", "4", "--addresses", ",".join(four))
        assert (grown["from_shards"], grown["to_shards"], grown["addresses"]) == (3, 4, four)
        acked = _acked_more(load, acked + 100, "after growing to 4 shards")
        assert load.client.shard_count == 4
        on_acker_3 = _host_ctl("--ackers", ",".join(four), "status", "--interval", "0")["shards"][3]
        assert on_acker_3["layout_epoch"] == grown["epoch"]
        drained = reshard_cluster.compose(
            "exec", "-T", "acker-0", "acker-ctl", "--ackers", ",".join(four), "--json", "drain", "3", "--wait", "10"
        )
        back = json.loads(drained)
        assert (back["to_shards"], back["addresses"], back["leaving"]) == (3, three, {four[3]: 0})
        _acked_more(load, acked + 100, "after draining acker-3")
        assert load.client.shard_count == 3
    finally:
        figures = load.finish(timeout=60)
    print(
        figures.line("reshard 3 -> 4 -> 3")
        + f" moved_up={grown['moved_trees']} move_up={grown['move_seconds']}s"
        + f" moved_back={back['moved_trees']} move_back={back['move_seconds']}s"
    )
    assert figures.records > 0 and figures.acked >= figures.records
    assert (figures.lost_records, figures.replayed, figures.false_acks, figures.duplicate_callbacks) == (0, 0, 0, 0)


def _places(addresses: list[str]) -> list[tuple[int, int, int]]:
    """(shard index, shard count, layout epoch) each acker reports, asked over its published port."""
    places = []
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            info = acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=10)
        places.append((info.shard_index, info.shard_count, info.layout.epoch))
    return places


@pytest.mark.chaos  # kills and restarts ackers of its own project
def test_ackers_restarted_after_a_grow_come_back_as_shards_of_four(reshard_cluster: ComposeCluster) -> None:
    """Each acker's layout file on its named volume: acker-0 crashed and acker-3 restarted both serve the grown layout."""
    addresses = [reshard_cluster.network_address(shard) for shard in range(4)]
    grown = _host_ctl(
        "--ackers", ",".join(addresses[:3]), "reshard", "--shards", "4", "--addresses", ",".join(addresses)
    )
    published = reshard_cluster.addresses
    assert _places(published) == [(i, 4, grown["epoch"]) for i in range(4)]
    incarnations = reshard_cluster.restart_count(0)
    reshard_cluster.crash(0)  # the restart policy brings the same container back
    reshard_cluster.restart(3)
    deadline = time.monotonic() + 60
    while reshard_cluster.restart_count(0) == incarnations and time.monotonic() < deadline:
        time.sleep(0.2)
    for shard in (0, 3):
        reshard_cluster.wait_healthy(shard)
    # Their variables say shard 0 of 3 and shard 3 of 4 at epoch 0; the files say the grown layout.
    assert _places(published) == [(i, 4, grown["epoch"]) for i in range(4)]
