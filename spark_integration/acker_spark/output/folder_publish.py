"""Publishing a commit's staged files into a destination folder, and the snapshot folders of a table.

Two ways to make a staged commit visible (``destinations.py`` chooses):

- **In place** (:func:`publish_in_place`, a ``FileOutput``): each staged file
  is moved into the destination folder under a name carrying the run and
  commit, then a marker ``_acker_commits/<run>-c<commit>.json`` lists the
  commit's files. A move is atomic and a moved file leaves the staging folder,
  so finishing after a crash moves only what is left; a plain reader may see
  part of a commit while the moves run (the markers say which files are whole
  commits).
- **As a new snapshot** (:func:`build_version`, a ``TableOutput``): a new
  folder ``.acker-versions/<run>-c<commit>/`` of the table's base folder gets
  a hard link to every data file of the table's current folder (none for the
  first commit of an overwrite) and to every staged file, plus the markers;
  it is built under a hidden name and renamed into place whole. The table's
  location is then switched to it in one catalog step (``ALTER TABLE ... SET
  LOCATION``): a reader sees the table before the commit or after it, never
  part of it. Links cost no copy of the data; where the file system has none,
  files are copied. :func:`prune_versions` removes snapshots older than the
  previous one (a query still reading that one keeps its files).

Names starting with ``.`` or ``_`` are hidden: Spark's readers skip them, so
staging, snapshots and markers never show up as data.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "MARKERS",
    "MOVES",
    "STAGING",
    "VERSIONS",
    "build_version",
    "clear_foreign",
    "data_files",
    "foreign_files",
    "hidden",
    "prune_versions",
    "publish_in_place",
    "published_files",
    "staging_folder",
    "table_base",
    "version_folder",
]

STAGING = ".acker-staging"
MARKERS = "_acker_commits"
VERSIONS = ".acker-versions"
MOVES: list[Callable[[Path], None]] = []
"""Hooks called with each file a commit is about to move or link into place (fault injection in tests and benches)."""


def hidden(name: str) -> bool:
    """True for a name Spark's readers skip (``.`` or ``_`` first): staging, snapshots, markers, ``_SUCCESS``."""
    return name.startswith((".", "_"))


def published_files(path: str | Path) -> list[Path]:
    """The data files of complete commits at ``path`` (from their markers), for readers that must not see a partial one."""
    root = Path(path)
    files: list[Path] = []
    markers = root / MARKERS
    for marker in sorted(markers.glob("*.json")) if markers.is_dir() else []:
        files.extend(root / name for name in json.loads(marker.read_text())["files"])
    return files


def staging_folder(root: Path, run: str, commit: int) -> Path:
    return root / STAGING / f"{run}-c{commit:05d}"


def data_files(folder: Path) -> list[Path]:
    """Visible data files under ``folder`` (Spark's own ``_SUCCESS``, ``.crc`` and hidden folders left out)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not hidden(d)]
        found.extend(Path(dirpath) / f for f in filenames if not hidden(f))
    return sorted(found)


def foreign_files(root: Path, run: str) -> bool:
    """True if ``root`` holds data files that are not this run's."""
    return root.is_dir() and any(not f.name.startswith(f"{run}-") for f in data_files(root))


def clear_foreign(root: Path, run: str) -> None:
    """Delete every data file (and empty folder) that is not this run's: mode ``overwrite``, before its first commit."""
    _clear(root, lambda name: name.startswith(f"{run}-"))


def _clear(root: Path, keep: Callable[[str], bool]) -> None:
    """Delete the data files of ``root`` whose name ``keep`` refuses, then the visible folders left empty."""
    for path in data_files(root) if root.is_dir() else []:
        if not keep(path.name):
            path.unlink()
    for dirpath, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        folder = Path(dirpath)
        if folder != root and not any(hidden(p) for p in folder.relative_to(root).parts) and not any(folder.iterdir()):
            folder.rmdir()


def publish_in_place(root: Path, run: str, commit: int) -> list[str]:
    """Move commit ``commit``'s staged files into place; write its marker; return the files (relative to ``root``)."""
    staging = staging_folder(root, run, commit)
    prefix = f"{run}-c{commit:05d}-"
    for path in data_files(staging) if staging.is_dir() else []:
        relative = path.relative_to(staging)
        target = root / relative.parent / f"{prefix}{relative.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        for hook in MOVES:
            hook(path)
        os.replace(path, target)
    shutil.rmtree(staging, ignore_errors=True)
    files = sorted(str(p.relative_to(root)) for p in data_files(root) if p.name.startswith(prefix))
    _write_marker(root, run, commit, files)
    return files


def table_base(location: Path) -> Path:
    """The folder a table was created in, whether its location is that folder or one of its snapshots."""
    if location.parent.name == VERSIONS:
        return location.parent.parent
    return location


def version_folder(base: Path, run: str, commit: int) -> Path:
    """The snapshot folder of commit ``commit`` of ``run`` for a table created in ``base``."""
    return base / VERSIONS / f"{run}-c{commit:05d}"


def build_version(current: Path, staging: Path, target: Path, run: str, commit: int, *, keep: bool) -> list[str]:
    """Build snapshot ``target``: the files of ``current`` (if ``keep``) and the staged ones; the commit's files.

    Built in a hidden folder beside ``target`` (one a crash left is built
    again from scratch: nothing was taken from ``current`` or ``staging``)
    and renamed to ``target`` whole, so ``target`` exists only complete.
    """
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if keep:
        for path in data_files(current):
            _link(path, partial / path.relative_to(current))
        for marker in sorted((current / MARKERS).glob("*.json")) if (current / MARKERS).is_dir() else []:
            _link(marker, partial / MARKERS / marker.name)
    prefix = f"{run}-c{commit:05d}-"
    files: list[str] = []
    for path in data_files(staging) if staging.is_dir() else []:
        relative = path.relative_to(staging)
        name = relative.parent / f"{prefix}{relative.name}"
        for hook in MOVES:
            hook(path)
        _link(path, partial / name)
        files.append(str(name))
    _write_marker(partial, run, commit, sorted(files))
    os.rename(partial, target)
    return sorted(files)


def prune_versions(base: Path, keep: set[Path]) -> None:
    """Remove the snapshots of ``base`` not in ``keep``, and ``base``'s own data files once it is not kept either."""
    folder = base / VERSIONS
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if entry not in keep:
            shutil.rmtree(entry, ignore_errors=True)
    if base not in keep:
        # The table was created here; its snapshots hold links to these files: the names can go.
        _clear(base, keep=lambda name: False)


def _link(source: Path, target: Path) -> None:
    """Hard-link ``source`` at ``target`` (a copy where the file system has no links)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except FileExistsError:
        os.unlink(target)
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _write_marker(root: Path, run: str, commit: int, files: list[str]) -> None:
    """Write commit ``commit``'s marker in ``root``: the list of its files, renamed into place whole."""
    marker = root / MARKERS / f"{run}-c{commit:05d}.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(json.dumps({"run": run, "commit": commit, "files": files}))
    os.replace(tmp, marker)
