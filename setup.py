"""Build hook: the native ledger needs cargo; without it, say how to install Rust (not setuptools-rust's generic hint).

Everything else about the build is in pyproject.toml. setuptools-rust's own
error, when cargo is missing, suggests a prebuilt wheel may exist; none does
for pyspark-acker, so this names the fix instead, before the build starts.
"""

import os
import shutil
import sys

from setuptools import setup

# The setuptools commands that compile the extension (metadata and sdists need no cargo).
_BUILDS = {"bdist_wheel", "editable_wheel", "build_ext", "build_rust", "build", "develop", "install"}

RUST_MISSING = """\
pyspark-acker: building the native ledger (acker_service/native, Rust) needs cargo, which is not on PATH.
There is no prebuilt wheel: install a Rust toolchain, then build again:
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh    # rustup.rs; then open a new shell
  (or on Debian/Ubuntu: sudo apt-get install cargo)
"""

if _BUILDS.intersection(sys.argv[1:]) and not (os.environ.get("CARGO") or shutil.which("cargo")):
    sys.exit(RUST_MISSING)

setup()
