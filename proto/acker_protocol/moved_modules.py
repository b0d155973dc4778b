"""Old module paths that still import for one release: a moved one warns and names its new path, a removed one says what replaces it.

Each package of the project (``acker_spark``, ``acker_service``) keeps its own
tables in its ``moved_modules`` module and installs a :class:`MovedModules`
built from them when it is imported. For an old path of ``moved`` the finder
emits a :class:`DeprecationWarning` naming the new path and binds the old name
to the very module object at the new path (one module, not a copy: classes,
``isinstance`` checks and module state are shared). A path of ``removed`` (or
any module under it) fails with a :class:`ModuleNotFoundError` that says what
replaces it. Every other name is left to the normal import system.

The finder goes first on ``sys.meta_path``: a stale copy of a moved or removed
module (an older install, an editable install's finder pointing at another
checkout) must not shadow the answer. It answers only the paths of its
tables, where no real module lives (tests/packaging/test_moved_modules.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = ["MovedModules"]


class _MovedLoader(importlib.abc.Loader):
    """Binds an old path to the module at its new path, with a warning."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """The default: a placeholder that :meth:`exec_module` replaces."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Warn, then bind the old name to the module at the new path (imported now if it was not yet)."""
        old = module.__name__
        # stacklevel 2 reaches the importing line: warnings skips importlib's own frames.
        warnings.warn(
            f"{old} has moved to {self.new}: import it from there ({old} goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns what sys.modules holds for the old name once this returns,
        # so the old name is the new module itself, not a copy of it.
        sys.modules[old] = importlib.import_module(self.new)


class MovedModules(importlib.abc.MetaPathFinder):
    """One package's old paths: ``moved`` (old -> new path) and ``removed`` (path -> what to use instead)."""

    def __init__(self, moved: Mapping[str, str], removed: Mapping[str, str] | None = None) -> None:
        self.moved = dict(moved)
        self.removed = dict(removed or {})

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for a moved path; ModuleNotFoundError for a removed one; None for any other name."""
        new = self.moved.get(fullname)
        if new is not None:
            return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))
        for old, instead in self.removed.items():
            if fullname == old or fullname.startswith(old + "."):
                raise ModuleNotFoundError(f"No module named {fullname!r}: {instead}", name=fullname)
        return None

    def install(self) -> None:
        """Put this finder at the front of ``sys.meta_path``, once."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
