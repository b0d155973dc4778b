"""The tracking layer under the drivers: what a run keeps of every record, whichever driver runs it.

``SourcePipeline`` (:mod:`acker_spark.executor_read`), the ``acker_spout``
stream's planner (:mod:`acker_spark.streaming`) and the queue planner
(:mod:`acker_spark.queues`) all keep their records here: the durable
checkpoint (:mod:`.checkpoint`), the tasks' emission log (:mod:`.emission_log`),
the record table (:mod:`.record_table`) and the book that settles it from the
outcomes (:mod:`.book`, :mod:`.round_tally`), the outcome feed that journals
them (:mod:`.outcome_feed`), a record's identity (:mod:`.identity`) and the
start of its tree (:mod:`.tree_start`, :mod:`.init_sender`). Nothing here
imports a driver.
"""
