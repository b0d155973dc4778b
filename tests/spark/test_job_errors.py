"""What a failed Spark job says: the worker's innermost Python exception, or a driver-side exception's own frame."""

from __future__ import annotations

import pytest
from acker_spark.job_errors import JobError, job_error


def test_job_error_reads_the_workers_innermost_python_exception() -> None:
    text = (
        "An error occurred while calling o123.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 4.0 failed 4 times\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/venv/pyspark/worker.py", line 1900, in main\n'
        "    process()\n"
        '  File "/app/job.py", line 12, in store\n'
        "    raise ValueError(f'bad record {key}')\n"
        "ValueError: bad record b.txt:2\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:600)\n"
    )
    assert job_error(RuntimeError(text)) == JobError("ValueError", "bad record b.txt:2", "/app/job.py:12 in store")
    assert str(job_error(RuntimeError(text))) == "ValueError: bad record b.txt:2 (at /app/job.py:12 in store)"


def test_job_error_of_a_driver_side_exception_names_its_own_frame() -> None:
    def job() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError) as caught:
        job()
    error = job_error(caught.value)
    assert (error.type, error.message) == ("KeyError", "'missing'")
    assert error.where.endswith(" in job") and "test_job_errors.py" in error.where
    assert JobError("ClusterMisconfigured", "x").configuration and not error.configuration
