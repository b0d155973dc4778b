"""acker-cluster: run n acker shard processes on this machine with one consistent shard layout (development, tests, demos).

A tool, not a library: the command line over :class:`acker_service.process_cluster.ProcessCluster`,
the launcher that the demo, the benchmark and ``acker_client.testing.local_cluster(processes=True)`` use.
``ProcessCluster`` and ``ClusterError`` are re-exported here for existing imports.
"""

from acker_service.process_cluster import ClusterError, ProcessCluster

__all__ = ["ClusterError", "ProcessCluster"]
