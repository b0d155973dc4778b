"""SourcePipeline over Spark Connect: spark.read on the Connect server's executors, no SparkContext, no accumulators."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acker_client import ClusterClient
from acker_client.testing import local_cluster
from acker_demo.dataframe_job import build_source_job
from acker_demo.wordcount import FailureInjection, expected_counts, sink_counts
from acker_spark import close_clients
from acker_spark.executor_read.source_pipeline import SourcePipeline
from acker_spark.tracking.identity import UnstableIdentity
from pyspark import cloudpickle

from .test_source_pipeline import PERSISTENT, line_records, write_lines

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.connect]


@pytest.fixture
def ackers() -> Iterator[Any]:
    """Three in-process ackers whose timeout outlives any job here."""
    with local_cluster(3, message_timeout=60.0) as cluster:
        yield cluster
    close_clients()


def test_text_source_with_failures_over_connect(
    connect_spark: Any, ackers: Any, client: ClusterClient, db: Path, tmp_path: Path
) -> None:
    """spark.read.text through Connect, failed words replayed by re-reading: every line acked, sink exact."""
    lines = write_lines(tmp_path / "in", 200)
    job, (split, count) = build_source_job(ackers.addresses, db, injection=FailureInjection(fail_percent=1.0))
    stats = SourcePipeline(connect_spark, client, tmp_path / "checkpoint", policy=PERSISTENT).run(
        connect_spark.read.text(str(tmp_path / "in")), job
    )
    assert (stats.emitted, stats.acked, stats.pending) == (200, 200, 0) and stats.replayed > 0
    assert sink_counts(db) == expected_counts(line_records(lines))
    assert split.commits is None and count.commits is None  # no accumulators on Connect: none were needed


def test_unstable_source_refused_over_connect(connect_spark: Any, client: ClusterClient, tmp_path: Path) -> None:
    """A Connect DataFrame with neither key nor file metadata is refused with what to do."""
    with pytest.raises(UnstableIdentity, match="key="):
        SourcePipeline(connect_spark, client, tmp_path / "checkpoint").run(connect_spark.range(5), lambda df: None)
