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


def _parse_amount(text: str) -> float:
    """The fixed parser: a decimal comma is read as a point; anything else that is not a number still raises."""
    return float(text.replace(",", "."))


def _parse_orders(batch: Any, collector: Any) -> None:
    """Rows ``(id, amount, bucket)`` from ``(id, amount text)``; a record whose amount is not a number raises."""
    import pyarrow as pa

    ids = batch.column("id").to_pylist()
    amounts = [_parse_amount(text) for text in batch.column("amount").to_pylist()]
    collector.emit(
        {"id": pa.array(ids), "amount": pa.array(amounts), "bucket": pa.array([key[-1] for key in ids])},
        anchors=pa.array(range(len(ids)), pa.int32()),
    )


def make_output_job(addresses: list[str]) -> Any:
    """The fixed job of a pipeline with an output: one ArrowBolt parsing the amounts; returns its output frame."""
    from acker_spark import ArrowBolt

    parse = ArrowBolt(_parse_orders, addresses, schema="id string, amount double, bucket string", name="parse")
    return lambda df: parse.apply_df(df)
