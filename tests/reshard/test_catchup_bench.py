"""acker-bench --mode catchup on a small load: the restarted acker copies trees, and its partner's loss costs nothing."""

from __future__ import annotations

import json

from acker_bench.cli import main as acker_bench


def test_catchup_bench_reports_its_figures(capsys):
    """The JSON carries the figures; a small run copies trees and loses, replays and false-acks none."""
    code = acker_bench(["--mode", "catchup", "--pending-trees", "3000", "--duration", "2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("moved_trees", "catchup_seconds", "held_seconds", "lost", "replayed", "false_acks"):
        assert key in result
    # Shard 1 keeps two of the three ranges: about two thirds of the pending trees, all copied back.
    assert result["moved_trees"] >= 3000 // 2 and result["steady_trees"] > 0
    assert (result["lost"], result["replayed"], result["false_acks"]) == (0, 0, 0)
