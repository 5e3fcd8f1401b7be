"""NVIDIA's DRA driver for GPUs (v0.4.1, its own Helm chart; clusters/labs/dra.py) on the `dra`
lab's fake GPUs (hetero's three products, a worker each: H100, T4, A100 80 GB), Kubernetes
v1.37: the ResourceSlices it publishes against each node's fake GPUs, ResourceClaims from
pods (one GPU, by attribute, unsatisfiable, shared), pods asking `nvidia.com/gpu` served by the
driver (extended resources, the seeds' scenario), and health as device taints: an Xid 79
taints the device (NVMLDeviceHealthCheck) and new claims avoid it.

v0.4.1 never lifts a taint it set (docs/dra-driver.md): after `fakenvml recover` the
taint stays until the kubelet plugin restarts, which the suite asserts as the driver's
documented behaviour, then shows the restart clearing it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from kubernetes.utils import parse_quantity

from clusters.labs import dra, spec
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, gpu_node, lab_fixture, namespaced_pods, recovering_gpus
from e2e.pods import DEVICE_NODE, Pods
from e2e.verdict import Verdict
from fakenvml import driver
from fakenvml.model import Gpu
from fakenvml.node import NodeDir

DRA = spec.load("dra")
H100_NODE, T4_NODE, A100_NODE = (
    gpu_node(DRA, p).name for p in ("H100-SXM5-80GB", "T4", "A100-SXM4-80GB")
)
XID_TAINT = f"{dra.DRIVER}/xid"
# What the scheduler annotates a claim it made for a pod's extended resources with.
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
# How long a pod with a claim may take to run: about a second on a quiet machine. The 70-90 s
# seen in CI were force-deleted pods' devices handed on before their node let go of them
# (test_a_force_deleted_claim_pods_device_is_refused_to_the_next_claim); the suites now
# delete gracefully (Pods.grace_s), and the margin is for CI load.
START_S = 60
# NVML's architecture enum (nvml.h NVML_DEVICE_ARCH_*) as the driver names it.
ARCHITECTURES = {6: "Turing", 7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}


@lab_fixture(DRA.name)
def dra_lab(labs: Callable[..., Lab]) -> Lab:
    return labs(DRA.name)


@pytest.fixture
def dpods(dra_lab: Lab) -> Iterator[Pods]:
    yield from namespaced_pods(dra_lab)
    dra.delete_claims(dra_lab, NAMESPACE)  # a shared claim outlives its pods


@pytest.fixture
def dra_faults(dra_lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """dra_faults(node) -> that node's fake GPUs, every device untainted again afterwards."""
    yield from recovering_gpus(dra_lab)


def create_template(lab: Lab, name: str, selector: str | None = None) -> None:
    dra.create_template(lab, NAMESPACE, name, selector)


def claim_pod(pods: Pods, name: str, template: str | None = None,
              claim: str | None = None) -> str:  # fmt: skip
    """A workload pod whose container uses one ResourceClaim: made from `template` for this
    pod, or the existing `claim` (shared)."""
    return pods.create(dra.pod(name, pods.image, template, claim))


def allocated(lab: Lab, pods: Pods, name: str) -> list[tuple[str, str]]:
    return dra.allocated(lab, NAMESPACE, pods.get(name))


def uuid_of(lab: Lab, node: str, device: str) -> str:
    return str(dra.attribute(dra.devices(lab, node)[device], "uuid"))


def uuids(lab: Lab, node: str) -> set[str]:
    return {g.uuid for g in lab.fake_gpus(node).node().gpus}


def seen_gpus(lab: Lab, pods: Pods, name: str) -> list[str]:
    """The UUIDs of the GPUs whose /dev/nvidia<minor> the container has (CDI put them
    there), by the node's fake state."""
    node = pods.get(name).spec.node_name
    by_minor = {(g.minor if g.minor >= 0 else g.index): g.uuid
                for g in lab.fake_gpus(node).node().gpus}  # fmt: skip
    minors = [int(m[1]) for n in pods.device_nodes(name) if (m := DEVICE_NODE.match(n))]
    return [by_minor.get(m, f"/dev/nvidia{m} (no such GPU)") for m in minors]


def taints(lab: Lab, node: str) -> dict[str, list[tuple[str, str, str]]]:
    """The node's tainted devices: device -> [(key, value, effect)]."""
    return {name: [(t.key, t.value or "", t.effect) for t in d.taints]
            for name, d in dra.devices(lab, node).items() if d.taints}  # fmt: skip


def wait_taints(lab: Lab, node: str, check: Callable[[dict], bool], what: str,
                deadline_s: float = 60) -> tuple[dict, float]:  # fmt: skip
    """Until check(taints(node)); returns them and the monotonic time they were seen."""
    end = time.monotonic() + deadline_s
    while True:
        seen = taints(lab, node)
        if check(seen):
            return seen, time.monotonic()
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline_s:.0f}s for {what} on {node}; saw {seen}")
        time.sleep(0.2)


def pcie_root(gpus: list[Gpu], gpu: Gpu) -> str:
    """The root complex the fake's topology puts the GPU under (its host bridge's)."""
    return driver.pcie_paths(gpus)[driver.pci_address(gpu)].split("/")[0]


def expected_attributes(gpu: Gpu, gpus: list[Gpu], driver_version: str) -> dict[str, object]:
    major, minor, patch = (int(p) for p in driver_version.split("."))
    return {
        "type": "gpu",
        "uuid": gpu.uuid,
        "productName": gpu.name,
        "architecture": ARCHITECTURES[gpu.arch],
        "cudaComputeCapability": f"{gpu.cc_major}.{gpu.cc_minor}.0",
        # semver: 580.159.04 -> 580.159.4
        "driverVersion": f"{major}.{minor}.{patch}",
        "resource.kubernetes.io/pciBusID": driver.pci_address(gpu),
        # From the kernel's link /sys/bus/pci/devices/<bus id> in the driver's pod (gpulab's
        # image shows the fake GPUs there, clusters/infra/images/dra-kubelet-plugin.sh).
        "resource.kubernetes.io/pcieRoot": pcie_root(gpus, gpu),
    }


# -- ResourceSlices


@pytest.mark.parametrize("node", [H100_NODE, T4_NODE, A100_NODE])
def test_resource_slices_list_the_nodes_fake_gpus_with_their_attributes(
    dra_lab: Lab, node: str
) -> None:
    state = dra_lab.fake_gpus(node).node()
    published = dra.devices(dra_lab, node)
    assert len(published) == len(state.gpus)
    by_uuid = {str(dra.attribute(d, "uuid")): d for d in published.values()}
    for gpu in state.gpus:
        device = by_uuid[gpu.uuid]
        want = expected_attributes(gpu, state.gpus, state.driver_version)
        got = {k: dra.attribute(device, k) for k in want}
        assert got == want, device.name
        # Memory as NVML's total, a capacity the scheduler compares quantities against.
        assert parse_quantity(device.capacity["memory"].value) == gpu.memory_total
        minor = gpu.minor if gpu.minor >= 0 else gpu.index
        assert device.name == f"gpu-{minor}"


# -- claims


def test_a_pod_with_a_claim_for_one_gpu_runs_and_sees_its_device(dra_lab: Lab, dpods: Pods) -> None:
    create_template(dra_lab, "one-gpu")
    name = claim_pod(dpods, "dra-one", template="one-gpu")
    pod = dpods.wait_running(name, deadline_s=START_S)
    ((pool, device),) = allocated(dra_lab, dpods, name)
    assert pool == pod.spec.node_name
    # CDI made exactly the allocated GPU's device node in the container.
    assert seen_gpus(dra_lab, dpods, name) == [uuid_of(dra_lab, pool, device)]


@pytest.mark.parametrize(("selector", "nodes"), [
    # "80 GB" boards report 79.6 GiB through NVML: the quantity is decimal, as marketed.
    # Both 80 GB products qualify, the T4 never.
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80G')) >= 0",
     {A100_NODE, H100_NODE}),
    ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'", {A100_NODE}),
    ("device.attributes['gpu.nvidia.com'].productName == 'Tesla T4'", {T4_NODE}),
    ("device.attributes['gpu.nvidia.com'].architecture == 'Hopper'", {H100_NODE}),
], ids=["memory-80G", "product-A100", "product-T4", "architecture-hopper"])  # fmt: skip
def test_a_claim_selecting_by_attribute_lands_on_the_right_node(
    dra_lab: Lab, dpods: Pods, selector: str, nodes: set[str], request: pytest.FixtureRequest
) -> None:
    """On hetero's three products (A100 80 GB x8, H100 80 GB x4, T4 x2), two pods of one
    template, each on a node the selector allows."""
    # A name of its own per case: the claim controller makes a pod's claim from its cached
    # copy of the template, and a template deleted and made again under the same name can
    # still be the previous case's there (CI: the T4 pod got the A100 selector).
    case = request.node.callspec.id.lower()
    create_template(dra_lab, f"picky-{case}", selector)
    names = [claim_pod(dpods, f"dra-{case}-{i}", template=f"picky-{case}") for i in range(2)]
    for name in names:
        assert dpods.wait_running(name, deadline_s=START_S).spec.node_name in nodes


def test_a_claim_no_gpu_satisfies_stays_pending_with_the_reason(
    dra_lab: Lab, dpods: Pods, verdict: Verdict
) -> None:
    create_template(dra_lab, "b200", "device.attributes['gpu.nvidia.com'].productName == "
                                     "'NVIDIA B200'")  # fmt: skip
    name = claim_pod(dpods, "dra-b200", template="b200")
    msg = dpods.wait_failed_scheduling(name, "cannot allocate all claims")
    verdict.saw(msg)
    assert dpods.get(name).status.phase == "Pending"


def test_a_claim_for_gpus_on_one_pcie_root_gets_gpus_behind_one_host_bridge(
    dra_lab: Lab, dpods: Pods, verdict: Verdict
) -> None:
    """pcieRoot as a claim uses it (KEP-4381's standard attribute: devices under one root
    complex, e.g. GPUs beside a NIC): on the A100 node, eight GPUs behind two host bridges,
    five on one root can never be had and stay Pending with the reason; four are, all under
    one host bridge of the fake's topology."""
    a100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"
    root = "resource.kubernetes.io/pcieRoot"
    dra.create_template(dra_lab, NAMESPACE, "root-5", a100, count=5, same=root)
    dra.create_template(dra_lab, NAMESPACE, "root-4", a100, count=4, same=root)
    five = claim_pod(dpods, "dra-root-5", template="root-5")
    verdict.saw(dpods.wait_failed_scheduling(five, "cannot allocate all claims"))
    four = claim_pod(dpods, "dra-root-4", template="root-4")
    dpods.wait_running(four, deadline_s=START_S)
    got = allocated(dra_lab, dpods, four)
    assert len(got) == 4 and {pool for pool, _ in got} == {A100_NODE}
    gpus = dra_lab.fake_gpus(A100_NODE).node().gpus
    by_uuid = {g.uuid: g for g in gpus}
    held = [by_uuid[uuid_of(dra_lab, A100_NODE, device)] for _, device in got]
    assert len({g.host_bridge for g in held}) == 1
    assert sorted(seen_gpus(dra_lab, dpods, four)) == sorted(g.uuid for g in held)
    assert dpods.get(five).status.phase == "Pending"


def test_two_pods_share_one_claim_and_its_gpu(dra_lab: Lab, dpods: Pods) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "shared"}, "spec": dra.request()}  # fmt: skip
    dra.api(dra_lab).create_namespaced_resource_claim(NAMESPACE, body)
    a = claim_pod(dpods, "dra-share-a", claim="shared")
    b = claim_pod(dpods, "dra-share-b", claim="shared")
    pa, pb = dpods.wait_running(a, deadline_s=START_S), dpods.wait_running(b, deadline_s=START_S)
    assert pa.spec.node_name == pb.spec.node_name
    gpus = seen_gpus(dra_lab, dpods, a)
    assert len(gpus) == 1 and seen_gpus(dra_lab, dpods, b) == gpus
    claim = dra.api(dra_lab).read_namespaced_resource_claim("shared", NAMESPACE)
    assert {r.name for r in claim.status.reserved_for} == {a, b}


def test_the_seeds_pods_asking_nvidia_com_gpu_are_served_by_the_driver(
    dra_lab: Lab, dpods: Pods, verdict: Verdict
) -> None:
    """Extended resources served by DRA (KEP-5004, GA in 1.37): the seeds' scenario with the
    seeds' own pods, which ask `nvidia.com/gpu` as of a device plugin, on nodes where only
    the driver serves GPUs (its DeviceClass names nvidia.com/gpu). Its kubelet plugin
    stopped on the H100 node: gpu-8 runs on the A100 node's eight, gpu-3 is Pending (two
    T4s are all that is left); the plugin started there, gpu-3 runs on three of its H100s.
    Each pod's devices come in a claim the scheduler made from the class."""
    verdict.expect("gpu-8 on the A100 node (8 GPUs); gpu-3 Pending, then on the H100 node (3)")
    dra_lab.set_plugin_on(H100_NODE, False)
    try:
        pod8 = dpods.wait_running(dpods.create("test-gpu-8"), deadline_s=START_S)
        got8 = seen_gpus(dra_lab, dpods, "test-gpu-8")
        verdict.saw(f"gpu-8 on {pod8.spec.node_name} ({len(set(got8))} GPUs)")
        assert pod8.spec.node_name == A100_NODE
        assert len(set(got8)) == 8 and set(got8) <= uuids(dra_lab, A100_NODE)

        dpods.create("test-gpu-3")
        msg = dpods.wait_failed_scheduling("test-gpu-3", "nodes are available")
        verdict.saw(f"gpu-3 Pending ({msg})")
        assert dpods.get("test-gpu-3").status.phase == "Pending"
    finally:
        dra_lab.set_plugin_on(H100_NODE, True)
    pod3 = dpods.wait_running("test-gpu-3", deadline_s=START_S)
    got3 = seen_gpus(dra_lab, dpods, "test-gpu-3")
    verdict.saw(f"then on {pod3.spec.node_name} ({len(set(got3))} GPUs)")
    assert pod3.spec.node_name == H100_NODE
    assert len(set(got3)) == 3 and set(got3) <= uuids(dra_lab, H100_NODE)
    for pod, node, n in ((pod8, A100_NODE, 8), (pod3, H100_NODE, 3)):
        made = pod.status.extended_resource_claim_status
        assert made is not None, f"{pod.metadata.name}: no extended-resource claim"
        name = made.resource_claim_name
        claim = dra.api(dra_lab).read_namespaced_resource_claim(name, NAMESPACE)
        assert claim.metadata.annotations[EXTENDED_RESOURCE_CLAIM] == "true"
        results = claim.status.allocation.devices.results
        assert [(r.driver, r.pool) for r in results] == [(dra.DRIVER, node)] * n


def test_a_force_deleted_claim_pods_device_is_refused_to_the_next_claim(
    dra_lab: Lab, dpods: Pods, verdict: Verdict
) -> None:
    """Deleted gracefully, a claim pod stays in the API until its node unprepared the claim,
    so the next claim for its device starts at once. Force-deleted (grace 0), it is gone
    first: the scheduler gives the device to the next claim, the driver refuses to prepare a
    device another claim still holds, and the kubelet tries again only ~70 s later.
    Whether the node is still busy with the old pod when the next claim comes is a race:
    the kubelet kills a force-deleted pod's containers within its 2 s minimum grace, and
    under CI load the next pod's creation alone took longer ("no refusal for dra-third:
    Running", 2026-12-03). Here the old pod's containerd shim is stopped (SIGSTOP) over
    the deletion, so the kubelet cannot finish the old pod (it unprepares a claim only
    after its containers stop) while it goes on preparing the new one: a node slow to stop
    a workload, every time. (Stopping all of containerd instead stalled the new pod too:
    the kubelet syncs a pod only after its runtime answered a relist.)"""
    uuid = uuid_of(dra_lab, T4_NODE, "gpu-0")
    create_template(dra_lab, "t4-0", f"device.attributes['{dra.DRIVER}'].uuid == '{uuid}'")
    first = claim_pod(dpods, "dra-first", template="t4-0")
    dpods.wait_running(first, deadline_s=START_S)
    dpods.delete(first)  # the suites' grace period
    second = claim_pod(dpods, "dra-second", template="t4-0")
    dpods.wait_running(second, deadline_s=30)
    with shim_stopped(dra_lab, T4_NODE, second):
        dra_lab.core.delete_namespaced_pod(second, NAMESPACE, grace_period_seconds=0)
        third = claim_pod(dpods, "dra-third", template="t4-0")
        uid = dpods.get(third).metadata.uid  # not an earlier run's pod of that name
        end = time.monotonic() + 30
        while not (refused := [e.message for e in dpods.events(third)
                               if e.reason == "FailedPrepareDynamicResources"
                               and e.involved_object.uid == uid]):  # fmt: skip
            if time.monotonic() > end:
                story = prepare_story(dra_lab, T4_NODE, second)
                raise AssertionError(f"no refusal for {third}: {dpods.describe(third)}\n{story}")
            time.sleep(0.5)
    verdict.saw(refused[0])
    assert "is already allocated to different claim" in refused[0]
    assert dpods.get(third).status.phase == "Pending"
    # The device is the next test's once the node is done with the second pod.
    end = time.monotonic() + 30
    while left := node_containers(dra_lab, T4_NODE, second):
        assert time.monotonic() < end, f"{second}'s containers still run: {left}"
        time.sleep(0.5)


def prepare_story(lab: Lab, node: str, pod: str) -> str:
    """For a failure: the driver's prepare and unprepare lines on `node`, and the kubelet's
    journal about `pod` (CI, 2026-12-05: the third pod ran unrefused once, cause not
    found then; these say when the old claim was unprepared and why)."""
    log = lab.plugin_log(node) or ""
    driver_lines = [ln for ln in log.splitlines()
                    if re.search(r"[Uu]nprepare|newly prepared|already allocated", ln)]  # fmt: skip
    try:
        journal = lab.node_exec(node, "sh", "-c", f"journalctl -u kubelet --no-pager -n 3000 "
                                f"| grep -E '{pod}|{NAMESPACE}/' | tail -n 25")  # fmt: skip
    except Exception as e:  # a diagnosis must not hide the failure it explains
        journal = f"(journal unreadable: {e})"
    return (
        "the driver's prepare lines:\n"
        + "\n".join(driver_lines[-12:])
        + f"\nthe kubelet on {pod}:\n{journal}"
    )


@contextmanager
def shim_stopped(lab: Lab, node: str, pod: str) -> Iterator[None]:
    """The containerd shim of the suite's pod `pod` on `node` stopped (SIGSTOP) inside,
    continued after: the kubelet's kill of that pod waits on it, while containerd and the
    kubelet serve every other pod."""
    sandbox = lab.node_exec(node, "crictl", "pods", "-q", "--name", pod,
                            "--namespace", NAMESPACE).split()  # fmt: skip
    assert len(sandbox) == 1, f"{pod} on {node}: sandboxes {sandbox}"
    pid = lab.node_exec(node, "pgrep", "-f", f"containerd-shim.* -id {sandbox[0]}").split()
    assert len(pid) == 1, f"{pod}'s shim on {node}: {pid}"
    lab.node_exec(node, "kill", "-STOP", pid[0])
    try:
        yield
    finally:
        lab.node_exec(node, "kill", "-CONT", pid[0])


def node_containers(lab: Lab, node: str, pod: str) -> list[str]:
    """The running containers of the suite's pod `pod` on `node` (crictl: the API no
    longer has a force-deleted pod)."""
    return lab.node_exec(node, "crictl", "ps", "-q", "--label", f"io.kubernetes.pod.name={pod}",
                         "--label", f"io.kubernetes.pod.namespace={NAMESPACE}").split()  # fmt: skip


# -- health as device taints


def test_xid_79_taints_the_device_and_new_claims_avoid_it(
    dra_lab: Lab, dpods: Pods, dra_faults: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """On the T4 node (2 GPUs): Xid 79 on GPU 0 -> its device gets gpu.nvidia.com/xid=79
    NoSchedule; two T4 claims: one gets GPU 1, the other stays Pending. After recovery
    the taint stays (v0.4.1); a restart of the kubelet plugin drops it and the Pending
    claim gets GPU 0."""
    gpus = dra_lab.fake_gpus(T4_NODE)
    victim = gpus.node().gpus[0]
    victim_device = f"gpu-{victim.minor if victim.minor >= 0 else victim.index}"
    verdict.expect(f"{victim_device} tainted {XID_TAINT}=79 NoSchedule; claims avoid it; "
                   "taint stays after recover until the plugin restarts")  # fmt: skip
    t0 = time.monotonic()
    dra_faults(T4_NODE).inject_xid(0, 79)
    seen, t1 = wait_taints(dra_lab, T4_NODE, lambda t: victim_device in t, "the Xid taint")
    assert seen == {victim_device: [(XID_TAINT, "79", "NoSchedule")]}

    create_template(dra_lab, "t4", "device.attributes['gpu.nvidia.com'].productName == "
                                   "'Tesla T4'")  # fmt: skip
    first = claim_pod(dpods, "dra-t4-a", template="t4")
    dpods.wait_running(first, deadline_s=START_S)
    assert seen_gpus(dra_lab, dpods, first) != [victim.uuid]
    second = claim_pod(dpods, "dra-t4-b", template="t4")
    msg = dpods.wait_failed_scheduling(second, "cannot allocate all claims")

    gpus.recover(0)
    time.sleep(10)  # five of the driver's event-wait periods
    assert taints(dra_lab, T4_NODE) == seen, "v0.4.1 lifts no taint"
    assert dpods.get(second).status.phase == "Pending"

    dra_lab.kube.restart_pods(dra.NAMESPACE, dra.POD_LABELS, dra.DAEMONSET)
    _, t2 = wait_taints(dra_lab, T4_NODE, lambda t: not t, "no taints", deadline_s=120)
    dpods.wait_running(second, deadline_s=START_S)
    assert seen_gpus(dra_lab, dpods, second) == [victim.uuid]
    verdict.saw(
        f"tainted {t1 - t0:.1f}s after the Xid; 2nd claim Pending ({msg[:60]}...); "
        f"taint kept after recover; gone {t2 - t0:.0f}s in, after a plugin restart"
    )


def test_a_lost_gpu_taints_every_device_of_its_node(
    dra_lab: Lab, dpods: Pods, dra_faults: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """NVML answers GPU_IS_LOST from the event wait, which names no GPU: v0.4.1 taints
    every device of the node gpu.nvidia.com/gpu-lost (as NVIDIA's device plugin marks
    every device Unhealthy); the other nodes' GPUs stay untainted and serve claims."""
    devices = sorted(dra.devices(dra_lab, H100_NODE))
    verdict.expect(f"all {len(devices)} H100 devices {dra.DRIVER}/gpu-lost NoSchedule")
    t0 = time.monotonic()
    dra_faults(H100_NODE).lose(2)
    lost = [(f"{dra.DRIVER}/gpu-lost", "", "NoSchedule")]
    seen, t1 = wait_taints(dra_lab, H100_NODE, lambda t: sorted(t) == devices,
                           "gpu-lost on every device")  # fmt: skip
    assert all(v == lost for v in seen.values()), seen
    assert taints(dra_lab, T4_NODE) == taints(dra_lab, A100_NODE) == {}
    create_template(dra_lab, "any", None)
    names = [claim_pod(dpods, f"dra-after-lost-{i}", template="any") for i in range(3)]
    ran = {dpods.wait_running(n, deadline_s=START_S).spec.node_name for n in names}
    assert H100_NODE not in ran, ran
    verdict.saw(f"{len(seen)}/{len(devices)} devices gpu-lost {t1 - t0:.1f}s after the loss; "
                f"3 new claims ran on {', '.join(sorted(ran))}")  # fmt: skip


def test_an_ignored_xid_is_recorded_as_a_taint_that_keeps_nothing_away(
    dra_lab: Lab, dpods: Pods, dra_faults: Callable[[str], NodeDir]
) -> None:
    """Xid 13 (a graphics engine exception, an application's fault) is on v0.4.1's ignore
    list: the device gets the xid taint with effect None, which schedules as before."""
    dra_faults(T4_NODE).inject_xid(1, 13)
    seen, _ = wait_taints(dra_lab, T4_NODE, lambda t: bool(t), "the Xid 13 taint")
    assert list(seen.values()) == [[(XID_TAINT, "13", "None")]]
    create_template(dra_lab, "t4", "device.attributes['gpu.nvidia.com'].productName == "
                                   "'Tesla T4'")  # fmt: skip
    names = [claim_pod(dpods, f"dra-t4-{i}", template="t4") for i in range(2)]
    for name in names:
        assert dpods.wait_running(name, deadline_s=START_S).spec.node_name == T4_NODE
