"""The executor-read drivers and their replay book: records read by Spark, trees started where they are read.

:mod:`.source_pipeline` (``SourcePipeline``: rounds of Spark jobs over a
DataFrame) and :mod:`.stream_planner` (the ``acker_spout`` stream's planning
side) differ only in what a round reads and how; what becomes of the trees a
round started is :mod:`.book` (``ReplayBook``), kept in :mod:`.checkpoint`.
The executors' side: :mod:`.source_reader` and :mod:`.tree_start`; the
durable pieces: :mod:`.emission_log`, :mod:`.record_table`,
:mod:`.outcome_feed`; record identities: :mod:`.identity`; in-memory sources:
:mod:`.memory_source`. These drivers never import the driver-fed wing.
"""
