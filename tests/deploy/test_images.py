"""deploy/images: the Debian mirror comes from the host's apt configuration, and the build context stays small."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "deploy" / "images"


@pytest.fixture(scope="module")
def mirror() -> ModuleType:
    """deploy/images/debian_mirror.py as a module (it is a build script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("debian_mirror", IMAGES / "debian_mirror.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _apt(root: Path, files: dict[str, str]) -> Path:
    """An etc/apt tree under `root` holding `files` (paths relative to etc/apt)."""
    for name, text in files.items():
        path = root / "etc" / "apt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_one_line_sources_with_options(mirror: ModuleType, tmp_path: Path) -> None:
    """sources.list lines with [options]; deb-src, comments and other suites are skipped."""
    root = _apt(
        tmp_path,
        {
            "sources.list": "# deb http://commented.example/debian bookworm main\n"
            "deb-src http://src.example/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://security.example/debian-security bookworm-security main\n"
            "deb [ arch=amd64 ] http://mirror.example/debian/ bookworm main contrib\n"
        },
    )
    assert mirror.find_mirror("bookworm", root) == "http://mirror.example/debian"
    assert mirror.find_mirror("trixie", root) is None


def test_deb822_sources_skip_disabled_and_source_stanzas(mirror: ModuleType, tmp_path: Path) -> None:
    """.sources stanzas: Enabled: no and Types: deb-src are skipped; several suites per stanza match."""
    root = _apt(
        tmp_path,
        {
            "sources.list.d/a.sources": "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
            "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n",
            "sources.list.d/b.sources": "Types: deb\nURIs: http://local.example/debian\n"
            "Suites: bookworm bookworm-updates\nComponents: main\n",
        },
    )
    assert mirror.find_mirror("bookworm", root) == "http://local.example/debian"
    assert mirror.find_mirror("bookworm-updates", root) == "http://local.example/debian"


def test_no_source_is_a_clear_error(tmp_path: Path) -> None:
    """Exit 1 naming the suite and DEBIAN_MIRROR when apt has no source for the suite."""
    done = subprocess.run(
        [sys.executable, str(IMAGES / "debian_mirror.py"), "--suite", "bookworm", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "bookworm" in done.stderr and "DEBIAN_MIRROR" in done.stderr


def test_no_mirror_or_registry_host_is_committed() -> None:
    """The image build files name no mirror or registry host: the mirror is read from apt at build time."""
    for path in [IMAGES / "build.sh", IMAGES / "prometheus" / "Dockerfile", REPO / "deploy" / "Dockerfile"]:
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"https?://", text), path
        assert "deb.debian.org" not in text and "docker.io" not in text, path


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    """The root .dockerignore excludes the virtualenv, caches, Rust targets and build output, but not the wheels."""
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()]
    for needed in (".venv", ".git", "**/__pycache__", ".pytest_cache", "target", "build", "dist"):
        assert needed in patterns, needed
    assert "!build/docker/wheels" in patterns
    assert patterns.index("!build/docker/wheels") > patterns.index("build")


def test_the_build_prunes_only_its_own_superseded_images() -> None:
    """Issue 23: build.sh pruned every dangling image with the project's label, other checkouts' included."""
    script = "\n".join(ln for ln in (IMAGES / "build.sh").read_text().splitlines() if not ln.lstrip().startswith("#"))
    prunes = re.findall(r"docker image prune[^\n]*", script)
    assert prunes and all('--filter "label=io.pyspark-acker.build=$BUILD_ID"' in p for p in prunes), prunes
    # The value is this checkout's and these tags', and every build passes it to the Dockerfile.
    (build_id,) = re.findall(r"^BUILD_ID=(.*)$", script, flags=re.M)
    assert all(v in build_id for v in ("$REPO", "$ACKER_IMAGE", "$ACKER_BUILD_STAGE_IMAGE")), build_id
    assert '--build-arg "ACKER_BUILD_ID=$BUILD_ID"' in script
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")[1:]
    assert len(stages) == 2 and all("io.pyspark-acker.build=${ACKER_BUILD_ID}" in stage for stage in stages)
