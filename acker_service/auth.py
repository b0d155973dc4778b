"""Who is calling (a bearer token or an mTLS client certificate) and what the policy lets them do.

A principal is ``token:<name>`` for a bearer token listed in the tokens file,
or ``cert:<subject>`` for a verified client certificate (``CN=...,O=...``).
The tokens file holds only SHA-256 hashes (``name <hex>`` per line); a
presented token is hashed and compared with every entry in constant time.
The policy (TOML) lists per principal the spouts it may INIT and Subscribe to
(exact names and prefixes), whether it may send ACK / FAIL / RESET_TIMEOUT
(``executor``), whether it may call Describe and Inspect (``describe``) and
whether it may fail trees from outside with ForceFail (``admin``)::

    [principals."token:orders-spout"]
    spouts = ["orders"]
    spout_prefixes = ["orders-"]

    [principals."cert:CN=spark-executors,O=example"]
    executor = true
    describe = true

    [principals."token:oncall"]
    describe = true
    admin = true

Both files are read again on :meth:`Authenticator.reload` (SIGHUP); a file
that does not parse leaves the previous version in force. The health service
and reflection stay open: they reveal nothing about trees or spouts.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from acker_protocol.apply_codec import decode_apply_request
from acker_protocol.packed import ApplyHeader, decode_apply_header
from acker_protocol.text import clip
from acker_protocol.v1 import acker_pb2
from acker_protocol.wire import OpKind
from prometheus_client import CollectorRegistry, Counter

from .apply_stream import RefusedRequest
from .handlers import HandlerInterceptor, HandlerKind, around, rewrap

__all__ = ["Authenticator", "AuthInterceptor", "Policy", "Rights", "load_tokens", "hash_token", "REASONS"]

log = logging.getLogger("acker_service")

ACKER_METHODS = "/acker_service.v1.Acker/"
# Refusal reasons, the only label values of acker_auth_refusals_total (never a name).
REASONS = ("no_credentials", "unknown_token", "no_rights", "spout", "executor", "describe", "takeover", "admin")


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: str) -> list[tuple[str, bytes]]:
    """(name, sha256 digest) per line ``name <64 hex digits>``; '#' starts a comment."""
    tokens = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) != 64:
            raise ValueError(f"{path}:{number}: expected 'name <sha256 hex>'")
        tokens.append((parts[0], bytes.fromhex(parts[1])))
    return tokens


# The operator calls: failing trees from outside and the steps of a layout change (reshard, drain).
# Snapshot: a restarted replica copying its range from its partner (catch-up).
ADMIN_METHODS = ("ForceFail", "PrepareLayout", "CutLayout", "CommitLayout", "Handoff", "Snapshot")


@dataclass(frozen=True)
class Rights:
    """What one principal may do."""

    spouts: frozenset[str] = frozenset()
    spout_prefixes: tuple[str, ...] = ()
    executor: bool = False
    describe: bool = False
    admin: bool = False  # ForceFail: end other principals' trees (operators only)

    def may_use_spout(self, spout: str) -> bool:
        """INIT trees for, and Subscribe to, ``spout``."""
        return spout in self.spouts or any(spout.startswith(p) for p in self.spout_prefixes)


@dataclass(frozen=True)
class Policy:
    """Rights by principal; a principal not listed may do nothing."""

    principals: dict[str, Rights] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> Policy:
        """Parse the TOML policy file; raise ValueError naming what is wrong."""
        data = tomllib.loads(Path(path).read_text())
        principals = {}
        for name, entry in data.get("principals", {}).items():
            unknown = set(entry) - {"spouts", "spout_prefixes", "executor", "describe", "admin"}
            if unknown:
                raise ValueError(f"{path}: principal {name!r} has unknown keys {sorted(unknown)}")
            principals[name] = Rights(
                frozenset(entry.get("spouts", ())),
                tuple(entry.get("spout_prefixes", ())),
                bool(entry.get("executor", False)),
                bool(entry.get("describe", False)),
                bool(entry.get("admin", False)),
            )
        return cls(principals)


class Refused(Exception):
    """A call outside its principal's rights: the status, the message and the metric reason."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class Authenticator:
    """Identifies callers and checks requests against the policy; reloadable."""

    def __init__(self, tokens_path: str | None, policy_path: str, registry: CollectorRegistry | None = None) -> None:
        self._tokens_path = tokens_path
        self._policy_path = policy_path
        self._tokens: list[tuple[str, bytes]] = load_tokens(tokens_path) if tokens_path else []
        self.policy = Policy.load(policy_path)
        self.refusals = Counter(
            "acker_auth_refusals", "Calls refused by authentication or authorization, by reason.", ["reason"],
            registry=registry,
        )  # fmt: skip
        for reason in REASONS:
            self.refusals.labels(reason)

    def reload(self) -> bool:
        """Read the tokens and policy files again; keep the old ones (and log) if either is broken."""
        try:
            tokens = load_tokens(self._tokens_path) if self._tokens_path else []
            policy = Policy.load(self._policy_path)
        except (OSError, ValueError) as exc:
            log.error("kept the previous tokens and policy: %s", exc)
            return False
        self._tokens, self.policy = tokens, policy
        log.info("reloaded %d tokens and %d principals", len(tokens), len(policy.principals))
        return True

    def principal(self, context: grpc.aio.ServicerContext) -> str:
        """``token:<name>`` or ``cert:<subject>``; raise Refused(UNAUTHENTICATED) if neither is valid."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                name = self._token_name(token.strip()) if scheme.lower() == "bearer" else None
                if name is None:
                    raise Refused(grpc.StatusCode.UNAUTHENTICATED, "unknown_token", "the bearer token is not valid")
                return f"token:{name}"
        subject = (context.auth_context() or {}).get("x509_subject")
        if subject:
            return f"cert:{subject[0].decode(errors='replace')}"
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "no_credentials",
            "no credentials: present a client certificate (mutual TLS) or 'authorization: Bearer <token>'",
        )

    def _token_name(self, token: str) -> str | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for name, expected in self._tokens:  # every entry, so the time says nothing about which matched
            if hmac.compare_digest(digest, expected):
                found = name
        return found

    def rights(self, principal: str) -> Rights:
        """The principal's rights; Refused(PERMISSION_DENIED) if the policy does not list it."""
        rights = self.policy.principals.get(principal)
        if rights is None:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED, "no_rights", f"{clip(principal)} has no rights on this acker"
            )
        return rights


def _apply_header(request: bytes | acker_pb2.ApplyRequest) -> ApplyHeader | None:
    """The fields the check reads: from the bytes without decoding the id arrays; None if they do not decode."""
    if isinstance(request, bytes):
        try:
            return decode_apply_header(request)
        except ValueError:
            # Let protobuf have the last word, so the check never reads less than the ledger will.
            try:
                columns = decode_apply_request(request)
            except Exception:  # undecodable: the servicer refuses it with INVALID_ARGUMENT
                return None
            return ApplyHeader(columns.kinds, columns.spouts, columns.spout_index.astype(np.uint64))
    return ApplyHeader(
        np.asarray(request.kinds, dtype=np.int64), list(request.spouts), np.asarray(request.spout_index, np.uint64)
    )


def _apply_spouts(header: ApplyHeader) -> tuple[set[str], bool]:
    """(spouts named by INIT operations, whether any operation is ACK / FAIL / RESET_TIMEOUT or unknown)."""
    kinds, names, index = header.kinds, header.spouts, header.spout_index
    inits = np.flatnonzero(kinds == OpKind.INIT)
    others = len(inits) != len(kinds)
    if not len(inits):
        return set(), others
    if not len(index):
        return set(names[:1]), others
    # Out-of-range indexes are refused by validation afterwards; they name no spout here.
    named = index[inits[inits < len(index)]]
    return {names[i] for i in np.unique(named[named < len(names)]).tolist()}, others


class AuthInterceptor(HandlerInterceptor):
    """Checks every Acker call (not health or reflection) before the servicer sees it."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth
        self._owners: dict[str, tuple[str, int]] = {}  # spout -> (principal, open streams): takeover check

    def wrap_handler(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """Acker methods checked against the policy first; health and reflection as they are."""
        if not method.startswith(ACKER_METHODS):
            return handler
        name = method[len(ACKER_METHODS) :]

        def wrap(behavior: Callable, kind: HandlerKind) -> Callable:
            # ApplyStream streams requests (each checked as an Apply); Subscribe streams
            # responses; Apply, Describe, Inspect and ForceFail answer once.
            if kind.request_streaming:
                return self._guard_apply_stream(behavior)
            if name in ADMIN_METHODS:  # Snapshot streams its answer: checked once, as the admin calls are
                return self._guard_unary(behavior, name)
            return self._guard_stream(behavior) if kind.response_streaming else self._guard_unary(behavior, name)

        return rewrap(handler, wrap)

    async def _refuse(self, context: grpc.aio.ServicerContext, refused: Refused) -> None:
        self.auth.refusals.labels(refused.reason).inc()
        await context.abort(refused.code, refused.message)

    def _check_unary(self, name: str, request, context) -> None:
        principal = self.auth.principal(context)
        rights = self.auth.rights(principal)
        if name in ("Describe", "Inspect"):
            if not rights.describe:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, "describe", f"{clip(principal)} may not call {name}")
            return
        if name in ADMIN_METHODS:
            if not rights.admin:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "admin",
                    f"{clip(principal)} may not call {name} (needs admin = true in the policy); nothing changed",
                )
            return
        self._check_apply(principal, rights, request)

    def _check_apply(self, principal: str, rights: Rights, request) -> None:
        """Refuse an Apply request (or one of ApplyStream) that uses operations or spouts outside ``rights``."""
        # Apply takes the raw bytes (the ledger decodes them); the check reads only the
        # kinds, spout names and spout index of them, stepping over the id arrays.
        header = _apply_header(request)
        if header is None:
            return
        spouts, others = _apply_spouts(header)
        if others and not rights.executor:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "executor",
                f"{clip(principal)} may not send ACK, FAIL or RESET_TIMEOUT (not an executor); nothing was applied",
            )
        for spout in sorted(spouts):
            if not rights.may_use_spout(spout):
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "spout",
                    f"{clip(principal)} may not INIT trees for spout {clip(spout)}; nothing was applied",
                )

    def _guard_unary(self, behavior: Callable, name: str) -> Callable:
        async def check(request, context) -> None:
            try:
                self._check_unary(name, request, context)
            except Refused as refused:
                await self._refuse(context, refused)

        return around(behavior, check)

    def _guard_apply_stream(self, behavior: Callable) -> Callable:
        """ApplyStream: the caller is identified once; each request is checked as an Apply and refused on its own."""
        auth = self.auth

        async def stream(requests, context):
            try:
                principal = auth.principal(context)
                auth.rights(principal)
            except Refused as refused:
                await self._refuse(context, refused)

            async def checked():
                async for request in requests:
                    try:
                        # Looked up per request, so a reloaded policy applies to open streams too.
                        self._check_apply(principal, auth.rights(principal), request)
                    except Refused as refused:
                        auth.refusals.labels(refused.reason).inc()
                        yield RefusedRequest(refused.code, refused.message)
                        continue
                    yield request

            async for response in behavior(checked(), context):
                yield response

        return stream

    def _guard_stream(self, behavior: Callable) -> Callable:
        async def start(request, context) -> str:
            spout = request.spout
            try:
                principal = self.auth.principal(context)
                if not self.auth.rights(principal).may_use_spout(spout):
                    raise Refused(
                        grpc.StatusCode.PERMISSION_DENIED,
                        "spout",
                        f"{clip(principal)} may not subscribe to {clip(spout)}",
                    )
                owner = self._owners.get(spout)
                if owner is not None and owner[0] != principal:
                    raise Refused(
                        grpc.StatusCode.PERMISSION_DENIED,
                        "takeover",
                        f"spout {clip(spout)} is subscribed by another principal; only it may take the stream over",
                    )
            except Refused as refused:
                await self._refuse(context, refused)
            self._owners[spout] = (principal, (owner[1] if owner else 0) + 1)
            return spout

        def finish(spout: str, context, error) -> None:
            held_by, count = self._owners[spout]
            if count <= 1:
                del self._owners[spout]
            else:
                self._owners[spout] = (held_by, count - 1)

        return around(behavior, start, finish)
