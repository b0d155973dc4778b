"""acker-cluster: run n acker shard processes on this machine with one consistent shard layout (development, tests, demos).

A tool beside the client library, not part of it: it needs the ``[server]``
extra to start ackers. :class:`ProcessCluster` is the class the demo, the
benchmark and ``acker_client.testing.local_cluster(processes=True)`` use.
"""

from .cluster import ClusterError, ProcessCluster

__all__ = ["ClusterError", "ProcessCluster"]
