"""The acker service: Storm's XOR tuple-tree tracking as a sharded gRPC server."""

from ._version import __version__

__all__ = ["__version__"]
