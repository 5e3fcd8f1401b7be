"""NVIDIA's k8s-device-plugin binary, run over fakenvml against the stand-in.

    argv, env = nvidia.command("v0.19.3", kubelet.dir, node.path, workdir)

The binary comes from ci/nvidia-plugin.sh (built once into a cache outside the repo). It
dlopens libnvidia-ml.so.1 from `<container driver root>/usr/lib/x86_64-linux-gnu` first,
so a driver root holding a link to our library is all it needs; its plugin socket path is
compiled in (/var/lib/kubelet/device-plugins), hence the private mount namespace.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fakenvml import library
from fakenvml.node import STATE_DIR_ENV
from plugin.standin.process import DEFAULT_DIR, in_private_mount, kubelet_env

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "ci" / "nvidia-plugin.sh"
CACHE = Path(os.environ.get("GPULAB_CACHE", "/var/cache/gpulab")) / "nvidia-device-plugin"

# Newest first. Keep in step with VERSIONS in ci/nvidia-plugin.sh. v0.20.0 is not served
# by the Go module proxy this lab can reach; see that script for building it from a clone.
VERSIONS: tuple[str, ...] = ("v0.19.3", "v0.17.4")
VERSIONS_ENV = "GPULAB_NVIDIA_PLUGIN_VERSIONS"  # e.g. "v0.20.0,v0.17.4" overrides

# The settings under which the plugin runs on a library alone (no driver files, no
# /dev/nvidia*): see shared/design/FACTS.md.
SETTINGS = {
    "DEVICE_LIST_STRATEGY": "envvar",
    "PASS_DEVICE_SPECS": "false",
    "MIG_STRATEGY": "none",
    "FAIL_ON_INIT_ERROR": "true",
    "DEVICE_DISCOVERY_STRATEGY": "nvml",
}
RESOURCE = "nvidia.com/gpu"
SOCKET = "nvidia-gpu.sock"


def versions() -> tuple[str, ...]:
    """The versions the suites run: $GPULAB_NVIDIA_PLUGIN_VERSIONS, else VERSIONS."""
    given = os.environ.get(VERSIONS_ENV, "")
    return tuple(v.strip() for v in given.split(",") if v.strip()) or VERSIONS


def cached(version: str) -> Path | None:
    path = CACHE / version / "nvidia-device-plugin"
    return path if path.exists() else None


def binary(version: str) -> Path:
    """The cached binary, built by ci/nvidia-plugin.sh first when it is missing."""
    path = cached(version)
    if path is None:
        # Progress goes to our stderr: a cold build takes minutes and should say so.
        done = subprocess.run(
            [str(BUILD_SCRIPT), version], stdout=subprocess.PIPE, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"ci/nvidia-plugin.sh {version} failed (exit {done.returncode}); "
                "its output above says why"
            )
        path = Path(done.stdout.strip().splitlines()[-1])
    return path


def driver_root(workdir: Path) -> Path:
    """A driver root whose only driver file is a link to the fake libnvidia-ml.so.1."""
    root = workdir / "driver-root"
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True, exist_ok=True)
    link = libdir / library.SONAME
    link.unlink(missing_ok=True)
    link.symlink_to(library.path().resolve())
    return root


def command(
    version: str,
    kubelet_dir: Path,
    state_dir: Path,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run NVIDIA's plugin `version` over the fakenvml node in
    `state_dir`, registering with the stand-in serving `kubelet_dir`."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **SETTINGS,
        # Both v0.17 and v0.20 read this (alias DRIVER_ROOT_CTR_PATH) to find the library.
        "CONTAINER_DRIVER_ROOT": str(driver_root(workdir)),
        STATE_DIR_ENV: str(state_dir),
        # Inside the namespace the stand-in's dir *is* the default path; say so anyway.
        **kubelet_env(Path(DEFAULT_DIR)),
        **(extra_env or {}),
    }
    return in_private_mount(kubelet_dir, [str(binary(version))]), env
