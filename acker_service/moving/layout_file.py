"""The last committed layout of one acker, kept in a file so that a restarted acker comes back in it.

Without it an acker that restarts after ``acker-ctl reshard`` starts again from
its own ``--shard-index``/``--shard-count`` (layout epoch 0) and disagrees with
its peers. With ``--layout-file PATH`` the acker writes every layout it commits
to PATH, atomically (a temporary file in the same directory, fsync, rename,
fsync of the directory), and at start takes the layout found there when its
epoch is newer than the flags' (every committed layout is: the flags are epoch
0). A missing file means the flags; a file that is not a layout this acker
wrote refuses the start, naming the file, rather than guess a shard.

A local file rather than asking the peers at start: it needs no other acker up
(a whole cluster restarting at once) and no list of peers, and the acker knows
its place before it serves a call.

The file is small JSON: ``{"format": "acker-layout/1", "epoch": 1,
"shard_count": 4, "shard_index": 3, "addresses": [...]}`` (index -1: drained).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from .layout import Layout, LayoutRefused

__all__ = ["FORMAT", "LayoutFile", "LayoutFileError", "LayoutNotRecorded", "starting_layout"]

FORMAT = "acker-layout/1"
_FIELDS = {"format", "epoch", "shard_count", "shard_index", "addresses"}


class LayoutFileError(Exception):
    """The layout file exists but cannot be read as a layout: the acker must not start (it would guess its shard)."""


class LayoutNotRecorded(Exception):
    """The layout file cannot be written (UNAVAILABLE when it refuses a PrepareLayout: nothing changed)."""


class LayoutFile:
    """Read and atomically replace the committed layout at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> Layout | None:
        """The layout in the file; None when there is no file; LayoutFileError when it is unreadable or not a layout."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise LayoutFileError(f"cannot read the layout file {self.path}: {exc}") from exc
        try:
            return _parse(text)
        except ValueError as exc:
            raise LayoutFileError(
                f"the layout file {self.path} is corrupt ({exc}); the acker does not start rather than guess "
                "its shard: restore the file, or remove it to start from --shard-index/--shard-count "
                "(then run acker-ctl reshard to give this acker its place)"
            ) from None

    def save(self, layout: Layout) -> None:
        """Replace the file with ``layout``, atomically and durably (OSError when the disk refuses)."""
        data = json.dumps(
            {
                "format": FORMAT,
                "epoch": layout.epoch,
                "shard_count": layout.count,
                "shard_index": layout.index,
                "addresses": list(layout.addresses),
            },
            indent=1,
        ).encode()
        folder = self.path.parent
        # In the same directory, so the rename is atomic: a reader (a restart) sees the old file or the new one.
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())  # the content is on disk before the name points at it
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):  # the rename may have happened before the failure
                os.unlink(temporary)
            raise
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)


def _parse(text: str) -> Layout:
    """The layout in the file's text; ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
    missing = sorted(_FIELDS - data.keys())
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    numbers = {}
    for name in ("epoch", "shard_count", "shard_index"):
        value = data[name]
        if not isinstance(value, int) or isinstance(value, bool):  # JSON true would pass as the int 1
            raise ValueError(f"{name} is {value!r}, not a whole number")
        numbers[name] = value
    if numbers["epoch"] < 0:
        raise ValueError(f"epoch is {numbers['epoch']}, below 0")
    addresses = data["addresses"]
    if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
        raise ValueError("addresses is not a list of host:port strings")
    layout = Layout(numbers["epoch"], numbers["shard_count"], numbers["shard_index"], tuple(addresses))
    try:
        layout.check()
    except LayoutRefused as exc:
        raise ValueError(str(exc)) from None
    return layout


def starting_layout(flags: Layout, stored: Layout | None) -> Layout:
    """The layout an acker starts in: the stored one when it is newer than the flags', else the flags'."""
    return stored if stored is not None and stored.epoch > flags.epoch else flags
