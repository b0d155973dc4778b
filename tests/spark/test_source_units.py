"""The source pipeline's parts without Spark: ids, filters, the emission log, re-executed inits against real ackers."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from acker_client import ClusterClient
from acker_client.testing import ManualClock, local_cluster
from acker_protocol.wire import Outcome
from acker_spark import close_clients
from acker_spark.executor_read.source_reader import KEY_COLUMN, SourceReader, _line_positions, _LineState
from acker_spark.steps.frames import decode_ids
from acker_spark.tracking.checkpoint import Checkpoint
from acker_spark.tracking.emission_log import EmissionWriter, RoundFilter, read_round, write_filter
from acker_spark.tracking.identity import IdentitySpec, derive_roots, first_edges, hash_key_column
from acker_spark.tracking.outcome_feed import OutcomeFeed
from acker_spark.tracking.record_table import ACKED, FAILED, PENDING, RecordTable

U64 = np.uint64


def test_roots_are_deterministic_per_identity_and_attempt() -> None:
    """The same (run, identity, attempt) always gives the same root; any change gives another."""
    idents = hash_key_column(pa.array(["a", "b", "c"]), "k")
    once, again = derive_roots(7, idents, np.ones(3, U64)), derive_roots(7, idents, np.ones(3, U64))
    assert (once == again).all() and len(set(once.tolist())) == 3 and once.all()
    assert not np.isin(derive_roots(7, idents, np.full(3, 2, U64)), once).any()
    assert not np.isin(derive_roots(8, idents, np.ones(3, U64)), once).any()
    assert (first_edges(once) != 0).all() and not np.isin(first_edges(once), once).any()


def test_integer_and_string_keys_hash_apart_and_nulls_are_refused() -> None:
    """Integer keys are mixed, strings hashed; a null key cannot identify a record."""
    assert len(set(hash_key_column(pa.array([1, 2, 3]), "k").tolist())) == 3
    assert hash_key_column(pa.array(["x", "x"]), "k")[0] == hash_key_column(pa.array(["x", "y"]), "k")[0]
    with pytest.raises(ValueError, match="null"):
        hash_key_column(pa.array(["a", None]), "k")


def test_line_positions_continue_a_split_across_batches() -> None:
    """A row's index within its (file, split) group carries over from the task's previous batch."""
    state = _LineState()
    first = _line_positions(np.array([5, 5, 5], U64), np.array([0, 0, 0]), state)
    second = _line_positions(np.array([5, 5, 9, 9], U64), np.array([0, 0, 0, 0]), state)
    third = _line_positions(np.array([9, 9], U64), np.array([64, 64]), state)
    assert (first.tolist(), second.tolist(), third.tolist()) == ([0, 1, 2], [3, 4, 0, 1], [0, 1])


def test_round_filters_skip_and_select(tmp_path: Path) -> None:
    """``skip`` keeps the identities it does not list; ``select`` keeps those it lists, with their attempts."""
    idents = np.array([30, 10, 20], U64)
    skip = RoundFilter("skip", np.array([20], U64), np.zeros(1, np.uint16))
    keep, attempts = skip.apply(idents)
    assert keep.tolist() == [True, True, False] and attempts.tolist() == [1, 1]
    select = RoundFilter("select", np.array([30, 20], U64), np.array([3, 2], np.uint16))
    path = write_filter(tmp_path, 4, select)  # stored sorted: lookups by searchsorted
    from acker_spark.tracking.emission_log import read_filter

    keep, attempts = read_filter(str(path)).apply(idents)
    assert keep.tolist() == [True, False, True] and attempts.tolist() == [3, 2]


def test_emission_log_survives_a_torn_tail_and_spots_shared_identities(tmp_path: Path) -> None:
    """A file cut mid-batch keeps its whole batches; a root from two partitions counts as a duplicate."""
    writer = EmissionWriter(tmp_path, 0, 0, 11)
    writer.write(np.array([1, 2], U64), np.array([10, 20], U64), np.ones(2, np.uint16))
    writer.write(np.array([3], U64), np.array([30], U64), np.ones(1, np.uint16))
    writer.close()
    data = writer.path.read_bytes()
    writer.path.write_bytes(data[: len(data) - 20])  # the writer died in its last batch
    retry = EmissionWriter(tmp_path, 0, 0, 12)  # a retry of partition 0: same roots, not duplicates
    retry.write(np.array([1, 2, 3], U64), np.array([10, 20, 30], U64), np.ones(3, np.uint16))
    retry.close()
    round_0 = read_round(tmp_path, 0)
    assert round_0.roots.tolist() == [1, 2, 3] and round_0.duplicates == 0
    other = EmissionWriter(tmp_path, 0, 1, 13)
    other.write(np.array([2], U64), np.array([20], U64), np.ones(1, np.uint16))
    other.close()
    assert read_round(tmp_path, 0).duplicates == 1


def test_record_table_takes_the_first_outcome_of_a_pending_root_only() -> None:
    """Outcomes settle pending entries once; later ones (a second tree with the same root) change nothing."""
    from acker_spark.tracking.emission_log import Emissions

    table = RecordTable()
    table.add(Emissions(np.array([5, 7, 9], U64), np.array([50, 70, 90], U64), np.ones(3, np.uint16), 0), 0)
    acked = int(Outcome.ACKED)
    settled, unknown = table.settle(
        np.array([7, 7, 5, 11], U64),
        np.array([acked, int(Outcome.TIMED_OUT), int(Outcome.FAILED), acked], np.int8),
        acked,
    )
    assert unknown.tolist() == [11]
    assert table.state.tolist() == [FAILED, ACKED, PENDING]
    assert len(settled.acked) == 1 and settled.reasons.tolist() == [int(Outcome.FAILED)]
    table.settle(np.array([5, 7], U64), np.array([acked, int(Outcome.FAILED)], np.int8), acked)
    assert table.state.tolist() == [FAILED, ACKED, PENDING]


def test_an_init_re_executed_after_its_tree_completed_never_unsettles_it(tmp_path: Path) -> None:
    """A speculative copy re-sends set-once inits after the tree was acked: the second tree's timeout is ignored."""
    clock = ManualClock()
    with local_cluster(1, message_timeout=5.0, clock=clock) as ackers, ClusterClient(ackers.addresses) as client:
        checkpoint = Checkpoint(tmp_path)
        feed = OutcomeFeed(client, "spec-test", checkpoint, interval=0.05).start()
        try:
            path = write_filter(tmp_path, 0, RoundFilter("all", np.zeros(0, U64), np.zeros(0, np.uint16)))
            reader = SourceReader(
                IdentitySpec("key", "k"), 99, "spec-test", str(tmp_path), 0, str(path), ackers.addresses
            )
            batch = pa.record_batch({"k": ["a", "b", "c"], "v": [1, 2, 3]})
            [out] = list(reader.run(iter([batch]), partition=0, task_attempt=1))
            assert out.column(KEY_COLUMN).to_pylist() == ["a", "b", "c"]
            ids = decode_ids(out.column("_acker_ids"))
            client.ack_columns(ids.roots, ids.ids)  # the bolt's ack of each record's first edge
            client.flush()
            table = RecordTable()
            table.add(read_round(tmp_path, 0), 0)
            _settle_all(feed, table, 3)
            assert table.count(ACKED) == 3
            # The speculative copy of the read task: same records, same roots, inits sent again.
            list(reader.run(iter([batch]), partition=0, task_attempt=2))
            clock.advance(20.0)
            assert sum(server.advance() for server in ackers.servers) == 3  # the second trees time out
            _settle_all(feed, table, 3)  # the three TIMED_OUT of the second trees
            assert table.count(ACKED) == 3 and table.count(FAILED) == 0
            assert read_round(tmp_path, 0).duplicates == 0
        finally:
            feed.close()
            close_clients()


def _settle_all(feed: OutcomeFeed, table: RecordTable, count: int) -> None:
    """Take outcomes until ``count`` more arrived and settle them (a guard of 10 s against a hang)."""
    seen, deadline = 0, time.monotonic() + 10
    while seen < count and time.monotonic() < deadline:
        roots, outcomes = feed.take()
        seen += len(roots)
        table.settle(roots, outcomes, int(Outcome.ACKED))
        feed.wait(0.05)
    assert seen == count, f"{seen} outcomes arrived, expected {count}"
