"""Compile plugin/api/v1beta1/api.proto into Python with grpcio-tools.

`python -m plugin.api.generate` writes api_pb2.py, api_pb2.pyi and api_pb2_grpc.py beside
the .proto (gitignored: they are build products). `--out DIR` writes the same tree under
DIR instead, which is how the freshness test compares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO = Path("plugin/api/v1beta1/api.proto")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out: Path = REPO) -> list[Path]:
    """Compile the proto; returns the generated files' paths under `out`."""
    from grpc_tools import protoc

    (out / PROTO.parent).mkdir(parents=True, exist_ok=True)
    # The include root is the repository, so the generated grpc module imports
    # `plugin.api.v1beta1.api_pb2` as a package path rather than a bare `api_pb2`.
    args = [
        "grpc_tools.protoc",
        f"-I{REPO}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(REPO / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (command: {' '.join(args[1:])})")
    return [out / PROTO.parent / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO, help="root to write under (default: repo)")
    args = ap.parse_args(argv)
    for path in generate(args.out.resolve()):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
