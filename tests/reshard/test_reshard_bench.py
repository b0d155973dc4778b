"""acker-bench --mode reshard on a small load: it moves trees both ways and counts 0 lost, replayed and false acks."""

from __future__ import annotations

import json

from acker_bench.cli import main as acker_bench


def test_reshard_bench_reports_its_figures(capsys):
    """The JSON carries the issue's figures; a small run moves trees and loses, replays and false-acks none."""
    code = acker_bench(["--mode", "reshard", "--from", "3", "--to", "4", "--back", "--pending-trees", "3000",
                        "--duration", "2", "--json"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("moved_trees", "move_seconds", "lost", "replayed", "false_acks", "p99_ms_steady", "p99_ms_during"):
        assert key in result
    assert [m["to_shards"] for m in result["moves"]] == [4, 3]
    assert result["replicas"] == 1
    assert result["moved_trees"] > 0 and result["steady_trees"] > 0
    assert (result["lost"], result["replayed"], result["false_acks"], result["more_than_one_outcome"]) == (0, 0, 0, 0)


def test_reshard_bench_moves_a_replicated_cluster(capsys):
    """--replicas 2: both copies move, 3 -> 4 -> 3 under load, and the JSON says replicas 2 (it used to be refused)."""
    code = acker_bench(["--mode", "reshard", "--replicas", "2", "--from", "3", "--to", "4", "--back",
                        "--pending-trees", "3000", "--duration", "2", "--json"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["replicas"] == 2 and [m["to_shards"] for m in result["moves"]] == [4, 3]
    assert result["moved_trees"] > 0 and result["steady_trees"] > 0
    assert (result["lost"], result["replayed"], result["false_acks"], result["more_than_one_outcome"]) == (0, 0, 0, 0)


def test_reshard_bench_refuses_a_layout_smaller_than_the_replicas(capsys):
    """--replicas 2 needs two ackers on both sides of the move: refused with the reason."""
    code = acker_bench(["--mode", "reshard", "--replicas", "2", "--from", "2", "--to", "1", "--pending-trees", "100",
                        "--duration", "1", "--json"])  # fmt: skip
    assert code == 1
    assert "--replicas 2 needs at least 2 ackers in both layouts" in capsys.readouterr().err
