"""Fixtures for the fakenvml suite: state directories built from inventories, and the
official nvidia-ml-py bindings bound to the library under test.

The library under test is $FAKENVML_LIBRARY (the sanitizer run points it at build/asan),
else build/release. pynvml binds one library per process, so every test initialises NVML
against its own state directory and shuts it down afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

# pynvml binds its library at the first nvmlInit, not at import: preloading in a fixture
# is early enough, and tests that need no library (inventory, CLI) never load it.
import pynvml
import pytest

from clusters import versions
from fakenvml import inventory, library, paths
from fakenvml.model import Node
from fakenvml.node import STATE_DIR_ENV, NodeDir

# Every NVML function a test reaches through pynvml, recorded at the one place pynvml
# resolves symbols, so test_api can prove each implemented function was exercised.
CALLED: set[str] = set()
_resolve = pynvml._nvmlGetFunctionPointer


def _recording(name: str):  # type: ignore[no-untyped-def]
    CALLED.add(name)
    return _resolve(name)


pynvml._nvmlGetFunctionPointer = _recording
pynvml._nvmlGetFunctionPointer_cache.clear()


def build_node(spec: dict, name: str = "node-a") -> Node:
    return inventory.from_dict(spec, name)


H100x8 = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 8}]}


@pytest.fixture
def make_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., NodeDir]:
    """make_state(spec) writes a node's state and points the library's env at it."""

    def make(spec: dict | None = None, name: str = "node-a") -> NodeDir:
        d = NodeDir(tmp_path / name)
        d.init(build_node(spec or H100x8, name))
        monkeypatch.setenv(STATE_DIR_ENV, str(d.path))
        return d

    return make


@pytest.fixture
def state(make_state: Callable[..., NodeDir]) -> NodeDir:
    return make_state()


@pytest.fixture(scope="session")
def fake_library() -> object:
    return library.preload()


@pytest.fixture
def nvml(fake_library: object, state: NodeDir) -> Iterator[object]:
    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def subprocess_env(state_dir: Path) -> dict[str, str]:
    """Environment for a child process that loads the same library and state."""
    env = dict(os.environ)
    env[STATE_DIR_ENV] = str(state_dir)
    env[library.LIBRARY_ENV] = str(library.path())
    return env


# -- NVIDIA's real nvidia-smi (test_nvidia_smi.py, test_persistenced.py)

# The nvidia-smi packages ci/nvidia-smi.sh fetches (clusters/versions.env): every test that
# runs nvidia-smi runs once with each. A version missing from the cache fails its tests.
PACKAGES = {
    "535": versions.get("NVIDIA_SMI_VERSION"),  # 535.261.03-1, bookworm
    "550": versions.get("NVIDIA_SMI_DRIVER_ROOT_VERSION"),  # 550.163.01-2, trixie
}


def smi_binary(package: str) -> Path:
    return paths.cache_dir() / "nvidia-smi" / package / "nvidia-smi"


@pytest.fixture(scope="session", params=list(PACKAGES.values()), ids=list(PACKAGES))
def package(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def nvidia_smi(package: str) -> Path:
    binary = smi_binary(package)
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} not found: run `make install` (ci/nvidia-smi.sh fetches it)")
    return binary
