"""acker-ctl: look at and act on a running acker cluster (status, inspect, top, fail)."""

from .cli import main

__all__ = ["main"]
