"""acker-bench's trees mode: the pacer (injected clock), the columnar load (bulk spout, acks, batch timing), JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from acker_bench.cli import main
from acker_bench.columns_load import CHUNKS, INDEX_BITS, ColumnTrees
from acker_bench.trees import BenchConfig, Pacer, summarize
from acker_client import Spout, SpoutFull
from acker_client.testing import ManualClock
from acker_protocol.wire import Outcome

from ..client.fakes import RecordingCluster


class SleepingClock(ManualClock):
    """A manual clock whose sleep advances it, recording each pause."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.advance(seconds)


def test_pacer_hands_out_trees_on_schedule():
    """At 1,000 trees/s the first tree is due at once, then one per millisecond, whatever the call pattern."""
    clock = SleepingClock()
    pacer = Pacer(1000.0, max_batch=50, clock=clock, sleep=clock.sleep)
    assert pacer.due() == 1  # t = 0
    assert pacer.due() == 0
    clock.advance(0.0105)
    assert pacer.due() == 10  # trees 2..11 were due by 10.5 ms
    assert pacer.take() == 1 and clock.pauses == [pytest.approx(0.0005)]  # waits for tree 12 at 11 ms
    clock.advance(1.0)
    assert [pacer.due() for _ in range(21)] == [50] * 20 + [0]  # the backlog comes in batches of 50
    assert pacer.issued == 1012


def test_pacer_rate_holds_over_a_long_run():
    """Over 10 simulated seconds of take() calls the pacer issues rate x time trees, give or take one."""
    clock = SleepingClock()
    pacer = Pacer(3333.0, max_batch=16, clock=clock, sleep=clock.sleep)
    issued, start = 0, clock()
    while clock() - start < 10.0:
        issued += pacer.take()
    assert abs(issued - 3333.0 * (clock() - start)) <= 1
    assert max(clock.pauses) <= 1 / 3333.0 + 1e-9


def test_pacer_with_a_tick_hands_out_a_ticks_worth_at_a_time():
    """10,000 trees/s, 1 ms ticks: after the first tree, take() sleeps until 10 are due, then hands them out."""
    clock = SleepingClock()
    pacer = Pacer(10_000.0, max_batch=64, tick=0.001, clock=clock, sleep=clock.sleep)
    assert pacer.take() == 1 and clock.pauses == []  # the first tree, at once
    batches = [pacer.take() for _ in range(100)]
    assert batches == [10] * 100  # never a batch of one or two: the generator sleeps in between
    assert clock.pauses == [pytest.approx(0.001)] * 100
    assert pacer.issued == 1001


def test_pacer_tick_keeps_the_rate_and_gives_a_backlog_at_once():
    """A tick changes the batches, not the rate; a generator behind schedule gets what is due without sleeping."""
    clock = SleepingClock()
    pacer = Pacer(3333.0, max_batch=64, tick=0.002, clock=clock, sleep=clock.sleep)
    issued, start = 0, clock()
    while clock() - start < 10.0:
        issued += pacer.take()
    assert abs(issued - 3333.0 * (clock() - start)) <= pacer.min_batch
    assert pacer.min_batch == 6
    clock.advance(0.05)  # the generator stalled: 166 trees are due
    pauses = len(clock.pauses)
    assert [pacer.take() for _ in range(3)] == [64, 64, 38] and len(clock.pauses) == pauses


def test_unpaced_pacer_never_waits():
    """rate=None: every call gets a full batch and wait() does not sleep."""
    clock = SleepingClock()
    pacer = Pacer(None, max_batch=7, clock=clock, sleep=clock.sleep)
    assert [pacer.take() for _ in range(3)] == [7, 7, 7]
    pacer.wait()
    assert clock.pauses == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate": 0.0},
        {"rate": float("inf")},
        {"api": "rows"},
        {"chunk": 0},
        {"max_pending": 0},
        {"tick": -0.001},
        {"tick": float("nan")},
    ],
)
def test_bench_config_refuses_bad_settings(kwargs):
    """A zero or infinite rate, an unknown API, an empty batch, no room for pending trees or a bad tick is refused."""
    with pytest.raises(ValueError):
        BenchConfig(addresses=("a:1",), **kwargs)


def test_column_message_ids_are_distinct_and_name_their_batch():
    """Message ids of many batches are distinct, and the batch number sits above the index bits."""
    trees = ColumnTrees(3, 1, seed=1)
    batches = [trees.message_ids(n) for n in (1, 1000, 37, 4096)]
    ids = np.concatenate(batches)
    assert np.unique(ids).size == ids.size
    for batch, batch_ids in enumerate(batches):
        assert (batch_ids >> INDEX_BITS == batch).all()
        assert (batch_ids & ((1 << INDEX_BITS) - 1)).tolist() == list(range(batch_ids.size))


def test_latencies_time_each_record_against_its_batch():
    """latencies() maps a callback's list of message ids to its batch's last-ack time, wrapping at CHUNKS."""
    trees = ColumnTrees(1, 0, seed=2)
    first, second = trees.message_ids(3), trees.message_ids(2)
    trees.sent_at[0], trees.sent_at[1] = 10.0, 12.0
    acked = [int(second[1]), int(first[0]), int(first[2])]  # Python ints, any order, as on_outcomes hands them
    assert trees.latencies(acked, 15.0).tolist() == [3.0, 5.0, 5.0]
    trees.batches = CHUNKS + 1  # batch CHUNKS + 1 shares batch 1's slot, long after batch 1 ended
    assert trees.latencies([int(trees.message_ids(1)[0])], 13.0).tolist() == [1.0]
    assert trees.latencies([], 1.0).size == 0


class ColumnCluster(RecordingCluster):
    """The recording cluster plus ack_columns, folded into each tree's modelled checksum."""

    def ack_columns(self, roots, values, dedup_key=0):
        self.calls.append(("ack_columns", len(roots)))
        for root, value in zip(roots.tolist(), values.tolist()):
            self.vals[root] ^= value


@pytest.mark.parametrize(("fan_out", "depth"), [(3, 1), (2, 2), (1, 0)])
def test_column_batch_completes_every_tree(fan_out, depth):
    """A batch emitted through the spout and acked level by level brings every tree's checksum to 0."""
    cluster, trees = ColumnCluster(), ColumnTrees(fan_out, depth, seed=4)
    with Spout(cluster, on_outcomes=lambda acked, failed: None, max_pending=1000) as spout:
        acks = trees.run_batch(spout, cluster, 100)
        assert spout.pending == 100
    per_tree = sum(fan_out**level for level in range(depth + 1))
    assert acks == 100 * per_tree
    inits = [c for c in cluster.calls if c[0] == "init_columns"]
    assert len(inits) == 1 and len(inits[0][1]) == 100 and inits[0][3] == spout.name
    assert [c for c in cluster.calls if c[0] == "ack_columns"] == [
        ("ack_columns", 100 * fan_out**d) for d in range(depth + 1)
    ]
    assert all(cluster.complete(root) for root in inits[0][1])
    assert trees.sent_at[0] > 0


def test_column_batch_outcomes_reach_the_callback_timed_by_batch():
    """Outcomes streamed for two batches reach on_outcomes as message ids that time each tree by its batch."""
    cluster, trees = ColumnCluster(), ColumnTrees(3, 1, seed=5)
    latencies: list[np.ndarray] = []
    spout = Spout(cluster, on_outcomes=lambda acked, failed: latencies.append(trees.latencies(acked, 100.0)))
    with spout:
        trees.run_batch(spout, cluster, 3)
        trees.run_batch(spout, cluster, 2)
        trees.sent_at[:2] = (90.0, 95.0)  # pin the batches' last-ack times
        roots = [root for call in cluster.calls if call[0] == "init_columns" for root in call[1]]
        cluster.push(0, 1, 1, roots, [int(Outcome.ACKED)] * 5)
        assert spout.wait_idle(10)
    assert np.concatenate(latencies).tolist() == [10.0] * 3 + [5.0] * 2
    assert spout.stats.acked == 5


def test_column_batch_does_not_start_past_max_pending():
    """A batch that does not fit under the spout's max_pending raises SpoutFull having emitted nothing."""
    cluster, trees = ColumnCluster(), ColumnTrees(3, 1, seed=6)
    with Spout(cluster, on_outcomes=lambda acked, failed: None, max_pending=150) as spout:
        trees.run_batch(spout, cluster, 100)
        with pytest.raises(SpoutFull):
            trees.run_batch(spout, cluster, 100, timeout=0.0)
        assert spout.pending == 100
    assert len([c for c in cluster.calls if c[0] == "init_columns"]) == 1


def test_summary_reports_rates_latency_and_unfinished_trees():
    """summarize() merges processes: trees/s over the elapsed time, started/s over the load time, percentiles in ms."""
    config = BenchConfig(addresses=("a:1", "b:2"), fan_out=3, depth=1, api="columns", rate=100.0, processes=2)
    part = {"acks": 400, "started": 100, "trees": 90, "failed": 5, "elapsed": 2.0, "load_seconds": 1.0}
    parts = [{**part, "latencies": np.array([0.001, 0.002]), "operations_sent": 10} for _ in range(2)]
    result = summarize(config, parts, [3, 7])
    assert (result["api"], result["rate_requested"], result["ackers"]) == ("columns", 100.0, 2)
    assert (result["trees_per_s"], result["trees_started_per_s"], result["ack_ops_per_s"]) == (90.0, 200.0, 400.0)
    assert (result["trees_unfinished"], result["trees_failed"], result["server_pending_trees_max"]) == (10, 10, 7)
    assert result["outcome_p50_ms"] == 1.5 and result["outcome_max_ms"] == 2.0


@pytest.mark.parametrize("api", ["columns", "tuples"])
def test_paced_run_holds_its_rate_and_reports_json(capsys, api):
    """--rate 2000 for 1 s against an embedded acker: about 2,000 trees start, all acked, latency reported."""
    args = ["--json", "--api", api, "--fan-out", "3", "--depth", "1", "--duration", "1", "--rate", "2000"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mode"], result["api"], result["rate_requested"]) == ("trees", api, 2000.0)
    # The schedule caps what starts: never more than rate x load time (+1 for the tree due at once).
    # load_seconds is printed rounded to 1 ms: the bound allows that half millisecond (2003 against
    # 2000 x 1.001 + 1 failed a run whose load time was 1.0014 s).
    assert 0 < result["trees_started"] <= 2000 * (result["load_seconds"] + 0.0005) + 1
    assert result["trees_acked"] == result["trees_started"] and result["trees_unfinished"] == 0
    assert result["ack_ops_per_s"] > 0 and 0 < result["outcome_p50_ms"] <= result["outcome_p99_ms"]
    assert result["outcome_p99_ms"] <= result["outcome_max_ms"]


def test_find_capacity_runs_flat_out_then_at_the_fraction(capsys):
    """--find-capacity reports the paced run at the given share of the flat-out trees/s it measured first."""
    args = ["--json", "--api", "columns", "--duration", "1", "--find-capacity", "--capacity-fraction", "0.25"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    capacity = result["capacity_trees_per_s"]
    assert capacity == result["capacity_run"]["trees_per_s"] > 0
    assert result["rate_requested"] == pytest.approx(capacity * 0.25)
    assert result["capacity_run"]["rate_requested"] is None and result["trees_unfinished"] == 0


def test_load_points_report_latency_at_each_share_of_capacity(capsys):
    """--load-points 0.1,0.5 runs flat out, then paced at 10% and 50% of it: one point per load, in order."""
    args = [
        "--json",
        "--api",
        "columns",
        "--fan-out",
        "3",
        "--depth",
        "1",
        "--duration",
        "1",
        "--load-points",
        "0.1,0.5",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    capacity = result["capacity_trees_per_s"]
    assert capacity == result["trees_per_s"] > 0
    assert [p["load"] for p in result["points"]] == [0.1, 0.5]
    for point in result["points"]:
        assert set(point) == {"load", "trees_per_s", "p50_ms", "p99_ms"}
        # Paced: never above its share of the capacity (the schedule caps what starts).
        assert 0 < point["trees_per_s"] <= capacity * point["load"] * 1.01 + 1
        assert 0 < point["p50_ms"] <= point["p99_ms"]


@pytest.mark.parametrize(
    "args",
    [
        ["--load-points", "0.1,2"],
        ["--load-points", "half"],
        ["--load-points", "0.5", "--rate", "10"],
        ["--rate", "0"],
        ["--rate", "10", "--find-capacity"],
        ["--mode", "apply", "--api", "columns"],
        ["--chunk", "0"],
        ["--max-pending", "0"],
        ["--find-capacity", "--capacity-fraction", "1.5"],
        ["--rate", "10", "--tick", "-0.001"],
    ],
)
def test_bench_refuses_contradicting_options(args, capsys):
    """Bad or contradicting trees options exit 2 with a message, before any acker starts."""
    assert main(args) == 2
    assert "acker-bench:" in capsys.readouterr().err
