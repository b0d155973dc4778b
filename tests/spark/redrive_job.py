"""The job module ``acker-ctl dead-letters redrive --job redrive_job:make_job`` runs in test_redrive.py."""

from __future__ import annotations

import sys
from typing import Any

from pyspark import cloudpickle

# The executors' workers may not have this folder on their path: ship the functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _accept(batch: Any, collector: Any) -> None:
    """The fixed job: every row is fine (returning acks it)."""


def make_job(addresses: list[str]) -> Any:
    """The job for these ackers: one ArrowBolt sink that acks every row."""
    from acker_spark import ArrowBolt

    sink = ArrowBolt(_accept, addresses, schema=None, name="fixed-sink")
    return lambda df: sink.apply_df(df).count()
