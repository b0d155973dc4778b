"""Figures the operator-facing texts repeat agree with the measurement they come from (issue 21's doc defects)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _measured_bytes_per_pending_tree() -> tuple[float, float]:
    """(native, reference) RSS bytes per pending tree from docs/native-ledger.md's measurement table."""
    row = re.search(
        r"^\| RSS per pending tree [^|]*\|[^|]*\| ([\d.]+) bytes[^|]*\| ([\d.]+) bytes[^|]*\|$",
        _read("docs/native-ledger.md"),
        re.M,
    )
    assert row, "docs/native-ledger.md lost its RSS-per-pending-tree row"
    return float(row.group(1)), float(row.group(2))


def _read(path: str) -> str:
    return (REPO / path).read_text()


def _quotes(text: str, measured: float, tolerance: float) -> bool:
    """True if ``text`` names a whole number of bytes within ``tolerance`` of ``measured`` (re-measuring moves it a little)."""
    return any(abs(int(n) - measured) <= tolerance for n in re.findall(r"\b(\d+)\b", text))


def test_pending_growth_alert_texts_quote_the_measured_bytes_per_tree():
    """The AckerPendingGrowing alert (operations.md and the Prometheus rule) quotes the measured figures."""
    native, reference = _measured_bytes_per_pending_tree()
    (row,) = [line for line in _read("docs/operations.md").splitlines() if line.startswith("| `AckerPendingGrowing`")]
    rule = _read("deploy/prometheus/alerts.yml").split("alert: AckerPendingGrowing", 1)[1].split("- alert:", 1)[0]
    for name, text in (("docs/operations.md", row), ("alerts.yml", " ".join(rule.split()))):
        assert _quotes(text, native, 2) and _quotes(text, reference, 5), f"{name}: {text}"
        assert "200 bytes" not in text and "about 200" not in text, f"{name} still quotes ~200 bytes per tree"
