"""A Spout keeps every emit's one callback through a reshard: it follows the ackers a new layout adds."""

from __future__ import annotations

import threading

from acker_client import BoltCollector, ClusterClient, Spout
from acker_ctl.reshard import reshard

from acker_service.config import ServerConfig
from acker_service.server import AckerServer


def test_spout_gets_one_ack_per_emit_across_3_to_4_and_back():
    """Records emitted before each move and acked after it are ACKED once each; nothing fails or is lost."""
    servers = []
    try:
        for index, count in ((0, 3), (1, 3), (2, 3), (3, 4)):
            config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, shard_index=index, shard_count=count)
            servers.append(AckerServer(config))
            servers[-1].start()
        three = [s.address for s in servers[:3]]
        four = [*three, servers[3].address]
        acked: list[object] = []
        failed: list[object] = []
        done = threading.Condition()

        def on_ack(message_id) -> None:
            with done:
                acked.append(message_id)
                done.notify_all()

        def on_fail(message_id, outcome) -> None:
            with done:
                failed.append((message_id, outcome))
                done.notify_all()

        client = ClusterClient(three, flush_interval=0.001)
        spout = Spout(client, on_ack=on_ack, on_fail=on_fail, timeout=60.0).start()
        bolt = BoltCollector(client)
        try:
            first = [spout.emit(i, i) for i in range(200)]
            client.flush()
            reshard(three, four, None)
            for t in first:
                bolt.ack(t)
            second = [spout.emit(i, i) for i in range(200, 400)]
            client.flush()
            reshard(four, three, None)
            for t in second:
                bolt.ack(t)
            client.flush()
            with done:
                assert done.wait_for(lambda: len(acked) + len(failed) >= 400, timeout=30)
            assert sorted(acked) == list(range(400)) and failed == []
        finally:
            spout.close()
            client.close()
    finally:
        for server in servers:
            server.stop(0)
