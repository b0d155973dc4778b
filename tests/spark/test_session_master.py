"""``local_session()`` keeps the master that spark-submit was given instead of replacing it with its own default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from acker_spark.session import LOCAL_MASTER, submitted_master

SCRIPT = """
from acker_spark import local_session
spark = local_session()
print("MASTER=" + spark.sparkContext.master)
spark.stop()
"""


def test_spark_submit_master_is_kept(tmp_path: Path) -> None:
    """spark-submit --master local[1] job.py: local_session() runs on local[1], not on local[2,4]."""
    job = tmp_path / "job.py"
    job.write_text(SCRIPT)
    submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    done = subprocess.run(
        [str(submit), "--master", "local[1]", str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MASTER=local[1]" in done.stdout.splitlines()


def test_submit_args_name_the_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """PYSPARK_SUBMIT_ARGS="--master local[3] pyspark-shell" is honoured; nothing set means the local default."""
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--master local[3] pyspark-shell")
    assert submitted_master() == "local[3]"
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    assert submitted_master() is None
    assert LOCAL_MASTER == "local[2,4]"
