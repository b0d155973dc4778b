"""What the acker image ships: the server, not the demo (issue 12)."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import ACKER_IMAGE, _skip_reason

_SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def test_the_server_image_has_no_demo() -> None:
    """acker-demo needs pyspark, which a server image does not install: neither the command nor the package ships."""
    probe = (
        "import importlib.util, shutil, sys; "
        "sys.exit(0 if importlib.util.find_spec('acker_demo') is None and shutil.which('acker-demo') is None else 1)"
    )
    done = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "/opt/acker/bin/python", ACKER_IMAGE, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
