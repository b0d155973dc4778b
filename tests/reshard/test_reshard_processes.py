"""acker-ctl reshard and drain against real acker processes under a running workload (issue 29).

Three acker processes (and a fourth that joins) serve a client that keeps
starting and finishing trees while the operator runs ``acker-ctl reshard
--shards 4``, back to 3, then ``acker-ctl drain 1``. Every tree must end with
exactly one outcome: the complete ones ACKED (0 replayed), the incomplete
ones never ACKED (0 false acks), none without an outcome (0 lost). Marked
chaos: the incomplete trees' real timeout is waited out.
"""

from __future__ import annotations

import json

import pytest
from acker_client import ClusterClient
from acker_ctl.cli import main as acker_ctl

from acker_service.moving.transfers import scrape_balance
from acker_service.process_cluster import ProcessCluster

from .test_move_holds import ACK, INIT, Acker
from .workload import Outcomes, Trees, running_workload

TIMEOUT = 3.0


def _ctl(*args: str) -> dict:
    printed: list[str] = []
    assert acker_ctl(["--json", *args], out=printed.append) == 0
    return json.loads(printed[0])


@pytest.mark.chaos
def test_acker_ctl_reshard_3_4_3_and_drain_under_load():
    """0 lost, 0 replayed, 0 false acks and one outcome per emit through three layout changes of real processes."""
    with (
        ProcessCluster(count=3, message_timeout=TIMEOUT, metrics_base_port=0) as three,
        ProcessCluster(count=1, message_timeout=TIMEOUT, metrics_base_port=0) as extra,
    ):
        old = list(three.addresses)
        four = [*old, extra.addresses[0]]
        client = ClusterClient(old, flush_interval=0.001)
        outcomes = Outcomes(client)
        trees = Trees(client)
        with running_workload(client, trees) as rounds:
            rounds.wait_for_more()
            grow = _ctl("--ackers", ",".join(old), "reshard", "--shards", "4", "--addresses", ",".join(four))
            rounds.wait_for_more()
            shrink = _ctl("--ackers", ",".join(four), "reshard", "--shards", "3", "--addresses", ",".join(old))
            rounds.wait_for_more()
            drain = _ctl("--ackers", ",".join(old), "drain", "1", "--wait", str(3 * TIMEOUT))
            rounds.wait_for_more()
        trees.finish()
        client.flush()
        assert (grow["epoch"], shrink["epoch"], drain["epoch"]) == (1, 2, 3)
        assert grow["moved_trees"] > 0 and shrink["moved_trees"] > 0 and drain["moved_trees"] > 0
        assert drain["leaving"] == {old[1]: 0}, "the drained acker ended its last due trees"
        assert client.shard_count == 2 and client.stats.batches_rerouted > 0
        try:
            assert outcomes.wait_for(trees.done | trees.incomplete, timeout=6 * TIMEOUT)
            verdict = trees.verdict(outcomes)
        finally:
            outcomes.close()
            client.close()
        assert verdict["emitted"] > 0
        assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
            0, 0, 0, 0,
        )  # fmt: skip
        balances = [scrape_balance(url) for url in [*(three.metrics_urls or []), *(extra.metrics_urls or [])]]
        assert len(balances) == 4
        for shard, balance in enumerate(balances):
            assert balance.holds, f"acker {shard}'s trees do not add up: {balance}"
        moved_out = sum(b.copied_out for b in balances)
        assert moved_out == sum(b.copied_in for b in balances) > 0, "a handed-off tree was not taken in once"


@pytest.mark.chaos
def test_a_move_stopped_after_prepare_serves_non_moving_roots_and_acker_ctl_finishes_it():
    """Real processes prepared for 3 -> 4: a staying root applies, a moving one is held; acker-ctl then finishes the move."""
    with (
        ProcessCluster(count=3, message_timeout=TIMEOUT) as three,
        ProcessCluster(count=1, message_timeout=TIMEOUT) as extra,
    ):
        old = list(three.addresses)
        four = [*old, extra.addresses[0]]
        ackers = [Acker(address) for address in four]
        try:
            stay, moving = 12 * 1000 + 1, 12 * 1000 + 4  # 1 -> 1, and 1 -> 0 (mod 3 -> mod 4)
            for root in (stay, moving):
                ackers[1].apply([(INIT, root, 5 ^ 9), (ACK, root, 5)], key=root << 8)
            for acker in ackers:
                acker.prepare(1, four, old)  # as acker-ctl reshard would; it stops here
            done = ackers[1].apply([(ACK, stay, 9)], key=1 << 40)
            assert (done.applied, done.held) == (1, 0) and ackers[1].counts() == (1, 1)
            held = ackers[0].apply([(ACK, moving, 9)], key=2 << 40)
            assert (held.applied, held.held) == (0, 1) and ackers[0].counts() == (0, 0)
            grow = _ctl("--ackers", ",".join(old), "reshard", "--shards", "4", "--addresses", ",".join(four))
            assert grow["epoch"] == 1 and grow["moved_trees"] == 1
            assert ackers[0].counts() == (0, 1), "the entry arrived with shard 1's cut, then the held ack: ACKED"
        finally:
            for acker in ackers:
                acker.close()
