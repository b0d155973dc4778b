"""A spout's outcome streams travel on connections of their own, not on the one its client's Apply calls use.

The sync gRPC client handles every call of a channel on one thread, under one
channel-wide lock. With Subscribe on the Apply channel, an outcome the acker had
already written waited behind the ApplyStream's sends and acks, and reached the
spout with the next batches' traffic: the columnar bench's latency followed its
batch interval (docs/benchmarks.md). The acker tells the connections apart by
their peer address, which is what these tests read.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from acker_client import ClusterClient, Spout
from acker_client.testing import local_cluster

from acker_service.config import ServerConfig
from acker_service.server import AckerServer


def _recording_peers(server: AckerServer) -> dict[str, set[str]]:
    """Wrap the server's Apply, ApplyStream and Subscribe (before it starts) to note each call's peer."""
    peers: dict[str, set[str]] = defaultdict(set)
    servicer = server.servicer
    apply, apply_stream, subscribe = servicer.Apply, servicer.ApplyStream, servicer.Subscribe

    async def Apply(request, context):
        peers["Apply"].add(context.peer())
        return await apply(request, context)

    async def ApplyStream(requests, context):
        peers["Apply"].add(context.peer())
        async for ack in apply_stream(requests, context):
            yield ack

    async def Subscribe(request, context):
        peers["Subscribe"].add(context.peer())
        async for batch in subscribe(request, context):
            yield batch

    servicer.Apply, servicer.ApplyStream, servicer.Subscribe = Apply, ApplyStream, Subscribe  # type: ignore[method-assign]
    return peers


@pytest.mark.parametrize("apply_stream", [True, False], ids=["ApplyStream", "unary Apply"])
def test_outcomes_come_on_a_connection_apart_from_apply(recorder, apply_stream):
    """One tree, emitted and acked: the acker saw its Apply and its outcome stream on two different connections."""
    config = ServerConfig(host="127.0.0.1", port=0, grace=0.5, shard_index=0, shard_count=1, message_timeout=30.0)
    server = AckerServer(config)
    peers = _recording_peers(server)
    server.start()
    try:
        with ClusterClient([f"127.0.0.1:{server.port}"], apply_stream=apply_stream) as client:
            spout = Spout(client, on_ack=recorder.on_ack, on_fail=recorder.on_fail).start()
            try:
                roots, edges = spout.emit_columns(["record"])
                client.ack_columns(roots, edges)
                client.flush()
                assert recorder.wait_for(1), "the tree's outcome never reached the spout"
                assert recorder.outcome("record") == "acked"
            finally:
                spout.close()
    finally:
        server.stop(0)
    assert peers["Apply"] and peers["Subscribe"], dict(peers)
    assert not peers["Apply"] & peers["Subscribe"], f"outcomes shared the Apply connection: {dict(peers)}"


def test_wait_streams_open_returns_once_every_outcome_stream_is_open():
    """wait_streams_open: False while an acker's stream cannot open, True once every stream is open."""
    with local_cluster(2, message_timeout=5.0) as cluster, ClusterClient(cluster.addresses) as client:
        spout = Spout(client, on_ack=lambda m: None, on_fail=lambda m, r: None)
        assert not spout.wait_streams_open(0.0), "not started: no stream is open"
        with spout:
            assert spout.wait_streams_open(10.0)
            assert all(sub.connected for sub in spout._subscriptions)
