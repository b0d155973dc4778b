"""A restarted replica catches up, so its partner's loss right after replays nothing (real acker processes, kill -9).

Three ackers with --replicas 2 (acker_service.process_cluster gives each its
partners' addresses). Shard 1 is killed while trees are pending and more are
emitted, restarted, and once Describe says it caught up, shard 2 (the other
keeper of the roots shard 1 owns) is killed too. Without the catch-up, the
trees started during shard 1's outage would have lived on shard 2 only and end
LOST (replayed); with it every record is acked, exactly once, none lost, and no
incomplete tree is acked. Both living ackers' counters then add up
(docs/acker-semantics.md, "Conservation you can check"), the restarted one
counting the trees its partners copied to it.
"""

from __future__ import annotations

import grpc
import pytest
from acker_client import BoltCollector, ClusterClient, Spout
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.moving.transfers import scrape_balance
from acker_service.process_cluster import ProcessCluster

from .polling import wait_until


def _tree(spout: Spout, bolt: BoltCollector, i: int):
    """Emit record ``i`` with one child and ack the spout tuple; the child is still to be acked."""
    t = spout.emit(i, i)
    kid = bolt.emit(("kid", i), [t])
    bolt.ack(t)
    return kid


def _catchup_state(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=5).catchup_state
        except grpc.RpcError:
            return "unreachable"


@pytest.mark.chaos
def test_partner_killed_after_the_catch_up_replays_nothing(recorder):
    """kill -9 shard 1, restart it, wait until caught up, kill -9 shard 2: 0 replayed, 0 lost, 0 false acks."""
    with (
        ProcessCluster(count=3, message_timeout=60.0, extra_args=("--replicas", "2"), metrics_base_port=0) as ackers,
        ClusterClient(ackers.addresses, deadline=3.0) as client,
    ):
        spout = Spout(client, on_ack=recorder.on_ack, on_fail=recorder.on_fail).start()
        bolt = BoltCollector(client)
        kids = [_tree(spout, bolt, i) for i in range(300)]
        client.flush()
        ackers.kill(1)
        kids += [_tree(spout, bolt, i) for i in range(300, 600)]  # while shard 1 is down: on partners only
        client.flush()
        ackers.restart(1)
        kids += [_tree(spout, bolt, i) for i in range(600, 700)]  # held by shard 1 until it caught up
        client.flush()
        wait_until(lambda: _catchup_state(ackers.addresses[1]) == "caught-up", timeout=60)
        ackers.kill(2)
        kids.pop()  # record 699's child is never acked: its tree must not end (no false ack)
        for kid in kids:
            bolt.ack(kid)
        client.flush()
        wait_until(lambda: len(recorder.calls) >= len(kids), timeout=60)
        recorder.assert_exactly_once(range(len(kids)))
        assert recorder.by_reason() == {"acked": len(kids)}, "a record was replayed or lost"
        assert recorder.outcome(len(kids)) is None, "the tree whose child was never acked ended"
        stats = spout.stats
        assert stats.lost == stats.timed_out == stats.failed == 0
        spout.close()
        urls = ackers.metrics_urls
        assert urls is not None
        balances = {shard: scrape_balance(urls[shard]) for shard in (0, 1)}  # shard 2 died with its counters
        for shard, balance in balances.items():
            assert balance.holds, f"shard {shard}'s trees do not add up: {balance}"
        assert balances[1].copied_in > 0, "the restarted acker counted no tree copied from its partners"
