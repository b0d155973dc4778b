"""Real acker processes restarted after a reshard come back in the committed layout (``--layout-file``).

Three acker processes and a fourth that joins, each with its own layout file
(ProcessCluster's ``layout_dir``), are grown 3 -> 4 by ``acker-ctl reshard``;
then shard 0 and the joined acker are restarted as processes. Their flags still
say shard 0 of 3 and shard 0 of 1: only the file can make them shard 0 and 3 of
4 again. A corrupt file makes ``acker-server`` exit 2 naming the file.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import grpc
from acker_client import ClusterClient
from acker_ctl.cli import main as acker_ctl
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from acker_protocol.wire import Outcome

from acker_service.moving.layout_file import LayoutFile
from acker_service.process_cluster import ProcessCluster

from .workload import SPOUT, Outcomes


def _ctl(*args: str) -> dict:
    printed: list[str] = []
    assert acker_ctl(["--json", *args], out=printed.append) == 0
    return json.loads(printed[0])


def _describe(address: str) -> acker_pb2.DescribeResponse:
    with grpc.insecure_channel(address) as channel:
        return acker_pb2_grpc.AckerStub(channel).Describe(acker_pb2.DescribeRequest(), timeout=10)


def _places(addresses: list[str]) -> list[tuple[int, int, int]]:
    """(shard index, shard count, layout epoch) each acker reports."""
    return [(d.shard_index, d.shard_count, d.layout.epoch) for d in map(_describe, addresses)]


def test_ackers_restarted_after_3_to_4_serve_as_shards_of_4(tmp_path: Path) -> None:
    """Missing files: the flags; after the reshard and a process restart: the file's layout, trees acked on it."""
    with (
        ProcessCluster(count=3, layout_dir=tmp_path / "three") as three,
        ProcessCluster(count=1, layout_dir=tmp_path / "extra") as extra,
    ):
        old = list(three.addresses)
        four = [*old, extra.addresses[0]]
        # No file yet: each acker started from its flags.
        assert _places(old) == [(0, 3, 0), (1, 3, 0), (2, 3, 0)]
        assert not any(three.layout_file(i).exists() for i in range(3))

        grown = _ctl("--ackers", ",".join(old), "reshard", "--shards", "4", "--addresses", ",".join(four))
        assert grown["epoch"] == 1
        assert LayoutFile(extra.layout_file(0)).load() is not None

        pids = three.pid(0), extra.pid(0)
        three.restart(0)
        extra.restart(0)
        assert (three.pid(0), extra.pid(0)) != pids and None not in (three.pid(0), extra.pid(0))
        assert _places(four) == [(0, 4, 1), (1, 4, 1), (2, 4, 1), (3, 4, 1)]
        assert list(_describe(four[3]).layout.addresses) == four
        assert "holds committed layout epoch 1" in three.log_path(0).read_text()

        # The restarted ackers own their roots again: a tree on every shard ends ACKED, none refused or rerouted.
        client = ClusterClient(four, flush_interval=0.001)
        outcomes = Outcomes(client)
        try:
            roots = [(secrets.randbits(60) << 2) + shard or 4 for shard in range(4) for _ in range(5)]
            for root in roots:
                a, b = secrets.randbits(64), secrets.randbits(64)
                client.init(root, a ^ b, SPOUT)
                client.ack(root, a)
                client.ack(root, b)
            client.flush()
            assert outcomes.wait_for(roots, timeout=60)
            with outcomes.lock:
                assert all(outcomes.by_root[r] == [Outcome.ACKED] for r in roots)
            assert client.stats.batches_rerouted == 0
        finally:
            outcomes.close()
            client.close()

        # The next change starts from the restored layout: back to 3 is epoch 2 on every acker.
        back = _ctl("--ackers", ",".join(four), "reshard", "--shards", "3", "--addresses", ",".join(old))
        assert back["epoch"] == 2
        assert _places(old) == [(0, 3, 2), (1, 3, 2), (2, 3, 2)]


def test_a_corrupt_layout_file_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    """acker-server exits 2 with a message that names the file, instead of serving from its flags."""
    path = tmp_path / "layout.json"
    path.write_text('{"format": "acker-layout/1", "epoch": 3, "shard_cou')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKER_")}
    done = subprocess.run(
        [sys.executable, "-m", "acker_service", "--port", "0", "--layout-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"the layout file {path} is corrupt" in done.stderr
    assert "serving on" not in done.stderr + done.stdout
