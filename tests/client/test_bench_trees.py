"""acker-bench's trees mode: the pacer (injected clock), the columnar load's roots and acks, the outcome reader, JSON."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from acker_bench.cli import main
from acker_bench.columns_load import CHUNKS, ColumnTrees
from acker_bench.outcomes import OutcomeReader
from acker_bench.trees import BenchConfig, Pacer, summarize
from acker_client.testing import ManualClock
from acker_protocol.wire import Outcome


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


def test_unpaced_pacer_never_waits():
    """rate=None: every call gets a full batch and wait() does not sleep."""
    clock = SleepingClock()
    pacer = Pacer(None, max_batch=7, clock=clock, sleep=clock.sleep)
    assert [pacer.take() for _ in range(3)] == [7, 7, 7]
    pacer.wait()
    assert clock.pauses == []


@pytest.mark.parametrize(
    "kwargs",
    [{"rate": 0.0}, {"rate": float("inf")}, {"api": "rows"}, {"chunk": 0}, {"api": "columns", "processes": 256}],
)
def test_bench_config_refuses_bad_settings(kwargs):
    """A zero or infinite rate, an unknown API, an empty batch or too many columnar processes is refused."""
    with pytest.raises(ValueError):
        BenchConfig(addresses=("a:1",), **kwargs)


def test_column_roots_are_distinct_and_name_their_batch():
    """Roots of many batches are distinct and non-zero, and chunk_of() recovers each one's batch number."""
    trees = ColumnTrees(3, 1, worker=4, seed=1)
    batches = [trees.roots(n) for n in (1, 1000, 37, 4096)]
    roots = np.concatenate([r for _, r in batches])
    assert np.unique(roots).size == roots.size and roots.all()
    for chunk, batch in batches:
        assert (trees.chunk_of(batch) == chunk).all()
    assert ((roots >> np.uint64(56)) == 5).all()  # worker + 1 in the top byte
    assert ColumnTrees(3, 1, worker=4, seed=2).roots(10)[1].tolist() != trees.roots(10)[1].tolist()


def test_column_batch_numbers_wrap_around():
    """After CHUNKS batches the batch number starts over at 0, still within sent_at's length."""
    trees = ColumnTrees(1, 0, worker=0, seed=3)
    trees.chunk = CHUNKS - 1
    assert trees.roots(1)[0] == CHUNKS - 1 and trees.roots(1)[0] == 0


class ModelClient:
    """Records column calls and keeps each tree's XOR checksum like an acker."""

    def __init__(self) -> None:
        self.checksum: dict[int, int] = defaultdict(int)
        self.calls: list[tuple[str, int]] = []

    def init_columns(self, roots, values, spout):
        self.calls.append(("init", len(roots)))
        for root, value in zip(roots.tolist(), values.tolist()):
            self.checksum[root] ^= value

    def ack_columns(self, roots, values, dedup_key=0):
        self.calls.append(("ack", len(roots)))
        for root, value in zip(roots.tolist(), values.tolist()):
            self.checksum[root] ^= value


@pytest.mark.parametrize(("fan_out", "depth"), [(3, 1), (2, 2), (1, 0)])
def test_column_batch_completes_every_tree(fan_out, depth):
    """A batch's init and level-by-level acks bring every tree's checksum to 0, with one ack per tuple."""
    client, trees = ModelClient(), ColumnTrees(fan_out, depth, worker=0, seed=4)
    sent_at = np.zeros(CHUNKS)
    acks = trees.run_batch(client, "s", 100, sent_at)
    per_tree = sum(fan_out**level for level in range(depth + 1))
    assert acks == 100 * per_tree
    assert [c for c in client.calls if c[0] == "init"] == [("init", 100)]
    assert len([c for c in client.calls if c[0] == "ack"]) == depth + 1
    assert len(client.checksum) == 100 and not any(client.checksum.values())
    assert sent_at[0] > 0


class OneShard:
    """Just enough of a ClusterClient for an OutcomeReader that is never started."""

    shard_count = 1


def test_outcome_reader_counts_times_and_skips_repeats():
    """handle() counts ACKED and failed trees, times acked ones by their batch, and skips sequences seen."""
    trees = ColumnTrees(1, 0, worker=0, seed=5)
    reader = OutcomeReader(OneShard(), "s", trees.chunk_of)
    chunk, roots = trees.roots(4)
    reader.sent_at[chunk] = 0.0  # sent at perf_counter() 0: every latency is simply "now"
    kinds = [Outcome.ACKED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.TIMEOUT_RESET]
    last = reader.handle(1, roots.tolist(), [int(k) for k in kinds], 0)
    assert (last, reader.acked, reader.failed, reader.ended) == (4, 1, 2, 3)
    again = reader.handle(3, roots[2:].tolist(), [int(Outcome.ACKED)] * 2, last)  # sequences 3, 4 again
    assert (again, reader.acked, reader.duplicates) == (4, 1, 2)
    latencies = reader.latencies()
    assert latencies.size == 1 and latencies[0] > 0


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
    assert 0 < result["trees_started"] <= 2000 * result["load_seconds"] + 1
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


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "0"],
        ["--rate", "10", "--find-capacity"],
        ["--mode", "apply", "--api", "columns"],
        ["--chunk", "0"],
        ["--api", "columns", "--processes", "300"],
        ["--find-capacity", "--capacity-fraction", "1.5"],
    ],
)
def test_bench_refuses_contradicting_options(args, capsys):
    """Bad or contradicting trees options exit 2 with a message, before any acker starts."""
    assert main(args) == 2
    assert "acker-bench:" in capsys.readouterr().err
