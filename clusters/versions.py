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


def kube_versions() -> tuple[str, ...]:
    """The Kubernetes versions `make infra` builds node images for, newest first:
    $GPULAB_KUBE_VERSIONS or the pins; $GPULAB_KUBE_VERSION is added where it is not one."""
    found = listed("KUBE_VERSIONS")
    one = os.environ.get("GPULAB_KUBE_VERSION", "")
    return found if not one or one in found else (one, *found)


def kube_version() -> str:
    """The version labs run unless their spec names one: $GPULAB_KUBE_VERSION (`make e2e
    KUBE=...`), else the newest pinned."""
    return os.environ.get("GPULAB_KUBE_VERSION") or listed("KUBE_VERSIONS")[0]


def kube_minor(version: str) -> int:
    """v1.37.0 -> 37; ValueError for anything not v1.MINOR.PATCH."""
    if not (m := re.fullmatch(r"v1\.(\d+)\.\d+", version)):
        raise ValueError(f"Kubernetes version {version!r} is not v1.MINOR.PATCH")
    return int(m[1])
