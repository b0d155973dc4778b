"""The CLIs end a failed run with one line that says what to do, not a traceback (issue 12)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest
from acker_client.testing import local_cluster


def test_bench_with_a_wrong_shard_count_says_so_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    from acker_bench.cli import main

    with local_cluster(2) as ackers:
        assert main(["--ackers", ackers.addresses[0], "--duration", "1"]) == 1
    err = capfd.readouterr().err.strip()
    assert err.startswith("acker-bench: address 0 (") and "is acker shard 0 of 2" in err
    assert "\n" not in err and "Traceback" not in err


def test_bench_with_an_address_without_a_port_says_so_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    from acker_bench.cli import main

    assert main(["--ackers", "localhost", "--duration", "1"]) == 1
    err = capfd.readouterr().err.strip()
    assert err == "acker-bench: acker address 'localhost' has no port; write host:port, e.g. localhost:7100"


def test_demo_without_pyspark_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import acker_demo

    real = importlib.util.find_spec

    def without_pyspark(name: str, *args: Any) -> Any:
        return None if name == "pyspark" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_pyspark)
    assert acker_demo.main(["--records", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("acker-demo: needs pyspark") and "pip install 'pyspark-acker[tools]'" in err


def test_ackers_is_an_address_list_in_every_cli() -> None:
    """One meaning per flag: acker-demo's shard count is --shards; --ackers takes host:port lists."""
    from acker_demo.cli import parse_args

    assert parse_args(["--shards", "2"]).shards == 2
    result = subprocess.run(
        [sys.executable, "-m", "acker_demo", "--ackers", "3"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unrecognized arguments: --ackers" in result.stderr
