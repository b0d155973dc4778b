"""acker-bench's JSON output and the acker_client.testing helper."""

from __future__ import annotations

import json

import numpy as np
import pytest
from acker_bench.cli import main
from acker_client import ClusterClient, new_id
from acker_client.testing import local_cluster


def test_bench_json_against_embedded_cluster(capsys):
    """acker-bench --json (embedded acker process) prints one JSON object with positive throughput figures."""
    assert main(["--duration", "1", "--json", "--fan-out", "2", "--depth", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("ack_ops_per_s", "trees_per_s", "outcome_p50_ms", "outcome_p99_ms"):
        assert result[key] > 0, key
    assert result["trees_failed"] == 0
    assert result["outcome_p50_ms"] <= result["outcome_p99_ms"]
    assert result["server_rss_bytes"][0] > 0


def test_bench_against_given_ackers(capsys):
    """acker-bench --ackers drives an already running 2-shard cluster in shard order."""
    with local_cluster(2, message_timeout=30.0) as ackers:
        assert main(["--ackers", ",".join(ackers.addresses), "--duration", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ackers"] == 2 and result["trees_acked"] > 0


def test_local_cluster_shards_in_order():
    """local_cluster(3) starts 3 in-process shards that a verifying client accepts, and stops them after."""
    with local_cluster(3) as ackers:
        with ClusterClient(ackers.addresses) as client:
            info = [client.describe(i) for i in range(3)]
            client.init(new_id(), 1, "helper")
            client.flush()
        assert [(i.shard_index, i.shard_count) for i in info] == [(0, 3), (1, 3), (2, 3)]
        assert info[0].message_timeout_seconds == 2.0
    assert all(s._thread is None for s in ackers.servers)


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_bench_apply_mode_streams_every_outcome(capsys, transport):
    """--mode apply sends raw batches over 2 shards (either transport); every tree sent ends ACKED, streamed back."""
    with local_cluster(2, message_timeout=30.0) as ackers:
        args = ["--mode", "apply", "--ackers", ",".join(ackers.addresses), "--batch-ops", "512", "--duration", "1"]
        assert main([*args, "--transport", transport, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["transport"] == transport
    assert result["apply_ops_per_s"] > 0 and result["calls"] > 0
    assert result["trees_sent"] == 256 * result["calls"]
    assert result["outcomes_streamed"] == result["trees_sent"]
    assert 0 < result["apply_p50_ms"] <= result["apply_p99_ms"]


def test_bench_apply_with_replicas_two_applies_every_tree_on_both_replicas():
    """With replicas 2 each batch goes to its shard and the next: both replicas stream every tree's outcome."""
    from acker_bench.apply import ApplyBenchConfig, run_apply_bench

    with local_cluster(3, message_timeout=30.0, replicas=2) as ackers:
        config = ApplyBenchConfig(tuple(ackers.addresses), batch_ops=512, duration=0.5, processes=1, replicas=2)
        result = run_apply_bench(config)
    assert result["replicas"] == 2 and result["trees_sent"] == 256 * result["calls"] > 0
    assert result["outcomes_streamed"] == 2 * result["trees_sent"]
    assert abs(result["apply_ops_per_s"] - 4 * result["trees_per_s"]) < 1  # both copies applied, rounded


def test_bench_compare_replicas_reports_both_factors(capsys):
    """--compare-replicas runs replicas 1 and 2 in one run and reports trees/s, latency and memory for each."""
    assert main(["--mode", "apply", "--compare-replicas", "--embedded-ackers", "2", "--batch-ops", "512",
                 "--duration", "0.5", "--processes", "1", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "apply-compare-replicas"
    for r in (1, 2):
        assert result[f"replicas{r}_trees_per_s"] > 0
        assert result[f"replicas{r}_cluster_bytes_per_pending_tree"] is not None
    assert "throughput_cost_percent" in result
    assert main(["--mode", "apply", "--compare-replicas", "--ackers", "127.0.0.1:1"]) == 2


def test_bench_memory_mode_reports_bytes_per_pending_tree(capsys):
    """--mode memory leaves the asked number of trees pending on a fresh acker per engine and reports RSS per tree."""
    assert main(["--mode", "memory", "--pending-trees", "50000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["engine"] == "native"
    assert result["pending_trees_added"] == result["reference_pending_trees_added"] == 50_000
    assert result["bytes_per_pending_tree"] > 0 and result["reference_bytes_per_pending_tree"] > 0


def test_bench_memory_mode_prints_its_table_without_json(capsys):
    """Without --json the memory mode prints its figures as a table (it failed formatting the engine's name)."""
    assert main(["--mode", "memory", "--pending-trees", "2000"]) == 0
    out = capsys.readouterr().out
    assert "engine" in out and "native" in out and "bytes per pending tree" in out


def test_bench_ledger_mode_runs_both_engines_on_every_tree(capsys):
    """--mode ledger sends every tree through the native ledger (both paths) and the reference; figures for each."""
    assert (
        main(["--mode", "ledger", "--trees", "5000", "--batch-ops", "1024", "--pending-trees", "20000", "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert (result["mode"], result["engine"], result["trees"]) == ("ledger", "native", 5000)
    for key in ("ops_per_s", "reference_ops_per_s", "ops_per_cpu_s", "ops_per_s_with_pending"):
        assert result[key] > 0, key


def test_bench_mass_timeout_mode_reports_delivery_and_probe_latency(capsys):
    """--mode mass-timeout: every expired tree reaches the subscriber and the probes' latencies are reported."""
    assert main(["--mode", "mass-timeout", "--trees", "3000", "--engine", "reference", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mode"], result["engine"], result["trees"]) == ("mass-timeout", "reference", 3000)
    assert (result["outcomes_delivered"], result["outcomes_dropped"]) == (3000, 0)
    assert result["health_checks"] > 0 and result["health_failed"] == 0
    assert result["health_worst_ms"] >= result["health_p99_ms"] > 0


def test_ledger_bench_batches_init_then_ack_every_tree_once():
    """The ledger benchmark's batches hold one INIT and, one batch later, one ACK per tree, values cancelling."""
    from acker_bench.ledger import ledger_batches

    batches = ledger_batches(1000, 256, seed=3)
    assert all(len(b) <= 256 for b in batches)
    kinds = np.concatenate([b.kinds for b in batches])
    roots = np.concatenate([b.roots for b in batches])
    values = np.concatenate([b.values for b in batches])
    assert (kinds == 1).sum() == (kinds == 2).sum() == len(np.unique(roots)) == 1000
    for kind in (1, 2):
        order = np.argsort(roots[kinds == kind])
        assert (values[kinds == kind][order] == values[kinds == 1][np.argsort(roots[kinds == 1])]).all()


def test_shard_roots_belong_to_their_shard():
    """The apply bench draws non-zero roots that the named shard owns."""
    import numpy as np
    from acker_bench.apply import shard_roots

    rng = np.random.default_rng(7)
    for shard in range(3):
        roots = shard_roots(rng, 10_000, shard, 3)
        assert (roots % np.uint64(3) == np.uint64(shard)).all() and (roots != 0).all()
