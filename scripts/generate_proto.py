"""Regenerate the committed protobuf/gRPC modules and typed stubs from proto/.

Usage: python scripts/generate_proto.py [OUTPUT_ROOT]

OUTPUT_ROOT defaults to proto/, so the modules land next to the .proto file in
proto/acker_protocol/v1/ (the Python import path follows the file's path under
proto/). The staleness test generates into a temporary directory and
compares with the committed files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PROTO_FILES = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))


def generate(output_root: Path) -> None:
    """Run protoc with the Python, gRPC and mypy-protobuf plugins into output_root."""
    output_root.mkdir(parents=True, exist_ok=True)
    # protoc finds the mypy-protobuf plugins on PATH; they live next to this
    # interpreter in a virtualenv that is not activated.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={output_root}",
        f"--grpc_python_out={output_root}",
        f"--mypy_out={output_root}",
        f"--mypy_grpc_out={output_root}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
