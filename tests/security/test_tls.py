"""TLS and mutual TLS on the gRPC port and the metrics endpoint, with real handshakes."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import grpc
import pytest
from acker_client import ClusterClient
from acker_protocol.credentials import ChannelSecurity, open_channel
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc

from acker_service.config import ConfigError, ServerConfig
from acker_service.healthcheck import main as healthcheck_main
from acker_service.server import AckerServer


@pytest.fixture
def start():
    """Start servers on 127.0.0.1 free ports with overrides; stop them at teardown."""
    servers = []

    def make(**overrides) -> AckerServer:
        server = AckerServer(ServerConfig(host="127.0.0.1", port=0, grace=0.2, **overrides)).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(0)


def _describe(address: str, security: ChannelSecurity | None) -> acker_pb2.DescribeResponse:
    with open_channel(address, security) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=5)


def test_tls_server_serves_a_client_that_trusts_its_ca(start, pki):
    """Over TLS, a ClusterClient with the CA applies a batch; a plaintext client is refused."""
    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key)
    with ClusterClient([server.address], security=ChannelSecurity(tls_ca=pki.ca)) as client:
        client.init(7, 1, "s")
        client.flush()
    assert server.call(lambda: server.ledger.pending_trees) == 1
    with pytest.raises(grpc.RpcError) as caught:
        _describe(server.address, None)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_refuses_a_server_certificate_it_cannot_verify(start, pki, tmp_path):
    """A client trusting another CA does not talk to the server (UNAVAILABLE: handshake failed)."""
    from acker_bench.testcerts import CertificateAuthority

    other = CertificateAuthority(tmp_path, "other-ca")
    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key)
    with pytest.raises(grpc.RpcError) as caught:
        _describe(server.address, ChannelSecurity(tls_ca=other.ca))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("client", ["none", "expired", "untrusted"])
def test_mutual_tls_refuses_clients_without_a_valid_certificate(start, pki, client):
    """With --tls-client-ca, no certificate, an expired one or one from another CA fails the handshake."""
    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca)
    issued = {"none": None, "expired": pki.expired, "untrusted": pki.untrusted}[client]
    security = ChannelSecurity(
        tls_ca=pki.ca, tls_cert=issued.cert if issued else None, tls_key=issued.key if issued else None
    )
    with pytest.raises(grpc.RpcError) as caught:
        _describe(server.address, security)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    good = ChannelSecurity(tls_ca=pki.ca, tls_cert=pki.spout.cert, tls_key=pki.spout.key)
    assert _describe(server.address, good).shard_count == 1


def test_healthcheck_speaks_tls(start, pki, capsys):
    """acker-healthcheck with --tls-ca and a client certificate reports SERVING from an mTLS acker."""
    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca)
    argv = ["--address", server.address, "--tls-ca", pki.ca, "--tls-cert", pki.executor.cert]
    assert healthcheck_main([*argv, "--tls-key", pki.executor.key]) == 0
    assert "SERVING" in capsys.readouterr().out
    assert healthcheck_main(["--address", server.address, "--timeout", "2"]) == 1


def test_metrics_endpoint_over_https_with_client_certificates(start, pki):
    """/metrics over HTTPS requires a scraper certificate from the client CA."""
    server = start(
        metrics_port=0,
        metrics_tls_cert=pki.server.cert,
        metrics_tls_key=pki.server.key,
        metrics_tls_client_ca=pki.ca,
    )
    assert server.metrics_url is not None and server.metrics_url.startswith("https://")
    trusting = ssl.create_default_context(cafile=pki.ca)
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(server.metrics_url, context=trusting, timeout=5).read()
    trusting.load_cert_chain(pki.executor.cert, pki.executor.key)
    body = urllib.request.urlopen(server.metrics_url, context=trusting, timeout=5).read().decode()
    assert "acker_pending_trees" in body


def test_half_a_key_pair_is_refused_at_start(pki):
    """A certificate without its key (or a client CA without a server certificate) fails configuration."""
    with pytest.raises(ConfigError):
        ServerConfig(tls_cert=pki.server.cert)
    with pytest.raises(ConfigError):
        ServerConfig(tls_client_ca=pki.ca)


def test_bolt_and_stream_options_carry_security_to_their_clients(start, pki):
    """client_for (used by Bolt on executors) and the acker_spout options build TLS clients."""
    from acker_spark.steps.executor import client_for, close_clients
    from acker_spark.streaming import StreamOptions

    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key)
    security = ChannelSecurity(tls_ca=pki.ca)
    try:
        client = client_for([server.address], security)
        assert client is client_for([server.address], security)
        client.init(9, 1, "s")
        client.flush()
    finally:
        close_clients()
    assert server.call(lambda: server.ledger.pending_trees) == 1
    stream = {"database": "x.db", "path": "in", "checkpoint": "cp"}
    options = StreamOptions.parse({"ackers": server.address, **stream, "TLS_CA": pki.ca})
    assert options.security == ChannelSecurity(tls=True, tls_ca=pki.ca)
    assert StreamOptions.parse({"ackers": "a:1", **stream}).security is None


def test_security_flags_fall_back_to_environment(pki, tmp_path):
    """--tls-* and --auth-* read ACKER_* variables; an empty variable means off."""
    from acker_service.cli import build_parser, config_from_args

    policy = tmp_path / "policy.toml"
    policy.write_text("")
    env = {
        "ACKER_TLS_CERT": pki.server.cert,
        "ACKER_TLS_KEY": pki.server.key,
        "ACKER_TLS_CLIENT_CA": pki.ca,
        "ACKER_AUTH_POLICY": str(policy),
        "ACKER_METRICS_TLS_CERT": "",
    }
    config = config_from_args(build_parser(env).parse_args([]))
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == (pki.server.cert, pki.server.key, pki.ca)
    assert (config.auth_policy, config.metrics_tls_cert) == (str(policy), None)


def test_mutual_tls_answers_no_health_check_or_reflection_without_a_certificate(start, pki):
    """What docs/security.md promises: under --tls-client-ca nothing answers a caller without a certificate."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    server = start(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_client_ca=pki.ca)
    with open_channel(server.address, ChannelSecurity(tls_ca=pki.ca)) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            ProtoReflectionDescriptorDatabase(channel).get_services()
    with_cert = ChannelSecurity(tls_ca=pki.ca, tls_cert=pki.spout.cert, tls_key=pki.spout.key)
    with open_channel(server.address, with_cert) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
