"""Issue 23, case 4: ``local_session()`` keeps Spark's errors visible (it set the log level to FATAL)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_the_local_session_logs_spark_errors(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    assert root.getLevel().toString() == "ERROR"  # a failed task's error is shown; INFO/WARN chatter is not
