"""Print the Debian mirror this machine's apt uses, for debootstrap to build the local base image.

The mirror is read from the host's apt configuration (``/etc/apt/sources.list`` in
one-line format and ``/etc/apt/sources.list.d/*.list`` / ``*.sources`` in deb822
format) instead of being written into the repository: a build machine behind a
local mirror uses that mirror, and no host name is committed.

Usage: ``python3 debian_mirror.py [--suite bookworm] [--root /]``. Exit status 1
with a message on stderr when no enabled ``deb`` entry serves the suite.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Entry", "entries", "find_mirror", "main"]

Entry = tuple[str, tuple[str, ...]]  # (URI, suites)


def _one_line_entries(text: str) -> Iterator[Entry]:
    """``deb [options] URI suite component...`` lines of a ``.list`` file."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        parts = line.split()
        if len(parts) < 3 or parts[0] != "deb":
            continue  # deb-src, blank, or malformed
        rest = parts[1:]
        if rest[0].startswith("["):
            # Options: "[arch=amd64 signed-by=...]", possibly spread over several words.
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) >= 2:
            yield rest[0], (rest[1],)


def _deb822_entries(text: str) -> Iterator[Entry]:
    """Stanzas of a ``.sources`` file with ``Types: deb`` and not ``Enabled: no``."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0] in " \t" and key:  # a continuation line
                fields[key] += " " + raw.strip()
                continue
            key, _, value = raw.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(fields.get("suites", "").split())
        for uri in fields.get("uris", "").split():
            yield uri, suites


def entries(root: Path = Path("/")) -> Iterator[Entry]:
    """Every enabled binary-package source of the apt configuration under ``root``, in apt's reading order."""
    apt = root / "etc" / "apt"
    main_list = apt / "sources.list"
    if main_list.is_file():
        yield from _one_line_entries(main_list.read_text())
    parts = apt / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".list":
                yield from _one_line_entries(path.read_text())
            elif path.suffix == ".sources":
                yield from _deb822_entries(path.read_text())


def find_mirror(suite: str, root: Path = Path("/")) -> str | None:
    """The URI of the first source serving ``suite`` itself (not ``suite-updates`` or ``suite-security``)."""
    for uri, suites in entries(root):
        if suite in suites:
            return uri.rstrip("/")
    return None


def main(argv: list[str] | None = None) -> int:
    """Print the mirror for ``--suite``; 1 with a message when none is configured."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="bookworm", help="Debian suite the base image is built from")
    parser.add_argument("--root", type=Path, default=Path("/"), help="file system root holding etc/apt")
    args = parser.parse_args(argv)
    mirror = find_mirror(args.suite, args.root)
    if mirror is None:
        print(
            f"debian_mirror: no enabled 'deb' source for suite {args.suite!r} in {args.root / 'etc/apt'}; "
            "add one, or set DEBIAN_MIRROR",
            file=sys.stderr,
        )
        return 1
    print(mirror)
    return 0


if __name__ == "__main__":
    sys.exit(main())
