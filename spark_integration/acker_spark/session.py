"""A local SparkSession configured for tracked pipelines (the demo and the tests share it): Spark's errors shown."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["local_session", "LOCAL_MASTER", "spark_context_of", "default_parallelism", "submitted_master"]

# "local[2,4]": two cores, and up to 4 attempts per task. Plain "local[N]" never
# retries a failed task, which would hide exactly what the integration must survive.
LOCAL_MASTER = "local[2,4]"

# Errors only, and to stderr: Spark's INFO and WARN chatter hidden, but a failed task
# (the demo's injected crashes included) is shown, as every user copying this needs.
LOG_LEVEL = "ERROR"
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _log4j2_file() -> Path:
    path = Path(tempfile.gettempdir()) / "acker-spark-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path


def submitted_master() -> str | None:
    """The master that ``spark-submit --master`` (or ``PYSPARK_SUBMIT_ARGS``) gave this process, or None.

    Under ``spark-submit`` the driver's JVM is already running (``PYSPARK_GATEWAY_PORT``)
    and holds the master among its settings; a Python started with
    ``PYSPARK_SUBMIT_ARGS="--master ... pyspark-shell"`` names it there.
    """
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts none
        master = SparkConf().get("spark.master", None)
        if master:
            return str(master)
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "").split()
    if "--master" in args[:-1]:
        return args[args.index("--master") + 1]
    return None


def local_session(
    master: str | None = None,
    *,
    app_name: str = "acker-spark",
    shuffle_partitions: int = 4,
    quiet: bool = True,
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """Get or create a local SparkSession whose Python workers run this interpreter.

    ``master``: None (the default) keeps a master given by ``spark-submit
    --master`` (:func:`submitted_master`) and is otherwise :data:`LOCAL_MASTER`.

    ``quiet=True`` shows Spark's log at ERROR and above only (failed tasks
    included); ``quiet=False`` leaves Spark's own logging as configured.
    If a session already exists in this process it is returned unchanged
    (Spark allows one SparkContext per process).
    """
    from pyspark.sql import SparkSession

    # Workers must import acker_spark and acker_client: use this interpreter, not
    # whatever "python3" is first on PATH. Loopback avoids the hostname warning.
    # PySpark reads PYSPARK_PYTHON when the SparkContext starts (the conf key alone
    # is not enough in local mode).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if master is None:
        master = submitted_master() or LOCAL_MASTER
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
    )
    if quiet:
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_log4j2_file()}")
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel(LOG_LEVEL)
    return spark


def spark_context_of(spark: Any) -> Any:
    """``spark``'s SparkContext, or None for a Spark Connect session (which has none).

    A SparkContext passed in is returned as it is.
    """
    if hasattr(spark, "parallelize"):
        return spark
    try:
        return spark.sparkContext
    except Exception:  # noqa: BLE001 - Connect raises PySparkNotImplementedError; older clients AttributeError
        return None


CONNECT_DEFAULT_PARTITIONS = 2
"""Partitions per micro-batch on Spark Connect when neither ``partitions=`` nor ``spark.default.parallelism`` says."""


def default_parallelism(spark: Any) -> int:
    """The SparkContext's default parallelism; on Spark Connect ``spark.default.parallelism`` if set, else 2."""
    sc = spark_context_of(spark)
    if sc is not None:
        return int(sc.defaultParallelism)
    configured = spark.conf.get("spark.default.parallelism", None)
    return int(configured) if configured else CONNECT_DEFAULT_PARTITIONS
