"""acker-demo: the word-count job with tracking, injected failures and replays, on local ackers and local Spark.

A tool beside the Spark integration (needs the ``[tools]`` and ``[spark]``
extras): ``wordcount`` holds the job's bolts, sink and expected counts, ``cli``
the command that runs it and prints what happened.
"""
