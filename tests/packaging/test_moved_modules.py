"""Module paths that moved stay importable for a release (the old path warns, names the new one, and is that module); removed ones say what replaces them."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import acker_spark
import pytest
from acker_spark.moved_modules import MOVED, REMOVED

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def forget_old_paths() -> Iterator[None]:
    """Each test imports the old paths afresh (a second import would find them in sys.modules, silently)."""
    yield
    for old in MOVED:
        sys.modules.pop(old, None)
        acker_spark.__dict__.pop(old.rsplit(".", 1)[1], None)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old: str, forget_old_paths: None) -> None:
    new = MOVED[old]
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {new}") as caught:
        exec(compile(f"import {old}", __file__, "exec"), {})  # an import statement, as a job writes it
    assert sys.modules[old] is importlib.import_module(new)
    assert caught[0].filename == __file__  # the warning points at the importing line, not at importlib


def test_names_import_from_an_old_path(forget_old_paths: None) -> None:
    """The issue's example, as a job writes it."""
    with pytest.warns(DeprecationWarning, match="acker_spark.steps.executor"):
        from acker_spark.executor import Bolt
    assert Bolt is acker_spark.Bolt


def test_an_old_path_warns_in_a_fresh_interpreter() -> None:
    """Without pytest's warning filters: the first thing a job imports is the old path."""
    code = "import acker_spark.executor as e, acker_spark.steps.executor as n; assert e is n"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning: acker_spark.executor has moved to acker_spark.steps.executor" in done.stderr


@pytest.mark.parametrize("old", sorted(MOVED))
def test_no_module_lives_at_an_old_path(old: str) -> None:
    """The table never hides a real module: an old path has no file of its own."""
    folder = Path(acker_spark.__file__).parent
    relative = Path(*old.split(".")[1:])
    assert not (folder / relative.with_suffix(".py")).exists() and not (folder / relative).is_dir(), old


def test_the_changelog_names_every_move() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    missing = [
        f"{old} -> {new}" for old, new in MOVED.items() if f"`{old}`" not in changelog or f"`{new}`" not in changelog
    ]
    assert not missing, f"CHANGELOG.md does not name: {missing}"


def test_other_names_are_left_to_the_import_system() -> None:
    assert importlib.util.find_spec("acker_spark.no_such_module") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("acker_spark.no_such_module")


@pytest.mark.parametrize("name", ["acker_spark.driver_fed", "acker_spark.driver_fed.pipeline"])
def test_a_removed_path_fails_naming_what_replaces_it(name: str) -> None:
    """A job still importing the driver-fed wing learns to use SourcePipeline, not only that the module is gone."""
    with pytest.raises(ModuleNotFoundError, match="SourcePipeline") as caught:
        exec(compile(f"import {name}", __file__, "exec"), {})  # an import statement, as a job writes it
    assert caught.value.name == "acker_spark.driver_fed" and name not in sys.modules


def test_a_removed_name_is_gone_from_the_package() -> None:
    """``from acker_spark import GuaranteedPipeline`` fails: no alias keeps the removed driver alive."""
    with pytest.raises(ImportError):
        exec(compile("from acker_spark import GuaranteedPipeline", __file__, "exec"), {})


@pytest.mark.parametrize("removed", sorted(REMOVED))
def test_no_module_lives_at_a_removed_path(removed: str) -> None:
    folder = Path(acker_spark.__file__).parent
    relative = Path(*removed.split(".")[1:])
    assert not (folder / relative.with_suffix(".py")).exists() and not (folder / relative).is_dir(), removed


def test_the_changelog_names_every_removal() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert not [old for old in REMOVED if f"`{old}`" not in changelog]


# acker_service: the moving wing's modules moved into acker_service/moving/.
from acker_service.moved_modules import MOVED as SERVICE_MOVED  # noqa: E402


@pytest.fixture
def forget_service_old_paths() -> Iterator[None]:
    yield
    import acker_service

    for old in SERVICE_MOVED:
        sys.modules.pop(old, None)
        acker_service.__dict__.pop(old.rsplit(".", 1)[1], None)


@pytest.mark.parametrize("old", sorted(SERVICE_MOVED))
def test_an_old_acker_service_path_warns_and_is_the_new_module(old: str, forget_service_old_paths: None) -> None:
    new = SERVICE_MOVED[old]
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {new}") as caught:
        exec(compile(f"import {old}", __file__, "exec"), {})
    assert sys.modules[old] is importlib.import_module(new)
    assert caught[0].filename == __file__


def test_names_import_from_an_old_acker_service_path(forget_service_old_paths: None) -> None:
    from acker_service.moving.layout import Layout

    with pytest.warns(DeprecationWarning, match="acker_service.moving.layout"):
        from acker_service.layout import Layout as old_layout
    assert old_layout is Layout


@pytest.mark.parametrize("old", sorted(SERVICE_MOVED))
def test_no_acker_service_module_lives_at_an_old_path(old: str) -> None:
    assert not (REPO / Path(*old.split("."))).with_suffix(".py").exists(), old


def test_the_changelog_names_every_acker_service_move() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    missing = [
        f"{o} -> {n}" for o, n in SERVICE_MOVED.items() if f"`{o}`" not in changelog or f"`{n}`" not in changelog
    ]
    assert not missing, f"CHANGELOG.md does not name: {missing}"


def test_the_package_names_resolve_without_an_old_path() -> None:
    """``from acker_spark import X`` for every lazily imported name finds its module where it now is: an old path
    would warn a user who never named it (``UnstableIdentity`` did, after the tracking layer moved)."""
    code = (
        "import warnings; warnings.filterwarnings('error', message='.*has moved to'); import acker_spark;"
        "[getattr(acker_spark, name) for name in acker_spark._LAZY]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
