"""Client-side transport security: TLS / mTLS channel credentials and an optional bearer token.

Every client of the ackers (ClusterClient, the Spark bolts and spouts,
acker-bench, acker-healthcheck) builds its channels through :func:`open_channel`
with one :class:`ChannelSecurity`, so the options mean the same everywhere.
A bearer token is sent only over TLS: gRPC refuses call credentials on a
plaintext channel, and a token in clear text would be anyone's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["ChannelSecurity", "open_channel", "read_token"]


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def read_token(path: str) -> str:
    """The token in ``path`` (the first non-empty line, whitespace trimmed)."""
    for line in Path(path).read_text().splitlines():
        if line.strip():
            return line.strip()
    raise ValueError(f"token file {path} is empty")


@dataclass(frozen=True)
class ChannelSecurity:
    """How to reach TLS-protected ackers; the default (all None) is plaintext.

    ``tls_ca``: PEM file of the CA that signed the ackers' certificates (None
    with ``tls=True``: the system's roots). ``tls_cert``/``tls_key``: this
    client's certificate and key, for mutual TLS. ``token``/``token_file``: a
    bearer token sent as ``authorization: Bearer ...`` on every call.
    ``server_name``: the name to check the ackers' certificate against, when it
    differs from the address's host. Only paths are held, so the object can be
    pickled to Spark executors, where the files must exist too.
    """

    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = None
    token_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a client certificate needs its key: give both tls_cert and tls_key, or neither")
        if (self.token or self.token_file) and not self.uses_tls:
            raise ValueError("a bearer token is only sent over TLS: give tls_ca (or tls=True) as well")

    @property
    def uses_tls(self) -> bool:
        """True if channels are TLS (any TLS option given)."""
        return bool(self.tls or self.tls_ca or self.tls_cert)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, prefix: str = "ACKER_CLIENT_") -> ChannelSecurity:
        """Read ``{prefix}TLS_CA``, ``TLS_CERT``, ``TLS_KEY``, ``TOKEN_FILE``, ``SERVER_NAME`` (unset: plaintext)."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(prefix + name) or None

        return cls(
            tls=bool(get("TLS_CA") or get("TLS_CERT")),
            tls_ca=get("TLS_CA"),
            tls_cert=get("TLS_CERT"),
            tls_key=get("TLS_KEY"),
            token_file=get("TOKEN_FILE"),
            server_name=get("SERVER_NAME"),
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials (with the bearer token attached), or None for plaintext."""
        if not self.uses_tls:
            return None
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca),
            private_key=_read(self.tls_key),
            certificate_chain=_read(self.tls_cert),
        )
        token = self.token or (read_token(self.token_file) if self.token_file else None)
        if token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return creds

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options (the name to verify the server's certificate against)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def open_channel(
    address: str, security: ChannelSecurity | None, options: Sequence[tuple[str, object]] = ()
) -> grpc.Channel:
    """A channel to ``address``: TLS (and token) as ``security`` says, else plaintext."""
    creds = security.channel_credentials() if security is not None else None
    if creds is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, creds, options=list(options) + security.channel_options())  # type: ignore[union-attr]
