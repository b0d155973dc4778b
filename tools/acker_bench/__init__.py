"""acker-bench: drive an acker cluster with synthetic tuple trees and report throughput, latency and server cost.

A tool beside the client library (needs the ``[tools]`` extra): ``cli`` runs
spouts and bolts through :class:`acker_client.ClusterClient`, ``apply`` sends
raw batches straight to the Apply RPC and measures memory per pending tree.
"""
