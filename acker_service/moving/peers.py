"""How an acker reaches the other ackers (the handoffs of a layout change): plaintext, TLS or mutual TLS.

An acker serving plaintext calls its peers in plaintext. An acker serving TLS
calls them over TLS, verifying their certificates with ``--peer-tls-ca`` (by
default the ``--tls-client-ca`` bundle under mutual TLS, else the system's
roots); under mutual TLS it presents ``--peer-tls-cert`` / ``--peer-tls-key``
(by default its own ``--tls-cert`` / ``--tls-key``, which then needs the
clientAuth key usage). A handoff carries the bearer token of the operator who
called CutLayout (see the servicer), so the peer checks the same principal's
rights; a restarted replica's catch-up is the acker's own call and sends
``--peer-token-file``'s token (:func:`catchup_security`).
"""

from __future__ import annotations

import dataclasses

import grpc
from acker_protocol import grpc_options
from acker_protocol.credentials import ChannelSecurity

from ..config import ServerConfig

__all__ = ["peer_security", "catchup_security", "open_peer_channel"]


def peer_security(config: ServerConfig) -> ChannelSecurity | None:
    """The channel security for calls to the other ackers; None when this acker serves plaintext."""
    if config.tls_cert is None:
        return None
    mutual = config.tls_client_ca is not None
    cert = config.peer_tls_cert or (config.tls_cert if mutual else None)
    key = config.peer_tls_key or (config.tls_key if mutual else None)
    return ChannelSecurity(
        tls=True,
        tls_ca=config.peer_tls_ca or config.tls_client_ca,
        tls_cert=cert,
        tls_key=key,
        server_name=config.peer_server_name,
    )


def catchup_security(config: ServerConfig) -> ChannelSecurity | None:
    """The channel security of the catch-up's calls: :func:`peer_security` plus ``--peer-token-file``'s token."""
    security = peer_security(config)
    if security is None:
        return None
    return dataclasses.replace(security, token_file=config.peer_token_file)


def open_peer_channel(address: str, security: ChannelSecurity | None) -> grpc.aio.Channel:
    """An asyncio channel to another acker at ``address``, secured as ``security`` says (None: plaintext)."""
    options = list(grpc_options.client_options())
    if security is None:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = security.channel_credentials()
    return grpc.aio.secure_channel(address, credentials, options=options + security.channel_options())
