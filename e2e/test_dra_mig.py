"""NVIDIA's DRA driver (v0.4.1, clusters/labs/dra.py) with statically made MIG devices, on the
`dra-mig` lab: one worker, two H100s, GPU 0 whole and GPU 1 in MIG mode with 3g.40gb,
2g.20gb and 1g.10gb (clusters/labs/dra-mig.yaml). Without its DynamicMIG gate the driver
publishes each existing MIG device in place of its GPU, the mig.nvidia.com DeviceClass
selects them, and preparing a claim for one adds the GPU instance's and the compute
instance's capability nodes to the parent's /dev/nvidia<minor>.

Expectations come from the node's fake state (fakenvml.mig.layout) and the driver's own
rules (v0.4.1 cmd/gpu-kubelet-plugin: mig.go ToCanonicalName, CommonAttributesMig,
CommonCapacitiesMig; cdi.go GetDevNodesForMigDevice; device_health.go). Prepare reads the
capability files at /proc/driver/nvidia/capabilities, which the lab bind-mounts from the fake
driver root (docs/dra-driver.md "MIG"): one test shows that a volume cannot put them there,
one that prepare fails with the driver's error while a file is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kubernetes.utils import parse_quantity

from clusters.labs import dra, kindconfig, spec
from clusters.labs.dra import minor
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture, namespaced_pods, recovering_gpus
from e2e.pods import DEVICE_NODE, Pods
from e2e.test_dra import (
    START_S,
    allocated,
    claim_pod,
    expected_attributes,
    taints,
    wait_taints,
)
from fakenvml import driver, mig
from fakenvml.model import Gpu, MigProfile
from fakenvml.node import NodeDir

DRA_MIG = spec.load("dra-mig")
NODE = DRA_MIG.gpu_nodes[0].name
XID_TAINT = f"{dra.DRIVER}/xid"
MIB = 1 << 20


@dataclass(frozen=True)
class Expected:
    """A MIG device of the node's fake state, and what the driver should make of it."""

    gpu: Gpu  # the parent
    prof: MigProfile
    start: int  # the GPU instance's placement (first memory slice)
    device: mig.MigDevice

    @property
    def minor(self) -> int:
        return minor(self.gpu)

    @property
    def name(self) -> str:
        return dra.mig_device_name(self.gpu, self.device.profile, self.prof.id, self.start)

    @property
    def cap_nodes(self) -> list[str]:
        """The GPU instance's and the compute instance's access nodes (mig-minors' rule)."""
        gi, ci = self.device.gi, self.device.ci
        return [f"nvidia-cap{driver.cap_minor(self.minor, gi)}",
                f"nvidia-cap{driver.cap_minor(self.minor, gi, ci)}"]  # fmt: skip


def expected_migs(state: NodeDir) -> dict[str, Expected]:
    """The node's MIG devices by the name the driver publishes them under."""
    by_uuid = {d.uuid: d for d in mig.devices(state)}
    out: dict[str, Expected] = {}
    for m in mig.layout(state):
        for gid, g in m.gis.items() if m.current else ():
            for cid in g.cis:
                e = Expected(m.gpu, g.prof, g.start, by_uuid[mig.mig_uuid(m.gpu.uuid, gid, cid)])
                out[e.name] = e
    return out


def whole_gpus(state: NodeDir) -> list[Gpu]:
    return [m.gpu for m in mig.layout(state) if not m.current]


@lab_fixture(DRA_MIG.name)
def dra_mig_lab(labs: Callable[..., Lab]) -> Lab:
    return labs(DRA_MIG.name)


@pytest.fixture
def mpods(dra_mig_lab: Lab) -> Iterator[Pods]:
    yield from namespaced_pods(dra_mig_lab)
    dra.delete_claims(dra_mig_lab, NAMESPACE)


@pytest.fixture
def faults(dra_mig_lab: Lab) -> Iterator[NodeDir]:
    """The node's fake GPUs, every device untainted again afterwards."""
    for get in recovering_gpus(dra_mig_lab):
        yield get(NODE)


def create_template(lab: Lab, name: str, device_class: str, selector: str | None = None) -> None:
    dra.create_template(lab, NAMESPACE, name, selector, device_class=device_class)


def cap_nodes(pods: Pods, name: str) -> list[str]:
    """The container's /dev/nvidia-caps entries (none: the directory is absent)."""
    out = pods.exec(name, ["sh", "-c", "ls /dev/nvidia-caps 2>/dev/null; echo end"],
                    lambda out: out.rstrip().endswith("end"))  # fmt: skip
    return sorted(out.split()[:-1])


def wait_event(pods: Pods, name: str, reason: str, text: str, deadline_s: float = 60) -> str:
    """The message of the pod's first `reason` event that contains `text` (this pod's:
    events outlive a deleted pod of the same name)."""
    uid = pods.get(name).metadata.uid
    end = time.monotonic() + deadline_s
    while True:
        msgs = [e.message or "" for e in pods.events(name)
                if e.reason == reason and e.involved_object.uid == uid]  # fmt: skip
        hit = next((m for m in msgs if text in m), None)
        if hit is not None:
            return hit
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline_s:.0f}s for a {reason} event with {text!r} "
                                 f"on pod {name}; saw {msgs or pods.describe(name)}")  # fmt: skip
        time.sleep(0.5)


# -- ResourceSlices


def test_slices_list_the_whole_gpu_and_each_mig_device_not_the_mig_mode_gpu(
    dra_mig_lab: Lab,
) -> None:
    state = dra_mig_lab.fake_gpus(NODE)
    want = expected_migs(state)
    whole = whole_gpus(state)
    assert len(want) == 3 and len(whole) == 1  # the spec's layout, as the fake made it
    published = dra.devices(dra_mig_lab, NODE)
    assert sorted(published) == sorted([f"gpu-{minor(g)}" for g in whole] + list(want))


def test_each_mig_device_has_its_profile_parent_and_capacities(dra_mig_lab: Lab) -> None:
    state = dra_mig_lab.fake_gpus(NODE)
    node = state.node()
    published = dra.devices(dra_mig_lab, NODE)
    for name, e in expected_migs(state).items():
        device = published[name]
        # The parent GPU's attributes, its pcieRoot included.
        want = {**expected_attributes(e.gpu, node.gpus, node.driver_version), "type": "mig",
                "uuid": e.device.uuid, "parentUUID": e.gpu.uuid,
                "profile": e.device.profile}  # fmt: skip
        got = {k: dra.attribute(device, k) for k in want}
        assert got == want, name
        caps = {k: parse_quantity(v.value) for k, v in device.capacity.items()}
        p = e.prof
        assert caps == {
            "memory": e.device.memory_mib * MIB,  # NVML's MiB, in bytes
            "multiprocessors": e.device.multiprocessors,
            "copyEngines": p.copy_engines, "decoders": p.decoders, "encoders": p.encoders,
            "jpegEngines": p.jpegs, "ofaEngines": p.ofas,
            # One capacity per memory slice of the GPU instance's placement.
            **{f"memorySlice{i}": 1 for i in range(e.start, e.start + p.placement_size)},
        }, name  # fmt: skip


# -- claims


def test_a_claim_per_profile_gets_that_mig_device_and_its_capability_nodes(
    dra_mig_lab: Lab, mpods: Pods
) -> None:
    """Three pods, one claim each (mig.nvidia.com, selected by profile): each runs with the
    MIG device of its profile, its parent's /dev/nvidia<minor> alone and the two capability
    nodes of its GPU and compute instance."""
    want = {e.device.profile: e for e in expected_migs(dra_mig_lab.fake_gpus(NODE)).values()}
    names = {}
    for profile in sorted(want):
        template = "mig-" + profile.replace(".", "")
        create_template(dra_mig_lab, template, dra.MIG_CLASS, dra.profile_selector(profile))
        names[profile] = claim_pod(mpods, template, template=template)
    for profile, name in names.items():
        e = want[profile]
        assert mpods.wait_running(name, deadline_s=START_S).spec.node_name == NODE
        assert allocated(dra_mig_lab, mpods, name) == [(NODE, e.name)]
        nodes = mpods.device_nodes(name)
        assert [n for n in nodes if DEVICE_NODE.match(n)] == [f"nvidia{e.minor}"], profile
        assert cap_nodes(mpods, name) == sorted(e.cap_nodes), profile


def test_the_gpu_class_gets_the_whole_gpu_never_a_mig_device(dra_mig_lab: Lab, mpods: Pods) -> None:
    """gpu.nvidia.com selects type 'gpu': the one whole GPU; a second claim waits, though
    the MIG-mode GPU's three devices are free."""
    (gpu,) = whole_gpus(dra_mig_lab.fake_gpus(NODE))
    create_template(dra_mig_lab, "whole", dra.DEVICE_CLASS)
    first = claim_pod(mpods, "whole-0", template="whole")
    mpods.wait_running(first, deadline_s=START_S)
    assert allocated(dra_mig_lab, mpods, first) == [(NODE, f"gpu-{minor(gpu)}")]
    assert cap_nodes(mpods, first) == []  # a whole GPU: no capability nodes
    second = claim_pod(mpods, "whole-1", template="whole")
    mpods.wait_failed_scheduling(second, "cannot allocate all claims")


def test_a_second_claim_for_a_profile_the_layout_has_once_waits(
    dra_mig_lab: Lab, mpods: Pods
) -> None:
    create_template(dra_mig_lab, "one-g", dra.MIG_CLASS, dra.profile_selector("1g.10gb"))
    first = claim_pod(mpods, "one-g-0", template="one-g")
    mpods.wait_running(first, deadline_s=START_S)
    second = claim_pod(mpods, "one-g-1", template="one-g")
    mpods.wait_failed_scheduling(second, "cannot allocate all claims")


def test_mig_claim_prepare_needs_proc_capabilities(dra_mig_lab: Lab, mpods: Pods) -> None:
    """Prepare reads the GPU instance's capability file at /proc/driver/nvidia/capabilities
    (a path fixed in v0.4.1's cdi.go): with that file missing, as on a host whose /proc
    lacks it (this lab before it bind-mounted the fake root's), kubelet reports the
    driver's error and the pod waits. With the file back a new pod runs (kubelet would
    retry the first only at its next periodic sync, about a minute later)."""
    e = next(e for e in expected_migs(dra_mig_lab.fake_gpus(NODE)).values()
             if e.device.profile == "1g.10gb")  # fmt: skip
    rel = f"gpu{e.minor}/mig/gi{e.device.gi}/access"
    root = kindconfig.driver_dir(dra_mig_lab.labs_root, dra_mig_lab.lab, NODE)
    path = root / driver.CAPABILITIES / rel
    aside = path.with_name("access.aside")
    create_template(dra_mig_lab, "one-g", dra.MIG_CLASS, dra.profile_selector("1g.10gb"))
    path.rename(aside)
    try:
        name = claim_pod(mpods, "no-caps", template="one-g")
        proc = f"/proc/driver/nvidia/capabilities/{rel}"
        message = wait_event(mpods, name, "FailedPrepareDynamicResources", proc)
        assert (
            f"failed to construct MIG device DeviceNode edits: failed to parse GI "
            f"capabilities file {proc}: open {proc}: no such file or directory"
        ) in message
        assert mpods.get(name).status.phase == "Pending"
        assert allocated(dra_mig_lab, mpods, name) == [(NODE, e.name)]  # scheduled, not run
    finally:
        aside.rename(path)
    mpods.delete(name)
    again = claim_pod(mpods, "caps-back", template="one-g")
    mpods.wait_running(again, deadline_s=START_S)
    assert cap_nodes(mpods, again) == sorted(e.cap_nodes)


def test_a_volume_cannot_put_the_capabilities_under_proc(dra_mig_lab: Lab, mpods: Pods) -> None:
    """Why the lab bind-mounts them in the plugin's command: runc refuses a volume whose
    mount point is inside /proc (privileged or not), so the chart's volumes cannot."""
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "nodeName": NODE,
            "containers": [{"name": "main", "image": mpods.image, "imagePullPolicy": "Never",
                            "command": ["true"], "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": "caps",
                                              "mountPath": "/proc/driver/nvidia"}]}],
            "volumes": [{"name": "caps", "hostPath": {"path": f"{kindconfig.DRIVER_ROOT}/proc",
                                                      "type": "Directory"}}]}  # fmt: skip
    name = mpods.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "proc-volume"},
                         "spec": spec})  # fmt: skip
    message = wait_event(mpods, name, "Failed", "inside /proc")
    assert 'rootfs/proc/driver/nvidia" cannot be mounted because it is inside /proc' in message


# -- health


def test_an_xid_naming_a_gpu_and_compute_instance_taints_that_mig_device(
    dra_mig_lab: Lab, faults: NodeDir
) -> None:
    """Xid 94 (a contained memory error) in the 2g.20gb instance: v0.4.1 maps (parent UUID,
    GPU instance, compute instance) to the device and taints it alone."""
    e = next(e for e in expected_migs(faults).values() if e.device.profile == "2g.20gb")
    faults.inject_xid(e.gpu.index, 94, e.device.gi, e.device.ci)
    seen, _ = wait_taints(dra_mig_lab, NODE, bool, "the Xid 94 taint")
    assert seen == {e.name: [(XID_TAINT, "94", "NoSchedule")]}


def test_an_xid_naming_no_compute_instance_on_a_mig_gpu_taints_nothing(
    dra_mig_lab: Lab, faults: NodeDir
) -> None:
    """v0.4.1 looks an event up by (parent UUID, GPU instance, compute instance) among the
    devices it publishes: a MIG-mode GPU's whole-GPU Xid (no instance named) and an Xid
    naming a GPU instance but no compute instance match none of them and are dropped.
    An Xid on the whole GPU afterwards shows the events before it were handled."""
    state = faults
    e = next(e for e in expected_migs(state).values() if e.device.profile == "1g.10gb")
    (whole,) = whole_gpus(state)
    state.inject_xid(e.gpu.index, 48)
    state.inject_xid(e.gpu.index, 94, e.device.gi)
    state.inject_xid(whole.index, 48)  # the marker
    seen, _ = wait_taints(dra_mig_lab, NODE, bool, "the marker's taint")
    time.sleep(1)  # a later republish would still show a MIG device's taint
    assert taints(dra_mig_lab, NODE) == seen == {f"gpu-{minor(whole)}": [(XID_TAINT, "48",
                                                                        "NoSchedule")]}  # fmt: skip
