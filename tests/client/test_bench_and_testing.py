"""acker-bench's JSON output and the acker_client.testing helper."""

from __future__ import annotations

import json

from acker_client import ClusterClient, new_id
from acker_client.bench import main
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
