"""MIG on the `mig` lab (one node, two H100s in MIG mode, all-1g.10gb: 14 slices), for the
subjects configured with a MIG strategy (expects.mig): capacity per MIG resource, pods that
get MIG UUIDs, a pod that does not fit, a layout changed at run time, a slice's Xid.

The expected resources come from the node's fake state (fakenvml.mig.devices) named the
way NVIDIA documents each strategy: single -> nvidia.com/gpu, mixed -> nvidia.com/mig-*.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from clusters.labs import spec, toolkit
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e.fixtures import lab_fixture, namespaced_pods
from e2e.pods import Pods
from e2e.timing import fault_seen
from e2e.verdict import Verdict
from fakenvml import mig

MIG = spec.load("mig")
NODE = MIG.gpu_nodes[0].name
pytestmark = pytest.mark.needs("mig")
NEW_LAYOUT = "3g.40gb,2g.20gb,1g.10gb"  # GPU 1's layout in the reconfiguration scenario


@lab_fixture(MIG.name, scope="module")
def mig_lab(labs: Callable[..., Lab], subject: Subject) -> Lab:
    return labs(MIG.name, subject)


@pytest.fixture
def mpods(mig_lab: Lab) -> Iterator[Pods]:
    yield from namespaced_pods(mig_lab)


def capacities(lab: Lab) -> dict[str, tuple[int, int]]:
    """(capacity, allocatable) of every nvidia.com resource on the node, as the API has it."""
    status = lab.core.read_node(NODE).status
    names = {k for k in (status.capacity or {}) if k.startswith("nvidia.com/")}
    return {n: (int(status.capacity[n]), int(status.allocatable.get(n, 0))) for n in names}


def test_capacity_per_mig_resource_is_the_layout(mig_lab: Lab, verdict: Verdict) -> None:
    want = {n: (len(d), len(d)) for n, d in mig_lab.mig_resources(NODE).items()}
    verdict.expect(", ".join(f"{n} {c}" for n, (c, _) in sorted(want.items())))
    # A resource whose plugin went away (the lab's previous subject) keeps its capacity
    # with nothing allocatable, as kubelet keeps it: only what can be allocated counts.
    seen = {n: v for n, v in capacities(mig_lab).items() if v[1] or n in want}
    verdict.saw(", ".join(f"{n} {c}/{a}" for n, (c, a) in sorted(seen.items())))
    assert seen == want


def test_a_pod_gets_mig_uuids_in_its_env(subject: Subject, mig_lab: Lab, mpods: Pods,
                                         verdict: Verdict) -> None:  # fmt: skip
    """The container's device ids (its env var: every MIG subject's) name 2 MIG devices."""
    slices = {d.uuid for d in mig.devices(mig_lab.fake_gpus(NODE))}
    verdict.expect(f"2 of the node's {len(slices)} MIG devices: {subject.device_ids}")
    mpods.create(mpods.gpu_pod("mig-2", 2, NODE))
    mpods.wait_running("mig-2")
    got = mpods.devices("mig-2")
    verdict.saw(", ".join(got))
    assert len(got) == 2 and set(got) <= slices


def test_a_pod_asking_for_more_slices_than_exist_stays_pending(
    subject: Subject, mig_lab: Lab, mpods: Pods, verdict: Verdict
) -> None:
    have = mig_lab.expected_devices(NODE)
    verdict.expect(f"Pending: Insufficient {subject.spec.resource} ({have + 1} > {have})")
    mpods.create(mpods.gpu_pod("too-many", have + 1, NODE))
    message = mpods.wait_failed_scheduling("too-many", f"Insufficient {subject.spec.resource}")
    verdict.saw(message.split(".")[0])


def test_an_xid_on_one_slice(subject: Subject, mig_lab: Lab, verdict: Verdict) -> None:
    """Ours takes that slice out; NVIDIA's keeps one slice per GPU in its event map, so
    it drops the Xid unless it hit that one: an Xid on every slice of GPU 0 takes out
    exactly one (expects.mig_slice_xid)."""
    node = mig_lab.fake_gpus(NODE)
    n = mig_lab.expected_devices(NODE)
    gpu0 = [d for d in mig_lab.mig_resources(NODE)[subject.spec.resource] if d.gpu == 0]
    try:
        if subject.expects.mig_slice_xid == "that-slice":
            verdict.expect(f"{n - 1}/{n}: the slice's own device only")
            rec = node.inject_xid(0, 79, gpu0[0].gi, gpu0[0].ci)
            fault_seen(verdict, mig_lab, NODE, rec, n - 1, n)
        else:
            verdict.expect(f"Xid on each of GPU 0's {len(gpu0)} slices: {n - 1}/{n}")
            rec = None
            for d in gpu0:
                rec = node.inject_xid(0, 79, d.gi, d.ci)
            assert rec is not None
            fault_seen(verdict, mig_lab, NODE, rec, n - 1, n)
    finally:
        mig_lab.heal()  # GPU 0 recovered, the plugin restarted where it never re-adds one


@pytest.mark.needs("mig=mixed")
def test_a_layout_changed_at_run_time_changes_capacity_after_a_plugin_restart(
    mig_lab: Lab, verdict: Verdict
) -> None:
    node = mig_lab.fake_gpus(NODE)
    verdict.expect(f"GPU 1 -> {NEW_LAYOUT}: mig-1g.10gb 8, mig-2g.20gb 1, mig-3g.40gb 1")
    try:
        mig.configure(node, 1, NEW_LAYOUT)
        toolkit.refresh(mig_lab.ctx)  # the new slices in the CDI spec, as NVIDIA's mig-manager does
        mig_lab.restart_plugin()
        for name, count in (("nvidia.com/mig-3g.40gb", 1), ("nvidia.com/mig-2g.20gb", 1),
                            ("nvidia.com/mig-1g.10gb", 8)):  # fmt: skip
            mig_lab.wait_allocatable(NODE, count, count, deadline_s=120, resource=name)
        seen = capacities(mig_lab)
        verdict.saw(", ".join(f"{n} {c}" for n, (c, _) in sorted(seen.items()) if c))
    finally:
        mig.configure(node, 1, "all-1g.10gb")
        toolkit.refresh(mig_lab.ctx)
        mig_lab.restart_plugin()


def test_the_node_has_each_slice_s_capability_minors_and_nodes(
    mig_lab: Lab, verdict: Verdict
) -> None:
    """What NVIDIA's plugin and the container toolkit read outside NVML, inside the kind
    node (the fakenvml DaemonSet's driver root, never the host's /dev): the slice's lines in
    mig-minors, and character devices of those minors in dev/nvidia-caps."""
    from fakenvml import driver

    gpus = mig_lab.fake_gpus(NODE)
    d = mig.devices(gpus)[0]
    m = gpus.node().gpus[d.gpu].minor
    want = {
        f"gpu{m}/gi{d.gi}/access": driver.cap_minor(m, d.gi),
        f"gpu{m}/gi{d.gi}/ci{d.ci}/access": driver.cap_minor(m, d.gi, d.ci),
    }
    verdict.expect(", ".join(f"{k} {v}, a node c {driver.CAPS_MAJOR}:{v}" for k, v in want.items()))
    root = "/run/fakenvml/driver"
    lines = mig_lab.node_read(NODE, f"{root}/proc/driver/nvidia-caps/mig-minors")
    listed = dict(line.rsplit(" ", 1) for line in lines.splitlines())
    nodes = {
        k: mig_lab.node_exec(
            NODE, "stat", "-c", "%F %t:%T", f"{root}/dev/nvidia-caps/nvidia-cap{v}"
        ).strip()
        for k, v in want.items()
    }
    verdict.saw(", ".join(f"{k} {listed.get(k)}, {nodes[k]}" for k in want))
    assert {k: int(listed[k]) for k in want} == want
    for k, v in want.items():
        assert nodes[k] == f"character special file {driver.CAPS_MAJOR:x}:{v:x}", nodes
