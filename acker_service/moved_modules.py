"""Old module paths of acker_service, still importable for one release: each import warns and names the new path.

When the layout changes, the handoffs and the catch-up went into
:mod:`acker_service.moving`, code importing them by their old paths (tests,
tools, a user's script) keeps running for a release and says what to change.
:data:`MOVED` maps each old path to its new one; :func:`install` (run by
``import acker_service``) puts a finder on ``sys.meta_path`` that, for an old
path only, emits a :class:`DeprecationWarning` naming the new path and binds the
old name to the very module object at the new path (one module, not a copy).
Everything else is left to the normal import system. CHANGELOG.md lists the
same moves; an entry leaves this table one release after it was added.
(``acker_spark.moved_modules`` does the same for acker_spark.)
"""

from __future__ import annotations

from acker_protocol.moved_modules import MovedModules

__all__ = ["MOVED", "install"]

# Old path -> new path. Moved when the moving wing (layout changes, handoffs, catch-up) got its folder.
MOVED: dict[str, str] = {
    f"acker_service.{name}": f"acker_service.moving.{name}"
    for name in (
        "catchup",
        "catchup_peer",
        "held",
        "layout",
        "layout_file",
        "peers",
        "request_parts",
        "reshard",
        "transfers",
    )
}

_FINDER = MovedModules(MOVED)


def install() -> None:
    """Make the old paths of :data:`MOVED` answer (once); the finder is :mod:`acker_protocol.moved_modules`'s."""
    _FINDER.install()
