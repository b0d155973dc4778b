"""Unit tests of what needs no Spark: ids, sources, dead letters, replay policy, word count and DataFrame helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
from acker_client import MessageId, TrackedTuple
from acker_demo.wordcount import FailureInjection, Word, expected_counts, sink_counts, tokenize
from acker_protocol.wire import Outcome
from acker_spark import (
    DeadLetterStore,
    DeterministicEdgeIds,
    ReplayPolicy,
    TextDirectorySource,
    dedup_key,
    generated_sentences,
    records_from,
    stable_id,
)
from acker_spark.steps.frames import _RowCodec, pack_ids, tracked_schema

from .standalone import StandaloneCluster, can_bind, loopback_hosts


class TestDeterministicEdgeIds:
    def test_same_inputs_same_id(self) -> None:
        """A re-run (a fresh object, a fresh copy of the anchor) derives the same edge id."""
        anchor = TrackedTuple("x", MessageId({5: 6, 3: 4}))
        copy = TrackedTuple("x", MessageId({3: 4, 5: 6}))  # same map, other insertion order
        assert DeterministicEdgeIds(99).edge_id(anchor, 2) == DeterministicEdgeIds(99).edge_id(copy, 2)

    def test_every_input_matters(self) -> None:
        """Salt, anchor ids and ordinal each change the id."""
        anchor = TrackedTuple("x", MessageId.single(5, 6))
        base = DeterministicEdgeIds(99).edge_id(anchor, 0)
        assert base != DeterministicEdgeIds(98).edge_id(anchor, 0)
        assert base != DeterministicEdgeIds(99).edge_id(anchor, 1)
        assert base != DeterministicEdgeIds(99).edge_id(TrackedTuple("x", MessageId.single(5, 7)), 0)
        assert base != DeterministicEdgeIds(99).edge_id(TrackedTuple("x", MessageId.single(4, 6)), 0)

    def test_ids_are_nonzero_64_bit_and_spread(self) -> None:
        """10,000 children of one anchor get distinct non-zero 64-bit ids."""
        ids = DeterministicEdgeIds(1)
        anchor = TrackedTuple("x", MessageId.single(1, 1))
        values = {ids.edge_id(anchor, n) for n in range(10_000)}
        assert len(values) == 10_000
        assert all(0 < v < 1 << 64 for v in values)

    def test_bad_salt_refused(self) -> None:
        """A zero or oversized salt is refused."""
        with pytest.raises(ValueError):
            DeterministicEdgeIds(0)
        with pytest.raises(ValueError):
            DeterministicEdgeIds(1 << 64)

    def test_matches_the_columnar_derivation(self) -> None:
        """Child n of an anchor gets derive_ids(salt, the anchor's row digest, n): the ArrowBolt's id for it."""
        import numpy as np
        from acker_client.columns import derive_ids, row_digests

        for pairs in ({11: 13}, {(1 << 64) - 1: 2, 5: 1 << 63, 9: 0}):
            ids = DeterministicEdgeIds(7)
            anchor = TrackedTuple("x", MessageId(pairs))
            roots = np.array(list(pairs), dtype=np.uint64)
            digest = row_digests(np.zeros(len(pairs), np.int64), roots, np.array(list(pairs.values()), np.uint64), 1)
            ordinals = np.array([*range(20), (1 << 32) + 5], dtype=np.uint64)
            expected = derive_ids(7, np.repeat(digest, len(ordinals)), ordinals).tolist()
            assert [ids.edge_id(anchor, n) for n in ordinals.tolist()] == expected

    def test_same_ids_in_another_process(self) -> None:
        """A fresh interpreter with another hash seed (a Spark re-run elsewhere) derives the very same ids."""
        import json
        import os
        import subprocess
        import sys

        code = (
            "import json; from acker_client import MessageId, TrackedTuple; from acker_spark import DeterministicEdgeIds;"
            "a = TrackedTuple('x', MessageId({3: 4, 1 << 63: 6})); ids = DeterministicEdgeIds(99);"
            "print(json.dumps([ids.edge_id(a, n) for n in range(12)]))"
        )
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        anchor = TrackedTuple("x", MessageId({1 << 63: 6, 3: 4}))
        here = DeterministicEdgeIds(99)
        assert json.loads(out.stdout) == [here.edge_id(anchor, n) for n in range(12)]

    def test_order_of_requests_does_not_matter(self) -> None:
        """Ordinals asked out of order, across block boundaries and interleaved with another anchor, give the same ids."""
        a, b = TrackedTuple("a", MessageId.single(1, 2)), TrackedTuple("b", MessageId.single(3, 4))
        in_order = DeterministicEdgeIds(5)
        expected = {(t.value, n): in_order.edge_id(t, n) for t in (a, b) for n in range(20)}
        shuffled = DeterministicEdgeIds(5)
        for n in (17, 3, 8, 7, 16, 0, 19, 9, 15):
            for t in (b, a):
                assert shuffled.edge_id(t, n) == expected[(t.value, n)]


def test_dedup_key_is_per_bolt_and_partition() -> None:
    """Every attempt of a task shares a key; other partitions and bolts get other keys."""
    assert dedup_key(7, 3) == dedup_key(7, 3)
    assert len({dedup_key(7, 3), dedup_key(7, 4), dedup_key(8, 3)}) == 3
    assert dedup_key(7, 3) != 0
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        dedup_key(7, -1)


def test_dedup_key_is_the_documented_mix() -> None:
    """docs/spark.md: dedup_key(uid, partition) = mix64(mix64(uid ^ "acker/dd") + partition), the columnar mixer."""
    import numpy as np
    from acker_client.columns import mix64

    uid, partition = (1 << 64) - 3, 12
    domain = int.from_bytes(b"acker/dd", "big")
    with np.errstate(over="ignore"):
        expected = mix64(mix64(np.array([uid ^ domain], np.uint64)) + np.uint64(partition))
    assert dedup_key(uid, partition) == int(expected[0])


def test_stable_id_reads_every_byte_and_the_length() -> None:
    """stable_id is a pure, non-zero function of its bytes: a changed byte, a trailing zero or a cut changes it."""
    values = [b"", b"\0", b"abc", b"abd", b"abc\0", b"0123456789abcdef", b"0123456789abcdeF", b"0123456789abcdef\0"]
    assert len({stable_id(v) for v in values}) == len(values)
    assert stable_id(b"abc") == stable_id(bytearray(b"abc")) == stable_id(memoryview(b"abc"))
    assert all(stable_id(v) for v in values)


def test_generated_sentences_are_reproducible() -> None:
    """The same seed gives the same sentences and keys, another seed other sentences."""
    first = list(generated_sentences(50, seed=1))
    assert first == list(generated_sentences(50, seed=1))
    assert first != list(generated_sentences(50, seed=2))
    assert len({r.key for r in first}) == 50
    assert all(3 <= len(r.value.split()) <= 12 for r in first)


def test_records_from_keys_values_by_index() -> None:
    """Plain values become records with unique keys in order."""
    records = list(records_from(["a", "b"], prefix="k"))
    assert [(r.key, r.value) for r in records] == [("k00000000", "a"), ("k00000001", "b")]


def test_text_directory_source(tmp_path: Path) -> None:
    """Lines of every file, in path order, keyed by relative path and line number; blank lines skipped."""
    (tmp_path / "b.txt").write_text("second file\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("deep\n")
    (tmp_path / "a.txt").write_text("one\n\n  \nfour\n")
    (tmp_path / ".hidden").write_text("skip me\n")
    records = list(TextDirectorySource(tmp_path))
    assert [(r.key, r.value) for r in records] == [
        ("a.txt:1", "one"),
        ("a.txt:4", "four"),
        ("b.txt:1", "second file"),
        ("sub/c.txt:1", "deep"),
    ]


def test_text_directory_source_requires_a_directory(tmp_path: Path) -> None:
    """A missing directory is reported by name."""
    with pytest.raises(NotADirectoryError, match="nope"):
        TextDirectorySource(tmp_path / "nope")


def test_dead_letter_store_round_trip(tmp_path: Path) -> None:
    """A dead letter keeps its record, reason and attempts; adding a key again replaces it."""
    store = DeadLetterStore(tmp_path / "dl.sqlite")
    store.add("k1", {"text": "hello"}, Outcome.FAILED, 3)
    store.add("k2", "plain", Outcome.LOST, 5)
    store.add("k1", {"text": "hello"}, Outcome.TIMED_OUT, 4)
    rows = store.all()
    assert [(r.key, r.record, r.reason, r.attempts) for r in rows] == [
        ("k1", {"text": "hello"}, Outcome.TIMED_OUT, 4),
        ("k2", "plain", Outcome.LOST, 5),
    ]
    assert store.keys() == {"k1", "k2"} and len(store) == 2


def test_dead_letters_are_written_per_batch_in_one_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """add_many stores every row with one connection, as add would row by row."""
    from acker_spark import dead_letter as dead_letter_module

    store = DeadLetterStore(tmp_path / "db")
    opened: list[int] = []
    real = dead_letter_module.open_db
    monkeypatch.setattr(dead_letter_module, "open_db", lambda path: opened.append(1) or real(path))
    assert store.add_many([("k1", {"v": 1}, Outcome.FAILED, 3), ("k2", "x", Outcome.LOST, 5)]) == 2
    assert store.add_many([("k1", {"v": 1}, Outcome.TIMED_OUT, 4)]) == 1  # replaces, as add does
    assert store.add_many([]) == 0
    assert len(opened) == 2
    assert [(d.key, d.record, d.reason, d.attempts) for d in store.all()] == [
        ("k1", {"v": 1}, Outcome.TIMED_OUT, 4),
        ("k2", "x", Outcome.LOST, 5),
    ]


def test_replay_policy_backoff() -> None:
    """Delays grow by the factor from the base and stop at the cap; bad settings are refused."""
    policy = ReplayPolicy(max_attempts=5, backoff_base=0.5, backoff_factor=2.0, backoff_cap=3.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        ReplayPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        ReplayPolicy(backoff_factor=0.5)


def test_failure_injection_is_deterministic_per_attempt() -> None:
    """About fail_percent of words fail, the same ones each time, with a fresh draw per attempt."""
    injection = FailureInjection(fail_percent=10.0)
    words = [Word(f"s{i}", p, "w", 1) for i in range(2000) for p in range(5)]
    failing = [w for w in words if injection.should_fail(w)]
    assert 800 < len(failing) < 1200
    assert failing == [w for w in words if injection.should_fail(w)]
    retried = [w._replace(attempt=2) for w in failing]
    assert sum(injection.should_fail(w) for w in retried) < len(failing) / 2


def test_sink_counts_exclude_dead_letters(db: Path) -> None:
    """Rows of a dead-lettered record are left out of the counts; expected counts agree."""
    from acker_spark.sqlite import open_db, upsert

    with open_db(db) as conn:
        upsert(conn, "words", ("record_key", "position", "word"), [("a", 0, "x"), ("a", 1, "y"), ("b", 0, "x")])
        upsert(conn, "words", ("record_key", "position", "word"), [("a", 0, "x")])  # a replay: no double count
    assert sink_counts(db) == {"x": 2, "y": 1}
    DeadLetterStore(db).add("b", "x", Outcome.FAILED, 3)
    assert sink_counts(db) == {"x": 1, "y": 1} == expected_counts([("a", "x y"), ("b", "x")], {"b"})


def test_tokenize() -> None:
    """Words are lower-cased runs of word characters and apostrophes."""
    assert tokenize("The acker's  TREE, ok?") == ["the", "acker's", "tree", "ok"]


class TestFrameTracking:
    def test_codec_decodes_rows_without_the_tracking_column(self) -> None:
        """Input Arrow rows become TrackedTuples whose value is a Row of the other columns, by name."""
        import pyarrow as pa
        from acker_spark.steps.arrow_rows import _decode
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        batch = pa.RecordBatch.from_pydict(
            {"key": ["k"], "_acker_ids": pa.array([pack_ids(MessageId.single(9, 4))], pa.binary()), "n": [3]}
        )
        values = StructType([StructField("key", StringType()), StructField("n", LongType())])
        (t,) = _decode([batch], values)
        assert (t.value.key, t.value.n, t.message_id) == ("k", 3, MessageId.single(9, 4))
        assert "_acker_ids" not in t.value.asDict()

    def test_codec_encodes_tuples_dicts_rows_and_scalars(self) -> None:
        """Emitted values map to the schema's columns by position (tuples) or by name (dicts, Rows)."""
        from acker_spark.steps.arrow_rows import _encode
        from pyspark.sql import Row
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        ids = MessageId.single(9, 4)
        codec = _RowCodec(["_acker_ids"], ["word", "n"])
        schema = StructType([StructField("word", StringType()), StructField("n", LongType())])
        values = [("a", 1), {"n": 1, "word": "a"}, Row(n=1, word="a")]
        batch = _encode([TrackedTuple(v, ids) for v in values], codec, schema)
        assert batch.to_pylist() == [{"word": "a", "n": 1, "_acker_ids": pack_ids(ids)}] * 3
        one = StructType([StructField("word", StringType())])
        assert _encode([TrackedTuple("a", ids)], _RowCodec(["_acker_ids"], ["word"]), one).to_pylist() == [
            {"word": "a", "_acker_ids": pack_ids(ids)}
        ]

    def test_codec_refuses_values_that_do_not_fit_the_schema(self) -> None:
        """A wrong number of values, a missing name, or a scalar for several columns says what the schema expects."""
        from pyspark.sql import Row

        codec = _RowCodec(["_acker_ids"], ["word", "n"])
        with pytest.raises(ValueError, match=r"emitted 3 values .* for the 2 columns"):
            codec.columns(("a", 1, 2))
        for named in ({"word": "a"}, Row(word="a", count=1)):
            with pytest.raises(ValueError, match=r"has no \['n'\] for the columns"):
                codec.columns(named)
        with pytest.raises(TypeError, match=r"columns \['word', 'n'\]"):
            codec.columns(7)

    def test_codec_needs_the_tracking_column(self) -> None:
        """Input without _acker_ids is refused up front."""
        with pytest.raises(ValueError, match="has no '_acker_ids' column"):
            _RowCodec(["word"], ["word"])

    def test_tracked_schema_appends_the_binary_column(self) -> None:
        """The output schema is the bolt's columns plus a non-null binary _acker_ids; declaring it is refused."""
        from pyspark.sql.types import BinaryType, StringType, StructField, StructType

        schema = tracked_schema(StructType([StructField("word", StringType())]))
        assert schema.names == ["word", "_acker_ids"]
        assert schema["_acker_ids"].dataType == BinaryType() and not schema["_acker_ids"].nullable
        assert tracked_schema(None).names == ["_acker_ids"]
        with pytest.raises(ValueError, match="must not declare"):
            tracked_schema(StructType([StructField("_acker_ids", BinaryType())]))


def test_standalone_cluster_hosts_and_arguments() -> None:
    """Workers get distinct loopback hosts; an address this machine lacks cannot be bound; no workers is refused."""
    assert loopback_hosts(3) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert can_bind("127.0.0.1") is True
    assert can_bind("203.0.113.7") is False  # TEST-NET-3: never assigned to a local interface
    with pytest.raises(ValueError, match="at least one worker"):
        StandaloneCluster(workers=0)
