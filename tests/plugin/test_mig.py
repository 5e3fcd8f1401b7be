"""MIG in the node tier: NVIDIA's plugin (each pinned release) and ours, with NVIDIA's MIG
strategies, over fakenvml GPUs in MIG mode, driven by the kubelet stand-in.

mixed: GPU 0 all-1g.10gb (7), GPU 1 3g.40gb + 2g.20gb + 1g.10gb: nvidia.com/mig-1g.10gb 8,
mig-2g.20gb 1, mig-3g.40gb 1. single: both GPUs all-1g.10gb: nvidia.com/gpu 14.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusters.subjects import subject as subject_mod
from clusters.subjects.subject import Subject
from fakenvml import driver, library, mig
from fakenvml.node import NodeDir
from standin import Kubelet
from standin.kubelet import StandinError
from standin.process import PluginProcess
from standin.subjects import node_subjects, program

MIG_SUBJECTS = [s for s in node_subjects(subject_mod.shipped()) if s.expects.mig != "none"]
pytestmark = [
    pytest.mark.parametrize("subject", MIG_SUBJECTS, ids=lambda s: s.name),
    pytest.mark.needs("mig"),  # a MIG subject runs only scenarios that need MIG
]
LAYOUT = {"mixed": ["all-1g.10gb", "3g.40gb,2g.20gb,1g.10gb"], "single": ["all-1g.10gb"] * 2}


@dataclass
class Running:
    node: NodeDir
    plugin: PluginProcess
    by_resource: dict[str, list[mig.MigDevice]]


def resources(strategy: str, devices: list[mig.MigDevice]) -> dict[str, list[mig.MigDevice]]:
    """What NVIDIA documents each strategy to advertise, from the fake's own layout."""
    if strategy == "single":
        return {"nvidia.com/gpu": devices}
    out: dict[str, list[mig.MigDevice]] = {}
    for d in devices:
        out.setdefault(f"nvidia.com/mig-{d.profile}", []).append(d)
    return out


@pytest.fixture
def start(
    subject: Subject,
    kubelet: Kubelet,
    fake_node: Callable[..., NodeDir],
    subject_plugin: Callable[..., PluginProcess],
    tmp_path: Path,
) -> Callable[..., Running]:
    """start(device_specs=False): the subject's plugin over two H100s in LAYOUT, every
    resource listed. With device specs, the driver root (its /dev nodes too) is where each
    plugin takes device nodes from: ours by --dev-root, NVIDIA's by PASS_DEVICE_SPECS and
    NVIDIA_DEV_ROOT (standin/subjects.py)."""

    def run(device_specs: bool = False) -> Running:
        strategy = subject.expects.mig
        node = fake_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]})
        for gpu, config in enumerate(LAYOUT[strategy]):
            mig.configure(node, gpu, config)
        root = tmp_path / "driver-root"  # where nvidia.command puts it too
        if device_specs:
            assert driver.install(root, node.node()).no_device_nodes == ""
        # As the subjects' DaemonSets: NVIDIA's v0.17 looks for NVML by name before it uses
        # MIG (ours is given the same path by its command).
        env = {"MIG_STRATEGY": strategy, "LD_LIBRARY_PATH": str(library.path().parent)}
        args: list[str] = []
        how = program(subject)
        if device_specs:
            args, more = how.device_specs(root)
            env |= more
        plugin = subject_plugin(subject, node, env, args)
        want = resources(strategy, mig.devices(node))
        for name, devices in want.items():
            kubelet.wait_devices(name, len(devices), timeout=30)
        how.ready(plugin)
        return Running(node, plugin, want)

    return run


@pytest.fixture
def running(start: Callable[..., Running]) -> Running:
    return start()


def test_each_resource_lists_its_mig_devices_by_uuid(running: Running, kubelet: Kubelet) -> None:
    for name, devices in running.by_resource.items():
        res = kubelet.resource(name)
        assert sorted(res.devices) == sorted(d.uuid for d in devices), name
        assert res.unhealthy == frozenset()
    # Nothing else: no whole-GPU resource beside the MIG ones (every GPU is in MIG mode).
    assert set(kubelet.resources) == set(running.by_resource)


def test_allocate_puts_the_mig_uuids_in_the_env(subject: Subject, running: Running,
                                                kubelet: Kubelet) -> None:  # fmt: skip
    name = next(n for n, d in running.by_resource.items() if len(d) >= 2)
    got = kubelet.admit(name, 2)
    env = got.response.envs[subject.spec.device_ids.env]
    assert sorted(env.split(",")) == sorted(got.devices)
    assert all(u.startswith("MIG-") for u in got.devices)


@pytest.mark.needs("mig_slice_xid=that-slice")
def test_an_xid_on_one_slice_marks_only_that_mig_device(running: Running,
                                                       kubelet: Kubelet) -> None:  # fmt: skip
    name, devices = max(running.by_resource.items(), key=lambda kv: len(kv[1]))
    target = devices[2]
    before = kubelet.resource(name).updates
    running.node.inject_xid(target.gpu, 79, target.gi, target.ci)
    kubelet.wait_health(name, {target.uuid}, after=before, timeout=15)


def test_an_xid_on_every_slice_of_a_gpu(subject: Subject, running: Running,
                                        kubelet: Kubelet) -> None:  # fmt: skip
    """Ours marks each slice its Xid names; NVIDIA's keeps one slice per GPU (and resource)
    in its event map and drops the Xids of the others: exactly one goes Unhealthy."""
    name, devices = max(running.by_resource.items(), key=lambda kv: len(kv[1]))
    gpu0 = [d for d in devices if d.gpu == 0]
    others = {d.uuid for d in gpu0}
    slice_only = subject.expects.mig_slice_xid == "that-slice"

    def marked() -> object:
        res = kubelet.resources.get(name)
        if slice_only:
            return res if res and others <= res.unhealthy else None
        return res if res and res.unhealthy - others and res.unhealthy & others else None

    # A plugin's health loop registers for events a moment after it serves its devices;
    # Xids before that are missed, as on hardware (CI once saw NVIDIA's v0.17.4 miss all
    # of them: 0 unhealthy after 15 s). So the Xids go again every 3 s until they show:
    # repeats change nothing once seen (a marked slice stays marked). For NVIDIA's, a
    # sentinel on GPU 1 (whole GPU: its one kept slice) shows the Xids before it were read.
    deadline = time.monotonic() + 30
    while True:
        for d in gpu0:
            running.node.inject_xid(d.gpu, 79, d.gi, d.ci)
        if not slice_only:
            running.node.inject_xid(1, 79)
        try:
            res = kubelet.wait_for(marked, f"{name}: GPU 0's slices (and the sentinel) marked",
                                   lambda: kubelet.resource(name).summary(), 3)  # fmt: skip
            break
        except StandinError:
            if time.monotonic() > deadline:
                raise
    if not slice_only:
        hit = res.unhealthy & others  # type: ignore[attr-defined]
        assert len(hit) == 1, sorted(hit)


def test_device_specs_give_the_container_the_slice_s_capability_nodes(
    start: Callable[..., Running], kubelet: Kubelet
) -> None:
    """With device specs on, a MIG device comes with its parent's /dev/nvidia<minor> and
    the /dev/nvidia-caps nodes of its GPU and compute instance (minors from mig-minors),
    the same paths from both plugins; the nodes exist in the lab's driver root."""
    running = start(device_specs=True)
    name, devices = max(running.by_resource.items(), key=lambda kv: len(kv[1]))
    target = devices[-1]
    minor = running.node.node().gpus[target.gpu].minor
    got = kubelet.allocate(name, [target.uuid])
    paths = {d.container_path for d in got.devices}
    caps = {f"/dev/nvidia-caps/nvidia-cap{driver.cap_minor(minor, target.gi, c)}"
            for c in (None, target.ci)}  # fmt: skip
    assert {f"/dev/nvidia{minor}", *caps} <= paths, (sorted(paths), running.plugin.log_tail())
    for d in got.devices:
        if d.container_path in caps:
            assert Path(d.host_path).is_char_device(), d.host_path
