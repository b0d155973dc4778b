"""tools/tracking_cost.py: the per-word tracking cost script runs and reports every stage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "tracking_cost.py"


def _load():
    spec = importlib.util.spec_from_file_location("tracking_cost", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tracking_cost_reports_each_stage_for_both_variants():
    """A tiny run gives per-word figures for every stage, and tracked tuples pickle larger than untracked ones."""
    result = _load().measure(50, 1)
    assert result["records"] == 50 and result["words"] > 50
    for stage in ("split", "pickle", "unpickle", "ack"):
        assert result[f"{stage}_tracked_us"] > 0 and result[f"{stage}_untracked_us"] > 0
    sizes = result["pickled_bytes_per_word"]
    assert 15 <= sizes["tracked"] - sizes["untracked"] <= 25  # one root: two 64-bit ints, flat
