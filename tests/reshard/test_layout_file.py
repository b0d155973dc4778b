"""The layout file: written atomically at each change, read at start, a corrupt one refused, a failing disk handled.

Unit tests of :mod:`acker_service.moving.layout_file` and of a :class:`Shard` driven
through prepare -> cut -> commit without gRPC (no trees: nothing to hand over; the
other ackers' empty handoffs are stood in for, see ``no_peers`` and ``_others_handed_over``).
The restarts of real acker processes are in test_restart_layout_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import pytest

from acker_service.config import ConfigError, ServerConfig
from acker_service.moving import membership as membership_module
from acker_service.moving.layout import CUT, SERVING, Layout, LayoutMachine, LayoutRefused
from acker_service.moving.layout_file import FORMAT, LayoutFile, LayoutFileError, LayoutNotRecorded, starting_layout
from acker_service.process_cluster import layout_conflicts
from acker_service.shard import Shard

FOUR = ("h:1", "h:2", "h:3", "h:4")


def test_a_saved_layout_reads_back_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    """save -> load gives the same layout, a second save replaces the first, the folder holds only the file."""
    store = LayoutFile(tmp_path / "layout.json")
    store.save(Layout(1, 4, 3, FOUR))
    assert store.load() == Layout(1, 4, 3, FOUR)
    store.save(Layout(2, 3, -1, FOUR[:3]))
    assert store.load() == Layout(2, 3, -1, FOUR[:3])
    assert [p.name for p in tmp_path.iterdir()] == ["layout.json"]
    assert json.loads((tmp_path / "layout.json").read_text())["format"] == FORMAT


def test_a_missing_file_means_the_flags(tmp_path: Path) -> None:
    """No file: load is None and the acker starts in the flags' layout."""
    flags = Layout(0, 3, 1)
    assert LayoutFile(tmp_path / "absent.json").load() is None
    assert starting_layout(flags, None) is flags


def test_only_a_newer_stored_layout_overrides_the_flags() -> None:
    """A stored epoch above the flags' wins; one not above (a file of epoch 0) does not."""
    flags = Layout(0, 3, 1)
    newer = Layout(1, 4, 1, FOUR)
    assert starting_layout(flags, newer) is newer
    assert starting_layout(flags, Layout(0, 2, 0)) is flags


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not JSON"),
        ('{"format": "acker-layout/1", "epoch": 1, "shard_co', "not JSON"),
        ("[1, 4, 3]", "not a JSON object"),
        ('{"format": "other", "epoch": 1, "shard_count": 4, "shard_index": 3, "addresses": []}', "format"),
        ('{"format": "acker-layout/1", "epoch": 1, "shard_count": 4}', "missing addresses, shard_index"),
        ('{"format": "acker-layout/1", "epoch": true, "shard_count": 4, "shard_index": 3, "addresses": []}', "epoch"),
        ('{"format": "acker-layout/1", "epoch": -1, "shard_count": 4, "shard_index": 3, "addresses": []}', "below 0"),
        ('{"format": "acker-layout/1", "epoch": 1, "shard_count": 4, "shard_index": 4, "addresses": []}', "outside"),
        ('{"format": "acker-layout/1", "epoch": 1, "shard_count": 4, "shard_index": 3, "addresses": ["a"]}', "needs 4"),
        ('{"format": "acker-layout/1", "epoch": 1, "shard_count": 2, "shard_index": 0, "addresses": [1, 2]}', "host"),
    ],
)
def test_a_corrupt_file_is_refused_naming_it(tmp_path: Path, text: str, reason: str) -> None:
    """Anything but a layout this acker wrote raises LayoutFileError with the path, the reason and the way out."""
    path = tmp_path / "layout.json"
    path.write_text(text)
    with pytest.raises(LayoutFileError, match=reason) as caught:
        LayoutFile(path).load()
    assert str(path) in str(caught.value) and "remove it" in str(caught.value)


def test_a_file_that_is_not_text_is_refused(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are reported as unreadable, with the path."""
    path = tmp_path / "layout.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(LayoutFileError, match=str(path)):
        LayoutFile(path).load()


def test_config_refuses_a_layout_file_it_could_not_write(tmp_path: Path) -> None:
    """A missing directory or a directory in place of the file fails at start, not at the first reshard."""
    with pytest.raises(ConfigError, match="does not exist"):
        ServerConfig(layout_file=str(tmp_path / "nowhere" / "layout.json"))
    with pytest.raises(ConfigError, match="is a directory"):
        ServerConfig(layout_file=str(tmp_path))
    assert ServerConfig(layout_file=str(tmp_path / "layout.json")).layout_file  # absent file, existing folder: fine


def test_the_launcher_keeps_one_layout_file_per_shard() -> None:
    """A --layout-file passed to every child would give them all one shard: the launcher refuses it."""
    assert layout_conflicts(["--layout-file", "x.json"]) == [
        "--layout-file is set per shard by the launcher; use its --layout-dir instead"
    ]


def test_commit_records_only_an_allowed_layout_before_taking_it() -> None:
    """The machine calls ``record`` with the next layout once the commit is allowed; a refused commit records nothing."""
    recorded: list[tuple[Layout, int]] = []
    m = LayoutMachine(Layout(0, 3, 0))
    with pytest.raises(LayoutRefused):
        m.commit(1, lambda layout: recorded.append((layout, m.current.epoch)))
    assert recorded == []
    nxt = Layout(1, 4, 0, FOUR)
    m.prepare(nxt)
    m.start_cut(1)
    m.mark_cut()
    with pytest.raises(LayoutRefused, match="have not arrived"):
        m.commit(1, lambda layout: recorded.append((layout, m.current.epoch)))
    assert recorded == []
    for source in sorted(m.awaiting):
        m.source_merged(source)
    m.commit(1, lambda layout: recorded.append((layout, m.current.epoch)))
    assert recorded == [(nxt, 0)]  # written while the old layout was still current


@pytest.fixture(autouse=True)
def no_peers(monkeypatch):
    """These shards have no peers to call: every empty handoff a cut sends counts as delivered."""

    async def delivered(chunks, layout, metadata=(), security=None):
        return []

    monkeypatch.setattr(membership_module, "send_handoffs", delivered)


def _others_handed_over(shard: Shard) -> None:
    """The other old owners' (empty) handoffs arrived, as they do when acker-ctl cuts every acker."""
    for source in sorted(shard.membership.layout.awaiting):
        shard.membership.layout.source_merged(source)


def _shard(path: Path, index: int = 0, count: int = 3) -> Shard:
    return Shard(ServerConfig(shard_index=index, shard_count=count, layout_file=str(path)), clock=lambda: 0.0)


def _move(shard: Shard, layout: Layout) -> None:
    """prepare -> cut -> commit, as acker-ctl reshard drives them (no pending trees: nothing is handed over)."""
    shard.membership.prepare_layout(layout)
    asyncio.run(shard.membership.cut_layout(layout.epoch))
    _others_handed_over(shard)
    shard.membership.commit_layout(layout.epoch)


def test_a_shard_writes_each_commit_and_a_new_shard_starts_in_it(tmp_path: Path) -> None:
    """After 3 -> 4 the file holds epoch 1; a shard built again from the same flags serves shard 0 of 4 there."""
    path = tmp_path / "layout.json"
    shard = _shard(path)
    assert not path.exists()  # nothing committed yet
    _move(shard, Layout(1, 4, 0, FOUR))
    assert LayoutFile(path).load() == Layout(1, 4, 0, FOUR)
    again = _shard(path)
    assert (again.membership.layout.current, again.membership.place, again.membership.layout.state) == (
        Layout(1, 4, 0, FOUR),
        (0, 4),
        SERVING,
    )
    assert (again.membership.limits.shard_index, again.membership.limits.shard_count) == (0, 4)


def test_a_drained_shard_comes_back_drained(tmp_path: Path) -> None:
    """Index -1 is recorded too: a drained acker restarts owning no roots, reporting its flag's index."""
    path = tmp_path / "layout.json"
    shard = _shard(path, index=2)
    _move(shard, Layout(1, 2, -1, FOUR[:2]))
    again = _shard(path, index=2)
    assert (again.membership.layout.current.index, again.membership.layout.current.epoch, again.membership.place) == (
        -1,
        1,
        (2, 2),
    )


def test_a_shard_refuses_to_start_from_a_corrupt_file(tmp_path: Path) -> None:
    """The shard does not fall back to its flags when the file is unreadable."""
    path = tmp_path / "layout.json"
    path.write_text("{")
    with pytest.raises(LayoutFileError, match=str(path)):
        _shard(path)


def test_a_prepare_the_disk_refuses_changes_nothing(tmp_path: Path) -> None:
    """The file's directory gone: PrepareLayout is refused (UNAVAILABLE in the servicer), the shard still serves."""
    folder = tmp_path / "state"
    folder.mkdir()
    shard = _shard(folder / "layout.json")
    shutil.rmtree(folder)
    with pytest.raises(LayoutNotRecorded, match="nothing changed"):
        shard.membership.prepare_layout(Layout(1, 4, 0, FOUR))
    assert (shard.membership.layout.state, shard.membership.layout.next, shard.membership.layout.current) == (
        SERVING,
        None,
        Layout(0, 3, 0),
    )
    folder.mkdir()  # fixed: the same change goes through
    _move(shard, Layout(1, 4, 0, FOUR))
    assert LayoutFile(folder / "layout.json").load() == Layout(1, 4, 0, FOUR)


def test_a_commit_the_disk_refuses_still_commits_and_says_so(tmp_path: Path, caplog) -> None:
    """A write failing after the cut: the shard agrees with its peers now and logs what a restart would do."""
    folder = tmp_path / "state"
    folder.mkdir()
    shard = _shard(folder / "layout.json")
    nxt = Layout(1, 4, 0, FOUR)
    shard.membership.prepare_layout(nxt)
    asyncio.run(shard.membership.cut_layout(1))
    _others_handed_over(shard)
    assert shard.membership.layout.state == CUT
    shutil.rmtree(folder)
    with caplog.at_level(logging.ERROR, logger="acker_service"):
        assert shard.membership.commit_layout(1) == nxt
    assert (shard.membership.layout.state, shard.membership.layout.current) == (SERVING, nxt)
    assert any("could not be written" in r.getMessage() and str(folder) in r.getMessage() for r in caplog.records)
