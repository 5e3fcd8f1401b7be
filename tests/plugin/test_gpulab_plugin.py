"""Behaviour only our plugin has, in the node tier (the shared scenarios live in
test_conformance.py)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from fakenvml import library
from fakenvml.node import NodeDir
from standin import Kubelet, gpulab
from standin.process import PluginProcess

R = gpulab.RESOURCE
H100x8 = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 8}]}


def test_faults_from_before_start_are_read_from_nvml(
    kubelet: Kubelet, fake_node: Callable[..., NodeDir],
    run_plugin: Callable[..., PluginProcess], tmp_path: Path,
) -> None:  # fmt: skip
    """A GPU the driver wants reset before the plugin starts is listed Unhealthy from the
    first ListAndWatch (no event will say so again); a GPU already lost has no identity
    NVML will give, so it is not advertised at all."""
    node = fake_node(H100x8)
    node.lose(2)
    node.inject_xid(5, 48)  # double-bit ECC Xid: the driver asks for a GPU reset
    uuids = [g.uuid for g in node.node().gpus]
    run_plugin(*gpulab.command(kubelet.dir, node.path, tmp_path))
    res = kubelet.wait_health(R, [uuids[5]], timeout=30)
    assert sorted(res.devices) == sorted(u for i, u in enumerate(uuids) if i != 2)


def test_sighup_restarts_and_keeps_what_nvml_says(
    kubelet: Kubelet, fake_node: Callable[..., NodeDir],
    run_plugin: Callable[..., PluginProcess], tmp_path: Path,
) -> None:  # fmt: skip
    node = fake_node(H100x8)
    uuids = [g.uuid for g in node.node().gpus]
    plugin = run_plugin(*gpulab.command(kubelet.dir, node.path, tmp_path))
    kubelet.wait_devices(R, 8, timeout=30)
    gpulab.ready(plugin)
    node.inject_xid(4, 79)
    kubelet.wait_health(R, [uuids[4]])
    plugin.signal(signal.SIGHUP)
    kubelet.wait_registered(R, count=2, timeout=30)
    res = kubelet.wait_health(R, [uuids[4]], after=kubelet.resource(R).updates - 1)
    assert len(res.devices) == 8


def test_a_sighup_while_it_registers_restarts_it(
    kubelet: Kubelet, fake_node: Callable[..., NodeDir],
    run_plugin: Callable[..., PluginProcess], tmp_path: Path,
) -> None:  # fmt: skip
    """A SIGHUP that lands before its Register call returns (the kubelet lists its devices
    first) still restarts it: once in CI the end of the start wiped such a signal."""
    node = fake_node(H100x8)
    started: list[PluginProcess] = []
    kubelet.before_next_answer(lambda _resource: started[0].signal(signal.SIGHUP))
    started.append(run_plugin(*gpulab.command(kubelet.dir, node.path, tmp_path)))
    kubelet.wait_registered(R, count=2, timeout=30)
    # The second Register is answered before its ListAndWatch's first list arrives (a CI
    # run read the resource in between: 0 devices), so the list is its own wait.
    assert len(kubelet.wait_devices(R, 8, timeout=30).devices) == 8
    started[0].wait_log('Received signal "SIGHUP", restarting.', timeout=5)


def test_sigterm_stops_it_with_status_0_and_takes_its_socket_away(
    kubelet: Kubelet, fake_node: Callable[..., NodeDir],
    run_plugin: Callable[..., PluginProcess], tmp_path: Path,
) -> None:  # fmt: skip
    """What a pod's stop sends: it exits 0, its own socket gone (the kubelet's is not its)."""
    node = fake_node(H100x8)
    plugin = run_plugin(*gpulab.command(kubelet.dir, node.path, tmp_path))
    kubelet.wait_devices(R, 8, timeout=30)
    gpulab.ready(plugin)
    own = {p for p in kubelet.dir.glob("*.sock") if p.name != "kubelet.sock"}
    assert own, sorted(kubelet.dir.iterdir())
    assert plugin.stop() == 0, plugin.log_tail()
    assert not [p for p in own if p.exists()]


def test_it_waits_for_the_driver_library_and_then_serves(
    kubelet: Kubelet, fake_node: Callable[..., NodeDir],
    run_plugin: Callable[..., PluginProcess], tmp_path: Path,
) -> None:  # fmt: skip
    """A plugin pod may start before the driver's: with --wait-for-nvml it waits for
    libnvidia-ml.so.1 itself (the chart has no init container for it) and serves once the
    library is there."""
    node = fake_node(H100x8)
    # Not even the directory yet, as in a driver root the driver's pod has not filled:
    # glibc then never searches it again for a dlopen by name (a CI run's chart test).
    lib_dir = tmp_path / "driver-root" / "lib"
    argv, env = gpulab.command(kubelet.dir, node.path, tmp_path)
    plugin = run_plugin([*argv, "--wait-for-nvml", "30"], {**env, "LD_LIBRARY_PATH": str(lib_dir)})
    plugin.wait_log("No libnvidia-ml.so.1 yet; waiting up to 30s", timeout=30)
    assert plugin.poll() is None
    lib_dir.mkdir(parents=True)
    (lib_dir / "libnvidia-ml.so.1").symlink_to(library.path())
    assert len(kubelet.wait_devices(R, 8, timeout=30).devices) == 8


def test_without_the_library_it_fails_after_its_wait_and_stops_at_once_within_it(
    kubelet: Kubelet, run_plugin: Callable[..., PluginProcess], tmp_path: Path
) -> None:
    """Past its wait it exits 1 saying why (the kubelet restarts it); a SIGTERM during the
    wait ends it with 0, as a stop of a serving plugin does."""
    argv, env = gpulab.command(kubelet.dir, tmp_path / "no-node", tmp_path)
    env = {**env, "LD_LIBRARY_PATH": str(tmp_path / "no-driver")}
    failing = run_plugin([*argv, "--wait-for-nvml", "0.3"], env)
    assert failing.wait_exit(timeout=30) == 1
    failing.wait_log("Failed to initialize NVML: NVML Shared Library Not Found")
    waiting = run_plugin([*argv, "--wait-for-nvml", "60"], env)
    waiting.wait_log("waiting up to 60s for the driver", timeout=30)
    assert waiting.stop() == 0, waiting.log_tail()
    assert R not in kubelet.resources


def test_a_plugin_directory_too_long_for_its_socket_exits_2_in_one_line(
    fake_node: Callable[..., NodeDir], tmp_path: Path
) -> None:
    """The kubelet's directory is short; one past what a Unix socket path takes (107 bytes
    with the socket's name) is refused before any socket is made."""
    node = fake_node(H100x8)
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    argv, env = gpulab.command(deep, node.path, tmp_path)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert lines[-1].startswith("gpulab-plugin: error: ") and "at most 107" in lines[-1]
    assert [ln for ln in lines if "error" in ln.lower()] == [lines[-1]]
    assert list(deep.iterdir()) == []
