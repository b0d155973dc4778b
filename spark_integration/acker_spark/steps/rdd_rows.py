"""A tracked DataFrame's rows as an RDD of tracked tuples, so ``Bolt.apply(rdd)`` runs over a driver's records.

``SourcePipeline.run`` hands its job a DataFrame whose ``_acker_ids`` column
carries each record's tree. A job written with RDD bolts (``Bolt.apply``,
``keyBy``/``partitionBy`` shuffles) turns it into an RDD with
:func:`tracked_rdd`: each row becomes a ``TrackedTuple`` whose value is a Row
of the other columns, the shape ``Bolt.apply_df`` gives its function. Classic
Spark only: Spark Connect has no RDDs (use ``Bolt.apply_df`` or ``ArrowBolt``).
"""

from __future__ import annotations

from typing import Any

from acker_client import TrackedTuple

from .frames import TRACKING_COLUMN, require_tracking_column, unpack_ids

__all__ = ["tracked_rdd"]


def tracked_rdd(df: Any) -> Any:
    """``df``'s rows as an RDD of ``TrackedTuple(Row of the other columns, MessageId of _acker_ids)``.

    Raises ValueError when ``df`` has no ``_acker_ids`` column and TypeError on
    Spark Connect, which has no RDDs.
    """
    require_tracking_column(df.columns)
    try:
        rdd = df.rdd
    except Exception as err:  # noqa: BLE001 - Spark Connect's error type differs between versions
        raise TypeError(
            "tracked_rdd needs classic Spark (this DataFrame has no RDD, as on Spark Connect):"
            " run the bolts with Bolt.apply_df(df, schema) or ArrowBolt instead"
        ) from err
    return rdd.map(_tracked)


def _tracked(row: Any) -> TrackedTuple:
    """One row as a tracked tuple: the tracking column becomes its MessageId, the rest its value."""
    from pyspark.sql import Row

    fields = row.asDict(recursive=False)
    message_id = unpack_ids(fields.pop(TRACKING_COLUMN))
    return TrackedTuple(Row(**fields), message_id)
