"""Bounded echoes of client input in error messages and logs.

A status message travels in the response trailers, where gRPC limits metadata
to a few KiB: echoing a 64 KiB spout name made the refusal itself fail on the
client ("received metadata size exceeds hard limit"). Everything a client sent
is therefore clipped before it is quoted back.
"""

from __future__ import annotations

__all__ = ["clip", "MAX_ECHO_CHARS"]

# Enough to recognise a name, far below any metadata limit.
MAX_ECHO_CHARS = 64


def clip(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)``, cut to about ``limit`` characters with the original length noted when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:limit]}... ({size} characters in all)"
