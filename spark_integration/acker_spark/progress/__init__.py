"""A run's progress: its figures, how they are shown while it runs, and what the driver publishes for them.

:mod:`.figures` (a run's progress figures and ``progress.json``),
:mod:`.display` (the bar, the log line and the file, on a thread of their own)
and :mod:`.driver_progress` (the driver's side: the baseline it publishes
between Spark jobs, its progress line while it waits, ``on_progress``).
"""
