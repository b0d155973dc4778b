"""acker-ctl reshard and drain of real acker processes running --replicas 2, with a kill -9 during a move (issue 39).

Four acker processes with two replicas (each keeps its committed layout in a
layout file) serve a client that keeps starting and finishing trees while the
operator shrinks them to three, grows them back to four and drains one. During
the grow, once every acker is prepared (the next layout's operations on moving
roots are held from then on), shard 1 is killed with kill -9 and restarted: it
comes back in its committed layout, copies its two ranges from its partners
(catch-up) and ``acker-ctl reshard`` run again finishes the move. Every tree
must end as its bolts decided, reported the same way by every acker that
reports it: the complete ones ACKED (0 replayed), the incomplete ones never
ACKED (0 false acks), none without an outcome (0 lost). Every living acker's
counters add up (docs/acker-semantics.md, "Conservation you can check").
Marked chaos: it kills an acker and waits out the incomplete trees' timeout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from acker_client import ClusterClient
from acker_ctl.cli import main as acker_ctl
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.moving.transfers import scrape_balance
from acker_service.process_cluster import ProcessCluster

from .test_move_holds import Acker
from .workload import Outcomes, Trees, running_workload

TIMEOUT = 5.0


def wait_until(condition, what: str, timeout: float) -> None:
    """Poll ``condition`` every 50 ms; fail naming ``what`` after ``timeout`` seconds (a bound, not a speed check)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout} s"
        time.sleep(0.05)


def _ctl(*args: str) -> dict:
    printed: list[str] = []
    assert acker_ctl(["--json", *args], out=printed.append) == 0
    return json.loads(printed[0])


def _describe(address: str) -> acker_pb2.DescribeResponse | None:
    with grpc.insecure_channel(address) as channel:
        try:
            return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=5)
        except grpc.RpcError:
            return None


@pytest.mark.chaos
def test_acker_ctl_moves_a_replicated_cluster_4_3_4_and_drains_with_a_kill_during_the_grow(tmp_path: Path):
    """0 lost, 0 replayed, 0 false acks and no disagreeing outcomes through three changes and a kill -9."""
    with ProcessCluster(
        count=4,
        message_timeout=TIMEOUT,
        metrics_base_port=0,
        extra_args=("--replicas", "2"),
        layout_dir=tmp_path,
    ) as ackers:
        four = list(ackers.addresses)
        three = four[:3]
        client = ClusterClient(four, flush_interval=0.001, replicas=2)
        outcomes = Outcomes(client)
        trees = Trees(client)
        with running_workload(client, trees) as rounds:
            rounds.wait_for_more()
            shrink = _ctl("--ackers", ",".join(four), "reshard", "--shards", "3", "--addresses", ",".join(three))
            rounds.wait_for_more()
            # The grow stops after its first step, as an operator's interrupted acker-ctl would: every acker
            # prepared, the next layout's operations on moving roots held. Then kill -9 of shard 1.
            steps = [Acker(address) for address in four]
            try:
                for acker in steps:
                    acker.prepare(2, four, three)
            finally:
                for acker in steps:
                    acker.close()
            rounds.wait_for_more()
            ackers.kill(1)
            rounds.wait_for_more()
            ackers.restart(1)
            wait_until(
                lambda: getattr(_describe(four[1]), "catchup_state", "") == "caught-up", "shard 1's catch-up", 60
            )
            restarted = _describe(four[1])
            assert restarted is not None and (restarted.layout.epoch, restarted.shard_count) == (1, 3), (
                "back in its committed layout (the layout file), not its flags' 4 shards"
            )
            rounds.wait_for_more()
            grow = _ctl("--ackers", ",".join(three), "reshard", "--shards", "4", "--addresses", ",".join(four))
            rounds.wait_for_more()
            drain = _ctl("--ackers", ",".join(four), "drain", "1", "--wait", str(3 * TIMEOUT))
            rounds.wait_for_more()
        trees.finish()
        client.flush()
        assert (shrink["epoch"], grow["epoch"], drain["epoch"]) == (1, 2, 3)
        assert shrink["replicas"] == grow["replicas"] == drain["replicas"] == 2
        assert shrink["moved_trees"] > 0 and grow["moved_trees"] > 0 and drain["moved_trees"] > 0
        assert drain["leaving"] == {four[1]: 0}, "the drained acker kept no tree: every root it held moved"
        assert client.shard_count == 3 and client.stats.batches_rerouted > 0
        try:
            outcomes.wait_for(trees.done | trees.incomplete, timeout=6 * TIMEOUT)  # "lost" below if not
            verdict = trees.verdict(outcomes, replicas=2)
        finally:
            outcomes.close()
            client.close()
        assert verdict["emitted"] > 0
        assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
            0, 0, 0, 0,
        ), verdict  # fmt: skip
        balances = [scrape_balance(url) for url in ackers.metrics_urls or []]
        assert len(balances) == 4
        for shard, balance in enumerate(balances):
            assert balance.holds, f"acker {shard}'s trees do not add up: {balance}"
