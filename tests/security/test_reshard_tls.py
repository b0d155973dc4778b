"""Resharding ackers that serve TLS: the handoffs between ackers use TLS, a client certificate under mTLS, the token.

Real servers on 127.0.0.1 free ports with certificates from a throwaway CA;
``acker-ctl reshard`` runs over TLS as an operator would run it, and the trees
started before the move end correctly after it on the acker that took them.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from acker_client import ClusterClient
from acker_ctl.cli import main as acker_ctl
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import Outcome

from acker_service.auth import hash_token
from acker_service.config import ConfigError, ServerConfig
from acker_service.moving.peers import peer_security
from acker_service.server import AckerServer
from tests.reshard.workload import SPOUT, Outcomes, Trees

TOKENS = {"pipeline": "t-pipeline-01", "oncall": "t-oncall-23"}
PEER_SUBJECT = "CN=acker-peer,O=acker-tests"
OPERATOR_SUBJECT = "CN=operator,O=acker-tests"
POLICY = f"""
[principals."token:pipeline"]
spouts = ["{SPOUT}"]
executor = true
describe = true

[principals."token:oncall"]
describe = true
admin = true

[principals."cert:{OPERATOR_SUBJECT}"]
describe = true
admin = true

[principals."cert:{PEER_SUBJECT}"]
admin = true
"""
TIMEOUT = 3.0


@pytest.fixture
def auth_files(tmp_path) -> dict[str, str]:
    """The tokens file, the policy and one token file per principal."""
    (tmp_path / "tokens").write_text("".join(f"{name} {hash_token(t)}\n" for name, t in TOKENS.items()))
    (tmp_path / "policy.toml").write_text(POLICY)
    files = {"tokens": str(tmp_path / "tokens"), "policy": str(tmp_path / "policy.toml")}
    for name, token in TOKENS.items():
        (tmp_path / f"{name}.token").write_text(token + "\n")
        files[name] = str(tmp_path / f"{name}.token")
    return files


@pytest.fixture
def start():
    """Start secured ackers (shard ``index`` of ``count``) with the given settings; stop them at teardown."""
    servers: list[AckerServer] = []

    def make(index: int, count: int, **security) -> AckerServer:
        config = ServerConfig(host="127.0.0.1", port=0, grace=0.2, shard_index=index, shard_count=count,
                              message_timeout=TIMEOUT, **security)  # fmt: skip
        server = AckerServer(config).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(0)


def _pending(address: str, security: ChannelSecurity) -> int:
    with open_channel(address, security) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=5).pending_trees


def _run_trees_across(ackers: list[str], new: list[str], client_security: ChannelSecurity, ctl_flags: list[str]):
    """Start trees on ``ackers``, reshard to ``new`` with acker-ctl (``ctl_flags``), finish them; the verdict."""
    client = ClusterClient(ackers, security=client_security, flush_interval=0.001)
    outcomes = Outcomes(client)
    trees = Trees(client)
    try:
        trees.start(200)
        client.flush()
        printed: list[str] = []
        argv = ["--ackers", ",".join(ackers), *ctl_flags, "reshard", "--shards", str(len(new))]
        assert acker_ctl([*argv, "--addresses", ",".join(new)], out=printed.append) == 0, printed
        assert "2 -> 3 shards" in printed[0]
        arrived = _pending(new[-1], client_security)
        trees.finish()
        client.flush()
        assert client.shard_count == 3
        assert outcomes.wait_for(trees.done | trees.incomplete, timeout=6 * TIMEOUT)
        verdict = trees.verdict(outcomes)
        assert all(outcomes.by_root[r] == [Outcome.TIMED_OUT] for r in trees.incomplete)
        return arrived, verdict
    finally:
        outcomes.close()
        client.close()


def test_reshard_a_tls_and_token_cluster_from_two_to_three(start, pki, auth_files):
    """acker-ctl reshards over TLS with the admin's token; the handoffs cross over TLS with that token."""
    security = {
        "tls_cert": pki.server.cert, "tls_key": pki.server.key, "peer_tls_ca": pki.ca,
        "auth_tokens": auth_files["tokens"], "auth_policy": auth_files["policy"],
    }  # fmt: skip
    two = [start(i, 2, **security).address for i in range(2)]
    third = start(2, 3, **security).address
    client_security = ChannelSecurity(tls_ca=pki.ca, token=TOKENS["pipeline"])
    flags = ["--tls-ca", pki.ca, "--token-file", auth_files["oncall"]]
    arrived, verdict = _run_trees_across(two, [*two, third], client_security, flags)
    assert arrived > 0, "the new acker received the trees it owns"
    assert verdict["emitted"] == 200
    assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
        0, 0, 0, 0,
    )  # fmt: skip


def test_reshard_a_mutual_tls_cluster_with_the_ackers_peer_certificate(start, pki, auth_files):
    """Under mTLS with an operator's certificate (no token), each acker identifies itself to the others by its peer certificate."""
    peer = pki.authority.issue("acker-peer")
    operator = pki.authority.issue("operator")
    security = {
        "tls_cert": pki.server.cert, "tls_key": pki.server.key, "tls_client_ca": pki.ca,
        "peer_tls_cert": peer.cert, "peer_tls_key": peer.key,
        "auth_tokens": auth_files["tokens"], "auth_policy": auth_files["policy"],
    }  # fmt: skip
    two = [start(i, 2, **security).address for i in range(2)]
    third = start(2, 3, **security).address
    client_cert = pki.authority.issue("pipeline-executors")
    client_security = ChannelSecurity(
        tls_ca=pki.ca, tls_cert=client_cert.cert, tls_key=client_cert.key, token=TOKENS["pipeline"]
    )
    flags = ["--tls-ca", pki.ca, "--tls-cert", operator.cert, "--tls-key", operator.key]
    arrived, verdict = _run_trees_across(two, [*two, third], client_security, flags)
    assert arrived > 0
    assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
        0, 0, 0, 0,
    )  # fmt: skip


def test_under_mutual_tls_an_acker_presents_its_own_certificate_by_default(start, pki, auth_files, tmp_path):
    """No --peer-tls-cert: the acker's own certificate (serverAuth and clientAuth) identifies it to the others."""
    both = pki.authority.issue("localhost", server=True, client=True)
    operator = pki.authority.issue("operator")
    policy = tmp_path / "policy-own-cert.toml"
    policy.write_text(POLICY + '\n[principals."cert:CN=localhost,O=acker-tests"]\nadmin = true\n')
    security = {
        "tls_cert": both.cert, "tls_key": both.key, "tls_client_ca": pki.ca,
        "auth_tokens": auth_files["tokens"], "auth_policy": str(policy),
    }  # fmt: skip
    two = [start(i, 2, **security).address for i in range(2)]
    third = start(2, 3, **security).address
    client_cert = pki.authority.issue("pipeline-executors")
    client_security = ChannelSecurity(
        tls_ca=pki.ca, tls_cert=client_cert.cert, tls_key=client_cert.key, token=TOKENS["pipeline"]
    )
    flags = ["--tls-ca", pki.ca, "--tls-cert", operator.cert, "--tls-key", operator.key]
    arrived, verdict = _run_trees_across(two, [*two, third], client_security, flags)
    assert arrived > 0
    assert (verdict["lost"], verdict["replayed"], verdict["false_acks"], verdict["more_than_one_outcome"]) == (
        0, 0, 0, 0,
    )  # fmt: skip


def test_a_peer_it_cannot_verify_keeps_the_entries_and_the_cut_can_be_called_again(start, pki, auth_files, tmp_path):
    """A peer CA that did not sign the ackers: the cut fails UNAVAILABLE and nothing arrives at the new owner; the
    entries wait at the old owner, cut, for CutLayout to be called again (the next test calls it again)."""
    from acker_bench.testcerts import CertificateAuthority

    other = CertificateAuthority(tmp_path, "other-ca")
    security = {
        "tls_cert": pki.server.cert, "tls_key": pki.server.key, "peer_tls_ca": other.ca,
        "auth_tokens": auth_files["tokens"], "auth_policy": auth_files["policy"],
    }  # fmt: skip
    first = start(0, 1, **security).address
    second = start(1, 2, **security).address
    client_security = ChannelSecurity(tls_ca=pki.ca, token=TOKENS["pipeline"])
    with ClusterClient([first], security=client_security) as client:
        for root in range(1, 41):
            client.init(root, 5, SPOUT)
        client.flush()
    oncall = ChannelSecurity(tls_ca=pki.ca, token=TOKENS["oncall"])
    layout = acker_pb2.Layout(epoch=1, shard_count=2, shard_index=0, addresses=[first, second])
    with open_channel(first, oncall) as a, open_channel(second, oncall) as b:
        stub, other_stub = acker_pb2_grpc.AckerStub(a), acker_pb2_grpc.AckerStub(b)
        stub.PrepareLayout(acker_pb2.PrepareLayoutRequest(layout=layout), timeout=5)
        theirs = acker_pb2.Layout(epoch=1, shard_count=2, shard_index=1, addresses=[first, second])
        other_stub.PrepareLayout(acker_pb2.PrepareLayoutRequest(layout=theirs), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            stub.CutLayout(acker_pb2.CutLayoutRequest(epoch=1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "call CutLayout again" in refused.value.details()
        assert _pending(second, oncall) == 0
        assert stub.Describe(acker_pb2.DescribeRequest(), timeout=5).move_state == "cut"


def test_a_peer_ca_file_gone_since_the_start_fails_the_cut_and_keeps_the_entries(start, pki, auth_files, tmp_path):
    """The peer CA is read at each cut: once removed, the cut fails UNAVAILABLE with the fix; restored, the cut succeeds."""
    peer_ca = tmp_path / "peer-ca.crt"
    peer_ca.write_bytes(Path(pki.ca).read_bytes())
    security = {
        "tls_cert": pki.server.cert, "tls_key": pki.server.key, "peer_tls_ca": str(peer_ca),
        "auth_tokens": auth_files["tokens"], "auth_policy": auth_files["policy"],
    }  # fmt: skip
    first, second = start(0, 1, **security).address, start(1, 2, **security).address
    with ClusterClient([first], security=ChannelSecurity(tls_ca=pki.ca, token=TOKENS["pipeline"])) as client:
        for root in range(1, 21):
            client.init(root, 5, SPOUT)
        client.flush()
    oncall = ChannelSecurity(tls_ca=pki.ca, token=TOKENS["oncall"])
    with open_channel(first, oncall) as a, open_channel(second, oncall) as b:
        stub = acker_pb2_grpc.AckerStub(a)
        for address_stub, index in ((stub, 0), (acker_pb2_grpc.AckerStub(b), 1)):
            layout = acker_pb2.Layout(epoch=1, shard_count=2, shard_index=index, addresses=[first, second])
            address_stub.PrepareLayout(acker_pb2.PrepareLayoutRequest(layout=layout), timeout=5)
        peer_ca.unlink()
        with pytest.raises(grpc.RpcError) as refused:
            stub.CutLayout(acker_pb2.CutLayoutRequest(epoch=1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "fix the peer TLS files" in refused.value.details()
        assert _pending(second, oncall) == 0
        peer_ca.write_bytes(Path(pki.ca).read_bytes())
        # Called again, the cut sends what it kept and reports the same move (its entries left at the first call).
        assert stub.CutLayout(acker_pb2.CutLayoutRequest(epoch=1), timeout=10).moved_trees == 10
        assert _pending(second, oncall) == 10


def test_peer_settings_need_tls_and_come_in_pairs(pki):
    """Peer TLS settings on a plaintext acker, or a peer certificate without its key, are refused at start."""
    with pytest.raises(ConfigError, match="--peer-tls-ca secure calls to the other ackers"):
        ServerConfig(port=0, peer_tls_ca=pki.ca)
    with pytest.raises(ConfigError, match="--peer-tls-cert and --peer-tls-key go together"):
        ServerConfig(port=0, tls_cert=pki.server.cert, tls_key=pki.server.key, peer_tls_cert=pki.spout.cert)


def test_peer_security_follows_the_acker_s_own_tls(pki):
    """Plaintext to plaintext; TLS with the peer CA; mTLS presents the acker's own certificate unless a peer one is given."""
    assert peer_security(ServerConfig(port=0)) is None
    tls = peer_security(ServerConfig(port=0, tls_cert=pki.server.cert, tls_key=pki.server.key))
    assert tls is not None and tls.uses_tls and tls.tls_ca is None and tls.tls_cert is None
    mutual = ServerConfig(port=0, tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca)
    derived = peer_security(mutual)
    assert derived is not None and (derived.tls_ca, derived.tls_cert, derived.tls_key) == (
        pki.ca, pki.server.cert, pki.server.key,
    )  # fmt: skip
    named = ServerConfig(
        port=0, tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca,
        peer_tls_cert=pki.executor.cert, peer_tls_key=pki.executor.key, peer_server_name="localhost",
    )  # fmt: skip
    chosen = peer_security(named)
    assert chosen is not None and (chosen.tls_cert, chosen.server_name) == (pki.executor.cert, "localhost")
