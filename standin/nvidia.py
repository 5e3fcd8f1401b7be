"""NVIDIA's k8s-device-plugin binary, run over fakenvml against the stand-in.

    argv, env = nvidia.command("v0.19.3", kubelet.dir, node.path, workdir)

The binary comes from `make infra` (clusters/infra/scripts/nvidia-plugin.sh, into $GPULAB_CACHE). It
dlopens libnvidia-ml.so.1 from `<container driver root>/usr/lib/x86_64-linux-gnu` first,
so a driver root holding a link to our library is all it needs; its plugin socket path is
compiled in (/var/lib/kubelet/device-plugins), hence the private mount namespace, in which
the driver root's proc/driver also covers /proc/driver (MIG capability minors).
"""

from __future__ import annotations

import os
from pathlib import Path

from clusters import versions as pins
from fakenvml import driver, library, paths
from fakenvml.node import STATE_DIR_ENV
from standin.process import DEFAULT_DIR, in_private_mount, kubelet_env

CACHE = paths.cache_dir() / "nvidia-device-plugin"

# The settings under which the plugin runs on a library alone (no driver files, no
# /dev/nvidia*), options as NVIDIA/k8s-device-plugin's README documents them ("Configuration
# Option Details").
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
    """The versions the suites run, newest first (clusters/versions.env, or
    $GPULAB_NVIDIA_PLUGIN_VERSIONS). v0.20.0 is not served by the Go module proxy here."""
    return pins.nvidia_plugin_versions()


def cached(version: str) -> Path | None:
    path = CACHE / version / "nvidia-device-plugin"
    return path if path.exists() else None


def binary(version: str) -> Path:
    """The binary `make infra` built; RuntimeError naming that command when it is not
    there (tests never build: a cold build takes minutes)."""
    path = cached(version)
    if path is None:
        raise RuntimeError(f"NVIDIA's plugin {version} is not built "
                           f"({CACHE / version}); run `make infra`")  # fmt: skip
    return path


def driver_root(workdir: Path) -> Path:
    """A driver root holding a link to the fake libnvidia-ml.so.1 and the driver's MIG
    capability minors (proc/driver/nvidia-caps/mig-minors), the files the plugin reads."""
    root = workdir / "driver-root"
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True, exist_ok=True)
    link = libdir / library.SONAME
    link.unlink(missing_ok=True)
    link.symlink_to(library.path().resolve())
    driver.write_mig_minors(root)
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
    root = driver_root(workdir)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **SETTINGS,
        # Both v0.17 and v0.20 read this (alias DRIVER_ROOT_CTR_PATH) to find the library.
        "CONTAINER_DRIVER_ROOT": str(root),
        STATE_DIR_ENV: str(state_dir),
        # Inside the namespace the stand-in's dir *is* the default path; say so anyway.
        **kubelet_env(Path(DEFAULT_DIR)),
        **(extra_env or {}),
    }
    argv = in_private_mount(kubelet_dir, [str(binary(version))], root / "proc" / "driver")
    return argv, env


def gfd_binary(version: str) -> Path:
    """gpu-feature-discovery of that release (`make infra`); RuntimeError saying why not:
    not built yet, or the Go module proxy refuses one of its dependencies (v0.17.4)."""
    path = CACHE / version / "gpu-feature-discovery"
    refused = path.with_name(path.name + ".refused")
    if refused.exists():
        raise RuntimeError(f"gpu-feature-discovery {version} cannot be built here: "
                           f"{refused.read_text().strip()}")  # fmt: skip
    if not path.exists():
        raise RuntimeError(f"gpu-feature-discovery {version} is not built ({path}); "
                           "run `make infra`")  # fmt: skip
    return path


def gfd_command(
    version: str, state_dir: Path, root: Path, output: Path, extra_env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a one-shot GFD over the fakenvml node in `state_dir`, with
    the fake driver `root` (`fakenvml.driver.install`): the library on its search path,
    the root's PCI sysfs over /sys/bus/pci/devices in a private mount namespace. Labels
    go to `output` (GFD's own file output, no NodeFeature API)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(root / driver.LIB_DIR),
        STATE_DIR_ENV: str(state_dir),
        "DEVICE_DISCOVERY_STRATEGY": "nvml",
        **(extra_env or {}),
    }
    gfd = [str(gfd_binary(version)), "--oneshot", "--no-timestamp",
           "--use-node-feature-api=false", f"--output-file={output}"]  # fmt: skip
    script = 'mount --bind "$1" /sys/bus/pci/devices && shift && exec "$@"'
    sysfs = str(root / driver.PCI_DEVICES)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", sysfs]
    return argv + gfd, env
