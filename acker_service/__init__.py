"""The acker service: Storm's XOR tuple-tree tracking as a sharded gRPC server."""

from . import moved_modules
from ._version import __version__

__all__ = ["__version__"]

moved_modules.install()  # the old paths of modules that moved still import, with a warning naming the new one
