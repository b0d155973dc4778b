"""Every metric's HELP text is the meaning docs/server.md gives it (issue 12: they had drifted apart)."""

from __future__ import annotations

import re
from pathlib import Path

from acker_client.testing import local_cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
_ROW = re.compile(r"^\| `([a-z_]+)(?:\{[^`]*\})?` \| (\w+) \| (.*) \|$")
# Needs a server with tokens (tests/security checks it); the rest are on every acker.
_NOT_ON_A_PLAIN_SERVER = {"acker_auth_refusals_total"}


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
