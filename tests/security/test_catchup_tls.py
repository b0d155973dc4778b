"""A restarted replica's catch-up between ackers that serve TLS and check bearer tokens (Snapshot is an admin call)."""

from __future__ import annotations

import grpc
import pytest
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.auth import hash_token
from acker_service.batch import Batch
from acker_service.config import ConfigError, ServerConfig
from acker_service.server import AckerServer
from tests.client.polling import wait_until
from tests.ledger.driver import request_of

TOKENS = {"peer": "t-peer-0123", "writer": "t-writer-4567"}
POLICY = """
[principals."token:peer"]
admin = true
describe = true

[principals."token:writer"]
spouts = ["s"]
executor = true
describe = true
"""
INIT = 1


@pytest.fixture
def auth_files(tmp_path):
    tokens, policy, token = tmp_path / "tokens", tmp_path / "policy.toml", tmp_path / "peer-token"
    tokens.write_text("".join(f"{name} {hash_token(t)}\n" for name, t in TOKENS.items()))
    policy.write_text(POLICY)
    token.write_text(TOKENS["peer"] + "\n")
    return str(tokens), str(policy), str(token)


def _stub(server: AckerServer, pki, token: str) -> tuple[grpc.Channel, acker_pb2_grpc.AckerStub]:
    channel = open_channel(server.address, ChannelSecurity(tls_ca=pki.ca, token=token))
    return channel, acker_pb2_grpc.AckerStub(channel)


def test_a_restarted_acker_copies_its_ranges_over_tls_with_its_peer_token(pki, auth_files):
    """Two shards, replicas 2: shard 1 restarts with --peers, --peer-tls-ca and --peer-token-file and copies the
    trees shard 0 holds; a token without the admin right is refused the copy."""
    tokens, policy, token = auth_files
    secure = {"tls_cert": pki.server.cert, "tls_key": pki.server.key, "auth_tokens": tokens, "auth_policy": policy}
    common = {"host": "127.0.0.1", "grace": 0.2, "shard_count": 2, "replicas": 2, **secure}
    shard0 = AckerServer(ServerConfig(port=0, shard_index=0, **common)).start()
    restarted = None
    channels = []
    try:
        channel, stub0 = _stub(shard0, pki, TOKENS["writer"])
        channels.append(channel)
        stub0.Apply(acker_pb2.ApplyRequest.FromString(request_of(Batch.of([INIT] * 2, [3, 4], [9, 9], spouts=["s"]))))
        with pytest.raises(grpc.RpcError) as refused:
            list(stub0.Snapshot(acker_pb2.SnapshotRequest(shard_count=2, range=0)))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(ConfigError, match="--peer-token-file"):
            ServerConfig(port=0, shard_index=1, peers=f"{shard0.address},127.0.0.1:1", peer_tls_ca=pki.ca, **common)
        restarted = AckerServer(
            ServerConfig(
                port=0,
                shard_index=1,
                peers=f"{shard0.address},127.0.0.1:1",
                catchup_delay=0.0,
                peer_tls_ca=pki.ca,
                peer_token_file=token,
                **common,
            )  # fmt: skip
        ).start()
        channel, stub1 = _stub(restarted, pki, TOKENS["writer"])
        channels.append(channel)
        wait_until(lambda: stub1.Describe(acker_pb2.DescribeRequest()).catchup_state == "caught-up", timeout=60)
        assert stub1.Describe(acker_pb2.DescribeRequest()).catchup_entries == 2  # both ranges come from shard 0
        assert sorted(restarted.call(lambda: [int(r) for r in restarted.ledger.pending_roots()])) == [3, 4]
    finally:
        for channel in channels:
            channel.close()
        for server in (shard0, restarted):
            if server is not None:
                server.stop(0)
