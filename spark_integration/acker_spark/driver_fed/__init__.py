"""The driver-fed wing: ``GuaranteedPipeline`` runs RDD jobs over arbitrary Python values the driver emits.

:mod:`.pipeline` (``GuaranteedPipeline``), :mod:`.replaying_spout` (its
spout), :mod:`.replays` (the replay schedule) and :mod:`.isolation` (replaying
a failed job's records in halves until the one that raises runs alone). It
may use the package's shared modules and the steps; nothing outside it
imports it but the package's public names.
"""
