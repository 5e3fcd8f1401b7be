"""Behaviour only our plugin has, in the node tier (the shared scenarios live in
test_conformance.py)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

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
    res = kubelet.wait_registered(R, count=2, timeout=30)
    assert len(res.devices) == 8
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
