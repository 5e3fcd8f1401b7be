"""Our plugin as a node-tier subject: the argv and environment that run `gpulab-plugin`
over a fakenvml node, registering with the stand-in's directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fakenvml import library
from fakenvml.node import STATE_DIR_ENV
from plugin.health import READY_LINE
from standin.process import PluginProcess

RESOURCE = "nvidia.com/gpu"


def command(
    kubelet_dir: Path,
    state_dir: Path,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    config: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, "-m", "plugin.main", "--device-plugin-path", str(kubelet_dir)]
    if config is not None:
        path = workdir / "gpulab-plugin.yaml"
        path.write_text(config)
        argv += ["--config", str(path)]
    env = {
        **os.environ,
        # pynvml loads libnvidia-ml.so.1 by name: the fake one, from its build directory.
        "LD_LIBRARY_PATH": str(library.path().parent),
        STATE_DIR_ENV: str(state_dir),
        **(extra_env or {}),
    }
    return argv, env


def ready(proc: PluginProcess) -> None:
    """Its health loop has registered every GPU and waits on NVML events."""
    proc.wait_log(READY_LINE, timeout=30)
