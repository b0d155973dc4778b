"""A real ``acker-server`` process per configuration, and how to read its state from outside."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from acker_protocol import grpc_options
from acker_protocol.v1 import acker_pb2, acker_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from acker_service.healthcheck import probe

# Small limits, so oversize messages and batches are cheap to build.
MAX_BATCH = 1024
MAX_MESSAGE_BYTES = 256 * 1024
_START = re.compile(r"serving on (\S+), metrics on (\S+),")


@dataclass
class AckerProcess:
    """One running ``python -m acker_service`` with its addresses, stderr log file and a channel."""

    process: subprocess.Popen
    address: str
    metrics_url: str
    shard_index: int
    shard_count: int
    log_path: Path
    channel: grpc.Channel

    def alive_and_serving(self) -> bool:
        """The process has not exited and its health service answers SERVING."""
        return self.process.poll() is None and probe(self.address, timeout=5) == "SERVING"

    def ledger(self) -> dict[str, float]:
        """Pending trees (Describe) and every ledger and outcome counter (/metrics)."""
        stub = acker_pb2_grpc.AckerStub(self.channel)
        state: dict[str, float] = {
            "pending_trees": stub.Describe(acker_pb2.DescribeRequest(), timeout=10).pending_trees
        }
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name.startswith(
                ("acker_operations", "acker_trees", "acker_outcomes", "acker_orphan", "acker_duplicate")
            ):
                for sample in family.samples:
                    if sample.name.endswith("_created") or family.name == "acker_outcomes_retained":
                        continue
                    state[sample.name + repr(sorted(sample.labels.items()))] = sample.value
        return state


def _start(tmp: Path, shard_index: int, shard_count: int) -> AckerProcess:
    log_path = tmp / f"acker-{shard_index}-of-{shard_count}.log"
    command = [
        sys.executable, "-m", "acker_service", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
        "--shard-index", str(shard_index), "--shard-count", str(shard_count), "--max-batch", str(MAX_BATCH),
        "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--grace", "0.5",
        # The seeded trees must outlive a long run: a timeout would change the ledger legitimately.
        "--message-timeout", "86400",
    ]  # fmt: skip
    # stderr goes to a file: a pipe nobody reads would block the server once full.
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = _START.search(log_path.read_text(errors="replace"))
        if match:
            channel = grpc.insecure_channel(match.group(1), options=grpc_options.client_options())
            return AckerProcess(process, match.group(1), match.group(2), shard_index, shard_count, log_path, channel)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise RuntimeError(f"acker-server did not start: {log_path.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="module", params=[(0, 1), (0, 2)], ids=["shard-0-of-1", "shard-0-of-2"])
def acker_process(request, tmp_path_factory) -> Iterator[AckerProcess]:
    """A real acker-server process (shard 0 of 1, then shard 0 of 2), stopped after the module."""
    acker = _start(tmp_path_factory.mktemp("fuzz"), *request.param)
    try:
        yield acker
    finally:
        acker.channel.close()
        acker.process.terminate()
        try:
            acker.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            acker.process.kill()
            acker.process.wait()
