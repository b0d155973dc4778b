"""The shard index from the host name: a Kubernetes StatefulSet pod ``<name>-<ordinal>`` is shard ``<ordinal>``.

A StatefulSet gives its pods stable names ending in their ordinal (``acker-0``,
``acker-1``, ...), and each container's host name is its pod name. With
``ACKER_SHARD_INDEX_FROM_HOSTNAME=1`` the acker takes that ordinal as its shard
index, so one pod template serves every shard and the replica count is the shard
count.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping

__all__ = ["FROM_HOSTNAME_ENV", "ShardIdentityError", "ordinal_of", "environ_with_shard_index"]

FROM_HOSTNAME_ENV = "ACKER_SHARD_INDEX_FROM_HOSTNAME"
_SHARD_INDEX_ENV = "ACKER_SHARD_INDEX"
_ORDINAL = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?-(0|[1-9][0-9]*)$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class ShardIdentityError(ValueError):
    """The host name carries no ordinal, or contradicts an explicit ACKER_SHARD_INDEX."""


def ordinal_of(hostname: str) -> int:
    """The ordinal at the end of a StatefulSet pod name (``ackers-2`` -> 2; the domain part is ignored)."""
    name = hostname.split(".", 1)[0].lower()
    match = _ORDINAL.match(name)
    if match is None:
        raise ShardIdentityError(
            f"host name {hostname!r} does not end in '-<ordinal>' as a StatefulSet pod's does; "
            f"unset {FROM_HOSTNAME_ENV} and set {_SHARD_INDEX_ENV} instead"
        )
    return int(match.group(2))


def environ_with_shard_index(environ: Mapping[str, str], hostname: Callable[[], str] | None = None) -> dict[str, str]:
    """``environ`` with ACKER_SHARD_INDEX set from the host name when ACKER_SHARD_INDEX_FROM_HOSTNAME is on.

    Unchanged when the option is off. An explicit ACKER_SHARD_INDEX must agree
    with the host name's ordinal: two sources of truth that disagree would put a
    shard at the wrong position of every client's address list.
    """
    env = dict(environ)
    flag = env.get(FROM_HOSTNAME_ENV, "").strip().lower()
    if flag in _FALSE:
        return env
    if flag not in _TRUE:
        raise ShardIdentityError(f"{FROM_HOSTNAME_ENV}={env[FROM_HOSTNAME_ENV]!r}: use 1 or 0")
    name = (hostname or socket.gethostname)()
    index = ordinal_of(name)
    explicit = env.get(_SHARD_INDEX_ENV)
    if explicit is not None and explicit.strip() != str(index):
        raise ShardIdentityError(
            f"{_SHARD_INDEX_ENV}={explicit} contradicts host name {name!r} (ordinal {index}) "
            f"with {FROM_HOSTNAME_ENV} on; set only one of them"
        )
    env[_SHARD_INDEX_ENV] = str(index)
    return env
