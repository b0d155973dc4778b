"""A throwaway CA, an untrusted one, and the certificates the TLS and authorization tests use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from acker_bench.testcerts import CertificateAuthority


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> SimpleNamespace:
    """Trusted CA with a server cert and client certs (one expired), plus a client cert from an untrusted CA."""
    folder = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(folder, "trusted-ca")
    rogue = CertificateAuthority(folder, "rogue-ca")
    return SimpleNamespace(
        ca=ca.ca,
        server=ca.issue("localhost", server=True),
        spout=ca.issue("orders-spout"),
        executor=ca.issue("executors"),
        expired=ca.issue("orders-spout", expired=True),
        untrusted=rogue.issue("orders-spout"),
        folder=folder,
        authority=ca,  # issues further certificates from the trusted CA
    )
