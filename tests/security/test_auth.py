"""Authentication (bearer tokens, client certificates) and per-spout authorization, over real TLS."""

from __future__ import annotations

import grpc
import pytest
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from acker_service.auth import hash_token
from acker_service.config import ServerConfig
from acker_service.server import AckerServer

TOKENS = {
    "orders-spout": "t-orders-0123", "executors": "t-exec-4567", "other-spout": "t-other-89ab", "oncall": "t-oncall-cd",
}  # fmt: skip
SPOUT_CERT_SUBJECT = "CN=orders-spout,O=acker-tests"
POLICY = f"""
[principals."token:orders-spout"]
spouts = ["orders"]
spout_prefixes = ["orders-"]

[principals."token:executors"]
executor = true
describe = true

[principals."token:oncall"]
describe = true
admin = true

[principals."token:other-spout"]
spouts = ["other", "orders"]

[principals."cert:{SPOUT_CERT_SUBJECT}"]
spout_prefixes = ["orders"]
"""
INIT, ACK = 1, 2


def _write_auth_files(folder, tokens: dict[str, str]) -> tuple[str, str]:
    tokens_path, policy_path = folder / "tokens", folder / "policy.toml"
    tokens_path.write_text("".join(f"{name} {hash_token(t)}  # hashed\n" for name, t in tokens.items()))
    policy_path.write_text(POLICY)
    return str(tokens_path), str(policy_path)


@pytest.fixture
def secured(pki, tmp_path):
    """An acker with TLS, tokens and the policy above (client certificates accepted, not required)."""
    tokens, policy = _write_auth_files(tmp_path, TOKENS)
    config = ServerConfig(
        host="127.0.0.1", port=0, grace=0.2, tls_cert=pki.server.cert, tls_key=pki.server.key,
        auth_tokens=tokens, auth_policy=policy,
    )  # fmt: skip
    server = AckerServer(config).start()
    server.tokens_path = tokens  # type: ignore[attr-defined]
    yield server
    server.stop(0)


@pytest.fixture
def stub_for(secured, pki):
    """An Acker stub calling ``secured`` as a token's holder (or with a raw token, or with nothing)."""
    channels = []

    def make(name: str | None = None, token: str | None = None) -> acker_pb2_grpc.AckerStub:
        token = token or (TOKENS[name] if name else None)
        channel = open_channel(
            secured.address, ChannelSecurity(tls_ca=pki.ca, token=token), [("grpc.use_local_subchannel_pool", 1)]
        )
        channels.append(channel)
        return acker_pb2_grpc.AckerStub(channel)

    yield make
    for channel in channels:
        channel.close()


def _refusals(server, reason: str) -> float:
    return server.metrics.sample("acker_auth_refusals_total", {"reason": reason}) or 0.0


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def _inits(*spouts: str) -> acker_pb2.ApplyRequest:
    roots = list(range(10, 10 + len(spouts)))
    return acker_pb2.ApplyRequest(
        kinds=[INIT] * len(spouts), root_ids=roots, values=[1] * len(spouts), spouts=list(spouts),
        spout_index=list(range(len(spouts))),
    )  # fmt: skip


def _pending(server) -> int:
    return server.call(lambda: server.ledger.pending_trees)


def _subscribe(stub, spout: str):
    stream = stub.Subscribe(acker_pb2.SubscribeRequest(spout=spout), timeout=30)
    next(stream)
    return stream


def test_calls_without_credentials_are_unauthenticated(secured, stub_for):
    """No token and no certificate: Apply, Subscribe and Describe are UNAUTHENTICATED and counted."""
    stub = stub_for()
    assert _code(lambda: stub.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: _subscribe(stub, "orders")) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: stub.Describe(acker_pb2.DescribeRequest(), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert _refusals(secured, "no_credentials") == 3
    assert _pending(secured) == 0


def test_a_wrong_token_is_unauthenticated(secured, stub_for):
    """A token not in the file (here: the hash itself, as a thief of the file would try) is refused."""
    for token in ("guess", hash_token(TOKENS["executors"])):
        stub = stub_for(token=token)
        assert _code(lambda s=stub: s.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert _refusals(secured, "unknown_token") == 2
    assert _pending(secured) == 0


def test_spout_may_init_its_own_spouts_only_and_nothing_of_a_mixed_batch_applies(secured, stub_for):
    """orders-spout may INIT "orders" and "orders-*"; a batch naming "payments" too is refused whole."""
    stub = stub_for("orders-spout")
    assert stub.Apply(_inits("orders", "orders-eu"), timeout=5).applied == 2
    assert _code(lambda: stub.Apply(_inits("orders-us", "payments"), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert _pending(secured) == 2
    assert _refusals(secured, "spout") == 1


def test_only_executors_send_acks_and_describe(secured, stub_for):
    """A spout's token may not ACK or Describe; the executors' token may."""
    spout, executor = stub_for("orders-spout"), stub_for("executors")
    spout.Apply(_inits("orders"), timeout=5)
    ack = acker_pb2.ApplyRequest(kinds=[ACK], root_ids=[10], values=[1])
    assert _code(lambda: spout.Apply(ack, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: spout.Describe(acker_pb2.DescribeRequest(), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert _pending(secured) == 1
    assert executor.Apply(ack, timeout=5).applied == 1
    assert _pending(secured) == 0
    assert executor.Describe(acker_pb2.DescribeRequest(), timeout=5).shard_count == 1
    assert (_refusals(secured, "executor"), _refusals(secured, "describe")) == (1, 1)


def test_force_fail_needs_admin_and_inspect_needs_describe(secured, stub_for):
    """Executors may Inspect (like Describe) but not ForceFail; the admin may; a spout may do neither."""
    spout, executor, oncall = stub_for("orders-spout"), stub_for("executors"), stub_for("oncall")
    spout.Apply(_inits("orders"), timeout=5)
    inspect = acker_pb2.InspectRequest(root_ids=[10], oldest=1)
    fail = acker_pb2.ForceFailRequest(root_ids=[10])
    assert _code(lambda: spout.Inspect(inspect, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert executor.Inspect(inspect, timeout=5).trees[0].status == acker_pb2.TREE_STATUS_PENDING
    assert _code(lambda: executor.ForceFail(fail, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: spout.ForceFail(fail, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert _pending(secured) == 1, "a refused ForceFail fails nothing"
    assert (_refusals(secured, "admin"), _refusals(secured, "describe")) == (2, 1)
    assert oncall.ForceFail(fail, timeout=5).failed == 1
    assert _pending(secured) == 0


def test_subscribe_needs_rights_and_takeover_needs_the_same_principal(secured, stub_for):
    """Executors may not subscribe to "orders"; another principal with rights may not take the stream over;
    the owner itself may."""
    owner = stub_for("orders-spout")
    first = _subscribe(owner, "orders")
    assert _code(lambda: _subscribe(stub_for("executors"), "orders")) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: _subscribe(stub_for("other-spout"), "orders")) == grpc.StatusCode.PERMISSION_DENIED
    assert _refusals(secured, "takeover") == 1
    second = _subscribe(stub_for("orders-spout"), "orders")
    assert _code(lambda: next(first)) == grpc.StatusCode.ABORTED
    second.cancel()


def test_client_certificate_subject_is_a_principal(pki, tmp_path):
    """With mutual TLS and no token, the certificate's subject is looked up in the policy."""
    tokens, policy = _write_auth_files(tmp_path, TOKENS)
    config = ServerConfig(
        host="127.0.0.1", port=0, grace=0.2, tls_cert=pki.server.cert, tls_key=pki.server.key,
        tls_client_ca=pki.ca, auth_tokens=tokens, auth_policy=policy,
    )  # fmt: skip
    with AckerServer(config) as server:
        as_spout = ChannelSecurity(tls_ca=pki.ca, tls_cert=pki.spout.cert, tls_key=pki.spout.key)
        as_executor = ChannelSecurity(tls_ca=pki.ca, tls_cert=pki.executor.cert, tls_key=pki.executor.key)
        with open_channel(server.address, as_spout) as ch:
            assert acker_pb2_grpc.AckerStub(ch).Apply(_inits("orders-x"), timeout=5).applied == 1
        with open_channel(server.address, as_executor, [("grpc.use_local_subchannel_pool", 1)]) as ch:
            code = _code(lambda: acker_pb2_grpc.AckerStub(ch).Apply(_inits("orders-y"), timeout=5))
        assert code == grpc.StatusCode.PERMISSION_DENIED  # its subject is not in the policy
        assert _refusals(server, "no_rights") == 1


def test_health_stays_open(secured, pki):
    """The health service answers without any credentials."""
    with open_channel(secured.address, ChannelSecurity(tls_ca=pki.ca)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reload_swaps_tokens_and_keeps_old_ones_if_the_file_is_broken(secured, stub_for):
    """reload_auth (SIGHUP) takes a rotated token file; a broken file leaves the previous tokens in force."""
    rotated = {**TOKENS, "orders-spout": "t-orders-rotated"}
    with open(secured.tokens_path, "w") as out:
        out.write("".join(f"{name} {hash_token(t)}\n" for name, t in rotated.items()))
    assert secured.reload_auth()
    assert stub_for(token="t-orders-rotated").Apply(_inits("orders"), timeout=5).applied == 1
    stale = stub_for(token=TOKENS["orders-spout"])
    assert _code(lambda: stale.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    with open(secured.tokens_path, "w") as out:
        out.write("not a token line\n")
    assert not secured.reload_auth()
    fresh = acker_pb2.ApplyRequest(kinds=[INIT], root_ids=[50], values=[1], spouts=["orders"])
    assert stub_for(token="t-orders-rotated").Apply(fresh, timeout=5).applied == 1
    assert _code(lambda: stale.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED


def test_sighup_reloads_the_tokens_of_a_running_acker_server(pki, tmp_path):
    """acker-server re-reads its tokens file on SIGHUP: a rotated token works without a restart."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    tokens, policy = _write_auth_files(tmp_path, TOKENS)
    log_path = tmp_path / "server.log"
    command = [
        sys.executable, "-m", "acker_service", "--port", "0", "--tls-cert", pki.server.cert, "--tls-key",
        pki.server.key, "--auth-tokens", tokens, "--auth-policy", policy,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not (match := re.search(r"serving on (\S+),", log_path.read_text())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert match, log_path.read_text()
        with open(tokens, "a") as out:
            out.write(f"late-spout {hash_token('t-late')}\n")
        security = ChannelSecurity(tls_ca=pki.ca, token="t-late")
        with open_channel(match.group(1), security) as channel:
            stub = acker_pb2_grpc.AckerStub(channel)
            assert _code(lambda: stub.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
            os.kill(process.pid, signal.SIGHUP)
            while "reloaded" not in log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            # Known now, but the policy gives late-spout no rights: PERMISSION_DENIED, not UNAUTHENTICATED.
            assert _code(lambda: stub.Apply(_inits("orders"), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_acker_ctl_over_tls_with_an_admin_token(secured, stub_for, pki, tmp_path, capsys):
    """acker-ctl speaks TLS with a token file: the admin's token fails a tree; an executor's is refused."""
    from acker_ctl.cli import main

    stub_for("orders-spout").Apply(_inits("orders"), timeout=5)
    tokens = {}
    for name in ("oncall", "executors"):
        tokens[name] = tmp_path / f"{name}.token"
        tokens[name].write_text(TOKENS[name] + "\n")
    base = ["--ackers", secured.address, "--tls-ca", pki.ca, "--json"]
    assert main([*base, "--token-file", str(tokens["executors"]), "fail", "10"]) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    assert main([*base, "--token-file", str(tokens["executors"]), "inspect", "10"]) == 0
    assert '"status": "pending"' in capsys.readouterr().out
    assert main([*base, "--token-file", str(tokens["oncall"]), "fail", "10"]) == 0
    assert _pending(secured) == 0


def test_a_kind_hidden_in_a_wide_varint_is_checked_as_the_ledger_reads_it(secured, pki):
    """INIT written as the 10-byte varint of 2**32 + 1 is INIT to the ledger, so the check refuses it too."""
    wide = bytearray()
    value = 2**32 + INIT
    while True:
        byte, value = value & 0x7F, value >> 7
        wide.append(byte | (0x80 if value else 0))
        if not value:
            break
    init_as_wide_varint = bytes(wide)
    data = (
        b"\x08" + init_as_wide_varint  # kinds: one INIT, unpacked, 32 bits too wide
        + b"\x11" + (10).to_bytes(8, "little")  # root_ids
        + b"\x19" + (1).to_bytes(8, "little")  # values
        + b"\x2a\x08payments"  # spouts
    )  # fmt: skip
    channel = open_channel(secured.address, ChannelSecurity(tls_ca=pki.ca, token=TOKENS["orders-spout"]))
    try:
        apply = channel.unary_unary(
            "/acker_service.v1.Acker/Apply",
            request_serializer=lambda b: b,
            response_deserializer=acker_pb2.ApplyResponse.FromString,
        )
        assert _code(lambda: apply(data, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        channel.close()
    assert _pending(secured) == 0 and _refusals(secured, "spout") == 1


def _stream_acks(stub, *requests: acker_pb2.ApplyRequest) -> list[acker_pb2.ApplyAck]:
    return list(stub.ApplyStream(iter(requests), timeout=10))


def test_apply_stream_checks_each_request_as_an_apply_and_keeps_serving(secured, stub_for):
    """On ApplyStream a request outside the caller's rights is refused in its ack (counted); the next is applied."""
    stub = stub_for("orders-spout")
    ack = acker_pb2.ApplyRequest(kinds=[ACK], root_ids=[10], values=[1])
    acks = _stream_acks(stub, _inits("orders-us", "payments"), ack, _inits("orders"))
    assert [(a.sequence, a.code) for a in acks] == [
        (1, grpc.StatusCode.PERMISSION_DENIED.value[0]),
        (2, grpc.StatusCode.PERMISSION_DENIED.value[0]),
        (3, 0),
    ]
    assert "payments" in acks[0].message and "not an executor" in acks[1].message
    assert (_refusals(secured, "spout"), _refusals(secured, "executor")) == (1, 1)
    assert _pending(secured) == 1


def test_apply_stream_without_credentials_is_unauthenticated(secured, stub_for):
    """A stream with no or a wrong token ends UNAUTHENTICATED before any request is applied."""
    for stub in (stub_for(), stub_for(token="guess")):
        assert _code(lambda s=stub: _stream_acks(s, _inits("orders"))) == grpc.StatusCode.UNAUTHENTICATED
    assert (_refusals(secured, "no_credentials"), _refusals(secured, "unknown_token")) == (1, 1)
    assert _pending(secured) == 0


def test_cluster_client_streams_with_its_token_and_a_refused_batch_spares_the_next(secured, pki):
    """A ClusterClient's batches go over one ApplyStream carrying its token; a refused spout is RequestRefused."""
    from acker_client import ClusterClient, new_id
    from acker_client.errors import RequestRefused

    security = ChannelSecurity(tls_ca=pki.ca, token=TOKENS["orders-spout"])
    with ClusterClient([secured.address], security=security, verify=False) as client:
        client.init(new_id(), 1, "payments")
        with pytest.raises(RequestRefused) as caught:
            client.flush()
        assert caught.value.failures[0].code == grpc.StatusCode.PERMISSION_DENIED
        assert "payments" in caught.value.failures[0].detail
        client.init(new_id(), 1, "orders")
        client.flush()
    assert _pending(secured) == 1
    labels = {"grpc_type": "BIDI_STREAM", "grpc_service": "acker_service.v1.Acker", "grpc_method": "ApplyStream"}
    assert secured.metrics.sample("grpc_server_started_total", labels) == 1


def test_layout_changes_need_admin(secured, stub_for):
    """PrepareLayout, CutLayout, CommitLayout and Handoff are operator calls: an executor is refused, the admin is not."""
    executor, oncall = stub_for("executors"), stub_for("oncall")
    layout = acker_pb2.Layout(epoch=1, shard_count=1, shard_index=0, addresses=["127.0.0.1:1"])
    prepare = acker_pb2.PrepareLayoutRequest(layout=layout)
    assert _code(lambda: executor.PrepareLayout(prepare, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    handoff = acker_pb2.HandoffRequest(epoch=1)
    assert _code(lambda: executor.Handoff(handoff, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert executor.Describe(acker_pb2.DescribeRequest(), timeout=5).move_state == "serving"
    assert oncall.PrepareLayout(prepare, timeout=5).move_state == "prepared"
    assert oncall.CutLayout(acker_pb2.CutLayoutRequest(epoch=1), timeout=5).moved_trees == 0
    assert oncall.CommitLayout(acker_pb2.CommitLayoutRequest(epoch=1), timeout=5).layout.epoch == 1
