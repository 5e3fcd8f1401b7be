"""NVIDIA's DRA driver (clusters/labs/dra.py) on nodes wider than one ResourceSlice may be.
The API server refuses a slice with more than 8 counter sets (ResourceSliceMaxCounterSets),
more than 128 devices (ResourceSliceMaxDevices), or more than 64 when any device has a taint
or consumes counters (ResourceSliceMaxDevicesWithTaintsOrConsumesCounters; all three in
k8s.io/api resource/v1 types.go). What the driver publishes at each width is its own choice
(cmd/gpu-kubelet-plugin/driver.go): with DynamicMIG on Kubernetes >= 1.35, one slice with
every GPU's counter set and one slice of devices per GPU; without it, every device of the
node in one slice. So some real boards are wider than the driver can describe, and no
hardware is needed to see it: the scenarios give a lab's node a wider fake inventory through
gpulab's chart (fakegpus.deploy), restart the driver, and assert what a user sees: the
slices, the API server's refusal in the driver's log, and claims that can or cannot be
satisfied. docs/dra-driver.md, "Wide nodes", keeps the findings.

Each scenario puts the lab's own inventory back and waits until every device is published
again, so the suites after it (e2e/test_fleet.py copies these nodes) see the lab as it was.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from clusters.labs import dra, fakegpus, kindconfig, spec
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_job, namespaced_pods
from e2e.pods import Pods
from e2e.test_dra import claim_pod, taints
from e2e.test_dra_mig import wait_event
from e2e.verdict import Verdict
from fakenvml import mig

DYNMIG, DRA_MIG = spec.load("dra-dynmig"), spec.load("dra-mig")

# k8s.io/api resource/v1 (types.go), as a v1.37 API server enforces them.
MAX_COUNTER_SETS = 8
MAX_DEVICES = 128
MAX_DEVICES_TAINTED = 64
# The driver republishes a refused slice with the resourceslice controller's backoff; its
# first attempt comes within seconds of its start. The margin is for CI load.
REFUSAL_S = 90


def h100s(count: int) -> dict:
    return {"gpus": [{"profile": "H100-SXM5-80GB", "count": count}],
            "driver_version": DYNMIG.gpu_nodes[0].spec.driver_version}  # fmt: skip


@contextmanager
def widened(lab: Lab, node: str) -> Iterator[Callable[[dict | None], None]]:
    """widen(inventory): the node as if it had rebooted with the inventory's GPUs. The
    driver's pod leaves the node; its slices are deleted, as the kubelet deletes its node's
    slices when it starts (KEP-4381); the chart rolls the node's fakenvml pod, which writes
    the new state; the driver comes back and publishes for these GPUs into an empty pool.
    Afterwards the lab's own inventory, every device published again. One node's labs:
    the DaemonSet's readiness is read whole."""
    kube, on = lab.ctx.kube, f"{kindconfig.LABEL_PREFIX}/plugin"

    def widen(inventory: dict | None) -> None:
        kube.label_node(node, {on: None})
        kube.watch_until(f"the DRA driver's pod on {node} gone", kube.core.list_namespaced_pod,
                         lambda pods: (not pods, f"{len(pods)} pods"), 120,
                         namespace=dra.NAMESPACE, label_selector=dra.POD_LABELS,
                         field_selector=f"spec.nodeName={node}")  # fmt: skip
        dra.api(lab).delete_collection_resource_slice(
            field_selector=f"spec.driver={dra.DRIVER},spec.nodeName={node}")  # fmt: skip
        fakegpus.deploy(lab.ctx, {node: inventory} if inventory else None)
        kube.label_node(node, {on: "true"})
        kube.wait_daemonset(dra.DAEMONSET, dra.NAMESPACE)

    try:
        yield widen
    finally:
        widen(None)
        assert lab.lab.spec.dra  # a DRA lab's (DraDriver counts DynamicMIG's devices)
        dra.DraDriver(lab.lab.spec.dra).wait_slices(lab.ctx)


def refusal(lab: Lab, node: str, pattern: str, deadline_s: float = REFUSAL_S) -> str:
    """The driver's log line in which the API server refused one of its slices (`pattern`
    a regex of the refusal's own words)."""
    end = time.monotonic() + deadline_s
    found = re.compile(pattern)
    while True:
        log = lab.plugin_log(node) or ""
        line = next((s for s in log.splitlines() if found.search(s)), None)
        if line is not None:
            return line
        if time.monotonic() > end:
            tail = "\n".join(log.splitlines()[-15:])
            raise AssertionError(f"waited {deadline_s:.0f}s for /{pattern}/ in the driver's log "
                                 f"on {node}; its last lines:\n{tail}")  # fmt: skip
        time.sleep(1)


def published(lab: Lab, node: str) -> tuple[int, int]:
    """(devices, counter sets) in the node's slices."""
    found = dra.slices(lab, node)
    return (sum(len(s.spec.devices or []) for s in found),
            sum(len(s.spec.shared_counters or []) for s in found))  # fmt: skip


def unschedulable(lab: Lab, pods: Pods, name: str) -> str:
    """A pod whose claim asks one GPU; the scheduler's reason it waits."""
    dra.create_template(lab, NAMESPACE, name, None)
    claim_pod(pods, name, name)
    return wait_event(pods, name, "FailedScheduling", "")


@dataclass
class Width:
    """What one width showed: devices and counter sets published, the driver's refusal
    line, the scheduler's reason for a one-GPU claim (when one was asked), the taints."""

    devices: int
    counter_sets: int
    refusal: str = ""
    reason: str = ""
    tainted: dict = field(default_factory=dict)


@contextmanager
def claim_pods(lab: Lab) -> Iterator[Pods]:
    for pods in namespaced_pods(lab):
        try:
            yield pods
        finally:
            pods.delete_all()
            dra.delete_claims(lab, NAMESPACE)


# The scenarios run as their labs' jobs (e2e/fixtures.py lab_job): each lab is up beside
# the suites before its own, and the scenarios mostly wait on the kubelet and the driver
# restarting, so beside those suites they cost the tier little; the tests then assert on
# what the jobs saw.


@lab_job(DYNMIG.name)
def dynmig_widths(lab: Lab) -> dict[int, Width]:
    """9 and 16 H100s under DynamicMIG: what the node publishes, and a claim's fate."""
    node, out = DYNMIG.gpu_nodes[0].name, {}
    with widened(lab, node) as widen, claim_pods(lab) as pods:
        for count in (9, 16):
            widen(h100s(count))
            too_many = rf"sharedCounters: Too many: {count}: must have at most {MAX_COUNTER_SETS}"
            line = refusal(lab, node, too_many)
            out[count] = Width(*published(lab, node), line,
                               unschedulable(lab, pods, f"gpu-of-{count}"))  # fmt: skip
            pods.delete_all()
            dra.delete_claims(lab, NAMESPACE)
    return out


@lab_job(DRA_MIG.name)
def mig_widths(lab: Lab) -> dict[str, Width]:
    """16 A100s of seven 1g.5gb each, before and after an Xid on one MIG device; 256 H100s."""
    node, out = DRA_MIG.gpu_nodes[0].name, {}
    a100s = {"gpus": [{"profile": "A100-SXM4-40GB", "count": 16, "mig": "all-1g.5gb"}],
             "driver_version": DRA_MIG.gpu_nodes[0].spec.driver_version}  # fmt: skip
    with widened(lab, node) as widen, claim_pods(lab) as pods:
        widen(a100s)
        dra.wait_slices(lab.ctx)  # every node's, counted from its new state
        out["a100"] = Width(*published(lab, node))
        state = lab.fake_gpus(node)
        sick = mig.layout(state)[3]
        gi, g = next(iter(sick.gis.items()))
        state.inject_xid(sick.gpu.index, 94, gi, next(iter(g.cis)))
        too_many = rf"devices: Too many: {out['a100'].devices}: must have at most "
        line = refusal(lab, node, too_many + rf"{MAX_DEVICES_TAINTED} items")
        out["a100 xid"] = Width(*published(lab, node), line, tainted=taints(lab, node))

        widen(h100s(256))
        line = refusal(lab, node, rf"devices: Too many: 256: must have at most {MAX_DEVICES}")
        out["h100x256"] = Width(*published(lab, node), line,
                                unschedulable(lab, pods, "gpu-of-256"))  # fmt: skip
    return out


def test_a_dynamic_mig_node_of_more_than_eight_gpus_publishes_nothing(
    dynmig_widths: dict[int, Width], verdict: Verdict
) -> None:
    """With DynamicMIG every GPU's counter set goes into one slice, which the driver publishes
    first: at 9 and 16 H100s the API server refuses it, the driver's publishing stops there
    (again and again, with its backoff), the node publishes no device at all, and a claim
    for one whole GPU finds none on a node full of idle GPUs."""
    for count, w in dynmig_widths.items():
        verdict.saw(f"{count} H100s: {w.devices} devices, {w.counter_sets} counter sets; "
                    f"{w.refusal[-140:]}; {w.reason}")  # fmt: skip
        assert f"Too many: {count}: must have at most {MAX_COUNTER_SETS} items" in w.refusal
        assert (w.devices, w.counter_sets) == (0, 0)
        assert "cannot allocate all claims" in w.reason, w.reason
    assert sorted(dynmig_widths) == [9, 16]


def test_a_wide_mig_node_publishes_until_a_taint_and_a_256_gpu_node_publishes_nothing(
    mig_widths: dict[str, Width], verdict: Verdict
) -> None:
    """Without DynamicMIG every device of the node goes into one slice. 16 A100s with seven
    1g.5gb each make 112 MIG devices: under 128, published. An Xid on one makes the driver
    taint it (NVMLDeviceHealthCheck), and a slice with a taint may hold 64: the API server
    refuses the update, the old slice stays, and no device shows the taint: the sick MIG
    device stays schedulable. 256 whole H100s are over 128 from the start: the node
    publishes nothing, and a claim for one GPU waits."""
    for what, w in mig_widths.items():
        verdict.saw(f"{what}: {w.devices} devices, taints {w.tainted}; {w.refusal[-140:]}"
                    + (f"; {w.reason}" if w.reason else ""))  # fmt: skip
    a100, xid, wide = mig_widths["a100"], mig_widths["a100 xid"], mig_widths["h100x256"]
    assert a100.devices == 16 * 7 <= MAX_DEVICES
    assert f"Too many: 112: must have at most {MAX_DEVICES_TAINTED} items" in xid.refusal
    assert (xid.devices, xid.tainted) == (112, {})
    assert f"Too many: 256: must have at most {MAX_DEVICES} items" in wide.refusal
    assert (wide.devices, wide.counter_sets) == (0, 0)
    assert "cannot allocate all claims" in wide.reason, wide.reason
