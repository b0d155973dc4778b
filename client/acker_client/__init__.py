"""Python client for the acker service: cluster client, Storm-style spout and bolt collector."""

from .bolt import BoltCollector
from .cluster import ClientStats, ClusterClient
from .errors import AckerError, ClusterMisconfigured, RequestRefused, ShardFailure, ShardUnavailable, SpoutFull
from .ids import EdgeIdSource, RandomEdgeIds, new_id
from .shared import close_shared_clients, shared_client
from .spout import Spout, SpoutStats
from .tuples import MessageId, TrackedTuple

__all__ = [
    "AckerError",
    "BoltCollector",
    "ClientStats",
    "ClusterClient",
    "ClusterMisconfigured",
    "EdgeIdSource",
    "MessageId",
    "RandomEdgeIds",
    "RequestRefused",
    "ShardFailure",
    "ShardUnavailable",
    "Spout",
    "SpoutFull",
    "SpoutStats",
    "TrackedTuple",
    "close_shared_clients",
    "new_id",
    "shared_client",
]
