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


def kubelet_versions() -> tuple[str, ...]:
    """The older kubelets `make infra` builds worker images of, newest first:
    $GPULAB_KUBELET_VERSIONS or the pins; $GPULAB_KUBELET_VERSION is added where it is not
    one."""
    found = listed("KUBELET_VERSIONS")
    one = os.environ.get("GPULAB_KUBELET_VERSION", "")
    return found if not one or one in found else (one, *found)


# The version-skew policy: a kubelet may be up to three minors older than its API server,
# never newer (kubernetes.io/releases/version-skew-policy).
KUBELET_SKEW = 3


def kubelet_version(control_plane: str, pinned: str | None = None) -> str:
    """The kubelet a lab's workers and GPU nodes run beside a control plane of
    `control_plane`: `pinned` (a lab spec's `kubelet`), else $GPULAB_KUBELET_VERSION (`make
    e2e KUBELET=...`), else the control plane's own. ValueError for one the skew policy does
    not allow."""
    kubelet = pinned or os.environ.get("GPULAB_KUBELET_VERSION") or control_plane
    behind = kube_minor(control_plane) - kube_minor(kubelet)
    if not 0 <= behind <= KUBELET_SKEW:
        raise ValueError(
            f"kubelet {kubelet} beside a {control_plane} control plane: the version-skew "
            f"policy allows a kubelet 0 to {KUBELET_SKEW} minors older than its API server"
        )
    return kubelet


def skewed_kubelets(control_plane: str) -> list[str]:
    """The pinned older kubelets the skew policy allows beside `control_plane`: those
    `make infra` makes worker images of."""
    return [k for k in kubelet_versions()
            if 0 < kube_minor(control_plane) - kube_minor(k) <= KUBELET_SKEW]  # fmt: skip


def describe(control_plane: str | None = None, pinned: str | None = None) -> str:
    """v1.37.0, or v1.37.0 (kubelet v1.34.0) where the workers' kubelet is older; the run's
    versions unless a control plane (and a lab's kubelet) is named."""
    control_plane = control_plane or kube_version()
    kubelet = kubelet_version(control_plane, pinned)
    return control_plane + (f" (kubelet {kubelet})" if kubelet != control_plane else "")


def node_image_key(control_plane: str, kubelet: str | None = None) -> str:
    """Which node image a node runs, as `make infra` records it: the control plane's
    version, or `<version>+kubelet-<older>` for a worker image with an older kubelet."""
    if kubelet in (None, control_plane):
        return control_plane
    return f"{control_plane}+kubelet-{kubelet}"


def kube_minor(version: str) -> int:
    """v1.37.0 -> 37; ValueError for anything not v1.MINOR.PATCH."""
    if not (m := re.fullmatch(r"v1\.(\d+)\.\d+", version)):
        raise ValueError(f"Kubernetes version {version!r} is not v1.MINOR.PATCH")
    return int(m[1])
