"""SourcePipeline's options: one frozen PipelineOptions, given as keywords or whole; a sibling is a replace."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from acker_spark import FailureBudget, FileOutput, PipelineOptions, ReplayPolicy, SourcePipeline, TableOutput
from acker_spark.dead_letter import DeadLetterStore


@pytest.fixture
def client() -> Any:
    """A stand-in for the driver's client: building a pipeline only keeps it (nothing here runs)."""
    return object()


def test_keywords_are_the_options_fields(client: Any, tmp_path: Path) -> None:
    """The keywords users pass become the pipeline's options; options= with keywords beside it replaces fields."""
    policy = ReplayPolicy(max_attempts=2)
    pipeline = SourcePipeline(None, client, tmp_path, policy=policy, commit_every="round", hang_grace=None)
    assert pipeline.options == PipelineOptions(policy=policy, commit_every="round", hang_grace=None)
    given = PipelineOptions(policy=policy, log_interval=3.0)
    assert SourcePipeline(None, client, tmp_path, options=given).options is given
    mixed = SourcePipeline(None, client, tmp_path, options=given, log_interval=7.0).options
    assert (mixed.policy, mixed.log_interval) == (policy, 7.0)


def test_wrong_options_are_refused_when_the_pipeline_is_built(client: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        SourcePipeline(None, client, tmp_path, no_such_option=1)
    with pytest.raises(ValueError, match="commit_every"):
        SourcePipeline(None, client, tmp_path, commit_every="often")
    with pytest.raises(ValueError, match="progress"):
        SourcePipeline(None, client, tmp_path, progress="loud")
    with pytest.raises(dataclasses.FrozenInstanceError):
        PipelineOptions().budget = None  # type: ignore[misc]


def test_client_options_are_copied(client: Any, tmp_path: Path) -> None:
    """The caller's dict may change after: the executors' clients keep what was given."""
    mine = {"deadline": 1.0}
    pipeline = SourcePipeline(None, client, tmp_path, client_options=mine)
    mine["deadline"] = 9.0
    assert pipeline.options.client_options == {"deadline": 1.0}


@pytest.mark.parametrize("output", [FileOutput("out/", mode="overwrite"), TableOutput("t", mode="error"), None])
def test_a_sibling_is_the_same_options_adding_to_the_output(
    client: Any, tmp_path: Path, output: FileOutput | TableOutput | None
) -> None:
    """A redrive chunk's or queue batch's pipeline: its own checkpoint, letters, budget and name; output appended."""
    store = DeadLetterStore(tmp_path / "dead.sqlite")
    budget = FailureBudget(fraction=0.5)
    first = SourcePipeline(
        None, client, tmp_path / "a", name="night", policy=ReplayPolicy(max_attempts=3), output=output
    )
    sibling = first.sibling(tmp_path / "b", store, budget)
    appended = dataclasses.replace(output, mode="append") if output is not None else None
    assert sibling.options == dataclasses.replace(
        first.options, name=None, dead_letters=store, budget=budget, output=appended
    )
    assert sibling.checkpoint.path == tmp_path / "b" and sibling.cluster is client


def test_each_setting_still_reads_as_an_attribute_of_the_pipeline(client: Any, tmp_path: Path) -> None:
    """Code written against the keyword pipeline reads pipeline.policy, pipeline.output, ... as before."""
    policy, output = ReplayPolicy(max_attempts=2), FileOutput(str(tmp_path / "out"))
    pipeline = SourcePipeline(None, client, tmp_path, policy=policy, output=output)
    assert (pipeline.policy, pipeline.output, pipeline.commit_every) == (policy, output, "end")
    with pytest.raises(AttributeError, match="no_such_setting"):
        _ = pipeline.no_such_setting


def test_progress_line_keeps_its_old_import_path_with_a_warning() -> None:
    from acker_spark.progress.driver_progress import ProgressLine

    with pytest.warns(DeprecationWarning) as caught:
        from acker_spark.shard_watch import ProgressLine as old

    # Two moves, two warnings: the module went into executor_read/, the name into progress/.
    messages = [str(w.message) for w in caught]
    assert any("acker_spark.shard_watch has moved to acker_spark.executor_read.shard_watch" in m for m in messages)
    assert any("acker_spark.progress.driver_progress.ProgressLine" in m for m in messages)
    assert old is ProgressLine
