"""The steps of a job: bolts over RDDs and DataFrames, their collectors, the ``_acker_ids`` column, leases.

What runs on the executors inside the user's job, whichever driver started the
trees: :mod:`.step` (what every step shares), :mod:`.executor` (``Bolt``),
:mod:`.arrow_bolt` (``ArrowBolt``) with :mod:`.arrow_collector`,
:mod:`.arrow_rows`, :mod:`.rdd_rows` (a tracked DataFrame as an RDD for ``Bolt.apply``), :mod:`.leases`, :mod:`.frames` (the tracking column),
:mod:`.ids` (edge ids and dedup keys) and :mod:`.layout` (the address check).
Steps import no driver.
"""
