"""The executor-read batch driver: records read by Spark, trees started where they are read.

:mod:`.source_pipeline` (``SourcePipeline``: rounds of Spark jobs over a
DataFrame, options in :mod:`.pipeline_options`, guards in :mod:`.run_guards`)
and what its rounds need: opening the source (:mod:`.source_open`,
:mod:`.memory_source`, :mod:`.redrive_source`), the executors' reading step
(:mod:`.source_reader`), watching a round (:mod:`.round_watch`,
:mod:`.hung_round`), the job's checks (:mod:`.job_check`) and the acks a bolt
could not deliver (:mod:`.undelivered_acks`). What becomes of the trees a
round started is kept by the tracking layer, :mod:`acker_spark.tracking`; the
stream's planning side is :mod:`acker_spark.streaming.stream_planner`.
"""
