"""Every metric's HELP text is the meaning docs/server.md gives it (issue 12: they had drifted apart)."""

from __future__ import annotations

import re
from pathlib import Path

from acker_client.testing import local_cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
_ROW = re.compile(r"^\| `([a-z_]+)(?:\{[^`]*\})?` \| (\w+) \| (.*) \|$")
# Need a server with tokens (tests/security checks it) or one that catches up (checked below); the rest are
# on every acker.
_CATCHUP = {
    "acker_catchup_state",
    "acker_catchup_entries_total",
    "acker_catchup_held_requests",
    "acker_catchup_held_operations",
    "acker_catchup_refused_total",
    "acker_catchup_lost_ranges_total",
}
_NOT_ON_A_PLAIN_SERVER = {"acker_auth_refusals_total"} | _CATCHUP


def documented() -> dict[str, str]:
    """Metric name (as exposed, with _total / _info) -> its meaning as a HELP sentence."""
    rows = {}
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            meaning = re.sub(r"\s*\(see \[[^\]]*\]\([^)]*\)\)", "", match[3]).replace("`", "")
            rows[match[1]] = meaning[0].upper() + meaning[1:] + "."
    return rows


def test_help_texts_match_the_documented_meanings() -> None:
    docs = documented()
    with local_cluster(1) as ackers:
        registry = ackers.servers[0].shard.metrics.registry
        exposed = {}
        for family in registry.collect():
            suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
            exposed[family.name + suffix] = family.documentation
    ours = {name: text for name, text in exposed.items() if not name.startswith("process_")}
    assert set(ours) == set(docs) - _NOT_ON_A_PLAIN_SERVER
    assert {name: ours[name] for name in ours} == {name: docs[name] for name in ours}


def test_catchup_help_texts_match_the_documented_meanings() -> None:
    """A restarted replica (--replicas 2 with --peers) exposes the catch-up metrics, as documented."""
    from acker_service.config import ServerConfig
    from acker_service.shard import Shard

    shard = Shard(ServerConfig(shard_index=0, shard_count=2, replicas=2, peers="127.0.0.1:1,127.0.0.1:2"))
    exposed = {}
    for family in shard.metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        exposed[family.name + suffix] = family.documentation
    docs = documented()
    assert {name: exposed[name] for name in _CATCHUP} == {name: docs[name] for name in _CATCHUP}
