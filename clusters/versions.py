"""The pinned versions in clusters/versions.env, for Python (bash sources the same file)."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parent / "versions.env"


@cache
def pins() -> dict[str, str]:
    """KEY=VALUE lines (values optionally double-quoted); comments and blanks skipped."""
    out = {}
    for line in ENV_FILE.read_text().splitlines():
        if m := re.fullmatch(r'([A-Z0-9_]+)=("?)(.*)\2', line.strip()):
            out[m[1]] = m[3]
    return out


def get(key: str) -> str:
    try:
        return pins()[key]
    except KeyError:
        raise KeyError(f"{key} is not pinned in {ENV_FILE}") from None


def listed(key: str) -> tuple[str, ...]:
    """A pinned list (comma- or space-separated), or $GPULAB_<key> where set."""
    given = os.environ.get(f"GPULAB_{key}") or get(key)
    return tuple(v for v in re.split(r"[,\s]+", given) if v)


def nvidia_plugin_versions() -> tuple[str, ...]:
    """NVIDIA plugin releases to build and test, newest first: $GPULAB_NVIDIA_PLUGIN_VERSIONS
    (e.g. "v0.20.0,v0.17.4") or the pins."""
    return listed("NVIDIA_PLUGIN_VERSIONS")
