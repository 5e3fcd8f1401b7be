"""NVML in a workload container (fakenvml/persistenced.py, src/state.c): the state handed
over on the nvidia-persistenced socket NVIDIA's CDI specs mount, and only the GPUs whose
/dev/nvidia<minor> the container has, renumbered from 0, as the real driver shows them.

A container is what the test makes of a child process with `unshare --mount`: tmpfs over
/run, /dev and /var/lib (no state directory, no other GPU's device node), the daemon's
socket bound at /run/nvidia-persistenced/socket and the device nodes a CDI spec would
create. NVIDIA's real nvidia-smi (535 and 550) runs there with the library under test,
without FAKENVML_STATE_DIR.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakenvml import driver, library, mig, persistenced
from fakenvml.node import STATE_DIR_ENV, NodeDir

from .test_nvidia_smi import gpus, legacy_bus_id

NODE = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 4}]}
SANITIZER_ENV = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")
CONTAINER = r"""
set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /run
mkdir -p /run/nvidia-persistenced
if [ -n "$SOCK" ]; then
  touch /run/nvidia-persistenced/socket
  mount --bind "$SOCK" /run/nvidia-persistenced/socket
fi
mount -t tmpfs tmpfs /dev
mknod -m 666 /dev/null c 1 3
for m in $MINORS; do mknod -m 666 /dev/nvidia$m c 195 $m; done
mkdir /dev/nvidia-caps
for m in $CAPS; do mknod -m 444 /dev/nvidia-caps/nvidia-cap$m c 508 $m; done
mount -t tmpfs tmpfs /var/lib
exec "$@"
"""


@pytest.fixture
def node(make_state: Callable[..., NodeDir], monkeypatch: pytest.MonkeyPatch) -> NodeDir:
    d = make_state(NODE)
    monkeypatch.delenv(STATE_DIR_ENV)  # a container has no such variable
    return d


def started(root: Path, state_dir: Path, ready: Path) -> subprocess.Popen[bytes]:
    """`fakenvml persistenced` on driver root `root`, once it listens."""
    proc = subprocess.Popen(
        ["python3", "-m", "fakenvml", "persistenced", str(root), "--state-dir", str(state_dir),
         "--ready", str(ready)], env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, "fakenvml persistenced exited"
            assert time.monotonic() < deadline, "fakenvml persistenced never listened"
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


@contextlib.contextmanager
def serving(root: Path, state_dir: Path, ready: Path) -> Iterator[Path]:
    """`fakenvml persistenced` on driver root `root`, until the block ends: its socket."""
    proc = started(root, state_dir, ready)
    try:
        yield persistenced.socket_path(root)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def daemon(node: NodeDir, tmp_path: Path) -> Iterator[Path]:
    with serving(tmp_path / "driver-root", node.path, tmp_path / "listening") as sock:
        yield sock


def in_container(
    cmd: list[str], sock: Path | None, minors: list[int], caps: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(library.path().parent),
           "SOCK": str(sock or ""), "MINORS": " ".join(map(str, minors)),
           "CAPS": " ".join(map(str, caps))}  # fmt: skip
    # The sanitizer tier's runtime and options (make test-asan), as for every child there.
    env |= {k: v for k, v in os.environ.items() if k in SANITIZER_ENV}
    return subprocess.run(["unshare", "--mount", "sh", "-c", CONTAINER, "sh", *cmd],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_container_sees_only_its_gpus_renumbered(
    nvidia_smi: Path, node: NodeDir, daemon: Path
) -> None:
    g = gpus(node)
    res = in_container([str(nvidia_smi), "-L"], daemon, [g[2].minor, g[3].minor])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [f"GPU 0: {g[2].name} (UUID: {g[2].uuid})",
                                       f"GPU 1: {g[3].name} (UUID: {g[3].uuid})"]  # fmt: skip
    res = in_container([str(nvidia_smi), "-i", "1", "--query-gpu=index,uuid,pci.bus_id",
                        "--format=csv,noheader"], daemon, [g[2].minor, g[3].minor])  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().upper() == f"1, {g[3].uuid}, {g[3].bus_id}".upper()


def test_a_container_sees_only_the_mig_devices_whose_capabilities_it_has(
    nvidia_smi: Path, node: NodeDir, daemon: Path
) -> None:
    """Two MIG devices on one GPU; the container has the GPU's node and one device's
    GPU-instance and compute-instance access nodes (what a CDI spec or a device plugin
    hands it with that device): the GPU and that MIG device alone, as the driver shows."""
    mig.configure(node, 1, "3g.40gb,1g.10gb")
    g, devices = gpus(node), mig.devices(node)
    assert len(devices) == 2
    for want in devices:
        caps = (driver.cap_minor(g[1].minor, want.gi),
                driver.cap_minor(g[1].minor, want.gi, want.ci))  # fmt: skip
        res = in_container([str(nvidia_smi), "-L"], daemon, [g[1].minor], caps)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == f"GPU 0: {g[1].name} (UUID: {g[1].uuid})"
        assert len(lines) == 2 and lines[1].endswith(f"(UUID: {want.uuid})"), lines
    # The GPU-instance node alone is not enough.
    caps = (driver.cap_minor(g[1].minor, devices[0].gi),)
    res = in_container([str(nvidia_smi), "-L"], daemon, [g[1].minor], caps)
    assert res.stdout.splitlines() == [f"GPU 0: {g[1].name} (UUID: {g[1].uuid})"]


def test_another_containers_gpu_is_not_found_by_uuid_or_bus_id(
    nvidia_smi: Path, node: NodeDir, daemon: Path
) -> None:
    g = gpus(node)
    for other in (g[0].uuid, legacy_bus_id(g[0])):
        res = in_container([str(nvidia_smi), "-i", other, "-L"], daemon, [g[1].minor])
        assert res.returncode != 0, res.stdout
        assert g[0].uuid not in res.stdout


def test_faults_reach_the_container_through_the_socket(
    nvidia_smi: Path, node: NodeDir, daemon: Path
) -> None:
    """The descriptor is the node's state directory itself: a fault injected on the node
    after the daemon started is what the container's NVML answers."""
    g = gpus(node)
    node.lose(1)
    res = in_container([str(nvidia_smi), "-L"], daemon, [g[1].minor])
    assert "GPU is lost" in res.stdout + res.stderr


def test_without_the_socket_nvml_has_no_driver(nvidia_smi: Path, node: NodeDir) -> None:
    res = in_container([str(nvidia_smi), "-L"], None, [0])
    assert res.returncode != 0
    assert "couldn't communicate with the NVIDIA driver" in res.stdout


def test_the_daemon_exits_cleanly_on_sigterm(node: NodeDir, tmp_path: Path) -> None:
    """A stop asks with SIGTERM: the daemon exits 0, not by the default action (-15), which
    the kernel never takes for the chart pod's PID 1."""
    proc = started(tmp_path / "root", node.path, tmp_path / "listening")
    try:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_daemon_without_state_says_so_in_one_line(tmp_path: Path) -> None:
    res = subprocess.run(
        ["python3", "-m", "fakenvml", "persistenced", str(tmp_path / "root"), "--state-dir",
         str(tmp_path / "none")], capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        f"fakenvml persistenced: no state in {tmp_path / 'none'} (run `fakenvml init`)"
    ]
    assert not (tmp_path / "root").exists()


def test_a_root_where_no_socket_can_be_made_is_one_line(node: NodeDir, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("a file, not a directory")
    res = subprocess.run(
        ["python3", "-m", "fakenvml", "persistenced", str(root), "--state-dir", str(node.path)],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        f"fakenvml persistenced: cannot listen on {persistenced.socket_path(root)}: Not a directory"
    ]


def test_a_driver_root_past_the_socket_path_limit_is_served(
    nvidia_smi: Path, node: NodeDir, tmp_path: Path
) -> None:
    """A socket path holds 107 bytes; the daemon binds through its directory instead."""
    root = tmp_path / ("deep-" * 20) / "driver-root"
    with serving(root, node.path, tmp_path / "listening") as sock:
        assert len(str(sock)) > 107
        g = gpus(node)
        res = in_container([str(nvidia_smi), "-L"], sock, [g[0].minor])
        assert res.stdout.splitlines() == [f"GPU 0: {g[0].name} (UUID: {g[0].uuid})"], res.stderr
