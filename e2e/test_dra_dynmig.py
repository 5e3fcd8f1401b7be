"""NVIDIA's DRA driver (clusters/labs/dra.py) with its DynamicMIG gate on the `dra-dynmig` lab's
two H100s, none in MIG mode: the driver publishes each GPU whole and every MIG device it
could make (Kubernetes' partitionable devices, KEP-4815), makes the MIG device through NVML
when it prepares a claim for one and destroys it when the claim is released. gpulab's own
scenario beside the driver's test_gpu_dynmig.bats (e2e/dra_suite.py): expectations come
from what the fake GPUs answer NVML (each GPU-instance profile's possible placements) and
from their state, read on the host (fakenvml.mig.layout, and NVIDIA's nvidia-smi on it).

The driver refuses DynamicMIG together with its NVMLDeviceHealthCheck gate, so an Xid
on a dynamically made MIG device taints nothing; what it reaches is the workload's NVML.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from clusters import versions
from clusters.labs import dra, spec
from clusters.labs.lab import Lab
from clusters.labs.serving import recover
from e2e.fixtures import NAMESPACE, lab_fixture
from e2e.pods import Pods
from e2e.verdict import Verdict
from fakenvml import library, mig, paths
from fakenvml.node import STATE_DIR_ENV, NodeDir

DYNMIG = spec.load("dra-dynmig")
NODE = DYNMIG.gpu_nodes[0].name
# Each dynamically made MIG device goes with its claim: MIG mode on, the instance made,
# both undone at release. The deadline is for CI load (it takes ~1 s here).
START_S = 60
# The workload that holds a MIG device and waits for an Xid on its GPU (gpulab's image has
# nvidia-ml-py; NVML is the fake library the driver's CDI spec mounts, which lists only the
# MIG devices whose capability nodes the container has).
XID_WAITER = """
import pynvml as n
n.nvmlInit()
gpu = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
print("MIG", n.nvmlDeviceGetUUID(m), n.nvmlDeviceGetGpuInstanceId(m),
      n.nvmlDeviceGetComputeInstanceId(m), flush=True)
events = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(gpu, n.nvmlEventTypeXidCriticalError, events)
print("WAITING", flush=True)
e = n.nvmlEventSetWait_v2(events, 300000)
print("XID", e.eventData, e.gpuInstanceId, e.computeInstanceId, flush=True)
"""


@lab_fixture(DYNMIG.name, scope="module")
def dynmig(labs: Callable[..., Lab]) -> Lab:
    """The lab, its driver up with every GPU's devices published (the lab waits for them:
    dra.expected_devices)."""
    return labs(DYNMIG.name)


@pytest.fixture
def dpods(dynmig: Lab) -> Iterator[Pods]:
    """Claim pods, deleted gracefully (a 1 s grace: the node releases the claim, and with it
    the MIG device, before the pod leaves the API), then their claims; every GPU's faults
    recovered."""
    dynmig.ensure_namespace(NAMESPACE)
    p = Pods(dynmig.core, NAMESPACE, dynmig.images["workload"], grace_s=1)
    yield p
    p.delete_all()
    dra.delete_claims(dynmig, NAMESPACE)
    recover(dynmig.ctx)


def state(lab: Lab) -> NodeDir:
    return lab.fake_gpus(NODE)


def made(lab: Lab) -> dict[str, list[str]]:
    """GPU uuid -> the MIG devices that exist on it (profile names), MIG mode on or not."""
    return {m.gpu.uuid: sorted(g.prof.name for g in m.gis.values() for _ in g.cis)
            for m in mig.layout(state(lab)) if m.current or m.gis}  # fmt: skip


def nvidia_smi(lab: Lab, *args: str) -> str:
    """NVIDIA's nvidia-smi on the node's fake state, from the host (no exec in the node)."""
    binary = paths.cache_dir() / "nvidia-smi" / versions.get("NVIDIA_SMI_VERSION") / "nvidia-smi"
    env = {**os.environ, STATE_DIR_ENV: str(state(lab).path),
           "LD_LIBRARY_PATH": str(library.path().parent)}  # fmt: skip
    res = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    return res.stdout + res.stderr


def mig_claim(lab: Lab, pods: Pods, name: str, profile: str, count: int = 1,
              same_gpu: bool = False, command: list[str] | None = None) -> str:  # fmt: skip
    """A pod with a claim for `count` MIG devices of `profile` (all on one GPU if
    `same_gpu`)."""
    same = f"{dra.DRIVER}/parentUUID" if same_gpu else None
    dra.create_template(lab, NAMESPACE, name, dra.profile_selector(profile), count,
                        dra.MIG_CLASS, same)  # fmt: skip
    doc = dra.pod(name, lab.images["gpulab"] if command else pods.image, template=name)
    if command:
        doc["spec"]["containers"][0]["command"] = command
    return pods.create(doc)


def test_the_driver_publishes_each_gpu_and_every_mig_placement_it_reports(dynmig: Lab) -> None:
    gpus = state(dynmig).node().gpus
    want = Counter({(g.uuid, kind): n for g in gpus
                    for kind, n in dra.dynamic_placements(g).items()})  # fmt: skip
    got: Counter[tuple[str | None, str]] = Counter()
    for d in dra.devices(dynmig, NODE).values():
        kind = str(dra.attribute(d, "type"))
        got[dra.gpu_uuid(d), kind if kind == "gpu" else str(dra.attribute(d, "profile"))] += 1
    assert got == want
    assert made(dynmig) == {}, "no MIG device before a claim asks for one"


def test_a_claim_makes_its_mig_device_and_its_release_destroys_it(
    dynmig: Lab, dpods: Pods, verdict: Verdict
) -> None:
    """A 1g.10gb claim: while its pod runs, the fake's state and nvidia-smi show MIG mode on
    and the one instance on the claim's GPU; the pod's NVML lists it; after the pod is
    deleted (the claim released) it is gone and MIG mode is off again."""
    t0 = time.monotonic()
    name = mig_claim(dynmig, dpods, "dyn-1g", "1g.10gb")
    dpods.wait_running(name, deadline_s=START_S)
    started = time.monotonic() - t0
    ((_, profiles),) = made(dynmig).items()
    assert profiles == ["MIG 1g.10gb"]
    assert "1g.10gb" in nvidia_smi(dynmig, "mig", "-lgi")
    # The scheduler chose a placement (the device's name says which); the driver made the
    # GPU instance there, on that GPU.
    ((_, device),) = dra.allocated(dynmig, NAMESPACE, dpods.get(name))
    ((gpu, gi),) = [(m.gpu, g) for m in mig.layout(state(dynmig)) for g in m.gis.values()]
    assert device == dra.mig_device_name(gpu, mig.short(gi.prof.name), gi.prof.id, gi.start)
    t1 = time.monotonic()
    dpods.delete(name)
    end = time.monotonic() + 30
    while made(dynmig):
        assert time.monotonic() < end, f"MIG device still there after release: {made(dynmig)}"
        time.sleep(0.2)
    verdict.saw(f"claim to Running (MIG made) {started:.1f}s; delete to MIG gone "
                f"{time.monotonic() - t1:.1f}s")  # fmt: skip
    assert "No MIG-enabled devices found" in nvidia_smi(dynmig, "mig", "-lgi")


def test_two_mig_devices_on_one_gpu_fit_where_the_placements_allow_and_wait_otherwise(
    dynmig: Lab, dpods: Pods
) -> None:
    """Partitionable devices share the GPU's memory slices: two 3g.40gb on one GPU fit
    (placements 0 and 4), two 4g.40gb do not (one placement, slices 0-3): that claim
    stays Pending with the scheduler's reason while the first runs."""
    fits = mig_claim(dynmig, dpods, "dyn-2x3g", "3g.40gb", count=2, same_gpu=True)
    dpods.wait_running(fits, deadline_s=START_S)
    assert list(made(dynmig).values()) == [["MIG 3g.40gb", "MIG 3g.40gb"]]
    never = mig_claim(dynmig, dpods, "dyn-2x4g", "4g.40gb", count=2, same_gpu=True)
    msg = dpods.wait_failed_scheduling(never, "cannot allocate all claims")
    assert dpods.get(never).status.phase == "Pending", msg


def test_an_xid_on_a_dynamically_made_mig_device_reaches_the_workload_holding_it(
    dynmig: Lab, dpods: Pods, verdict: Verdict
) -> None:
    """Xid 94 injected on the instance the claim made, named by its GPU and compute
    instance: the pod's own NVML event wait (on its GPU, through the driver root's library)
    gets it with those ids."""
    name = mig_claim(dynmig, dpods, "dyn-xid", "1g.10gb",
                     command=["python3", "-c", XID_WAITER])  # fmt: skip
    dpods.wait_running(name, deadline_s=START_S)
    log = wait_log(dynmig, name, "WAITING")
    (inst,) = mig.devices(state(dynmig))
    assert f"MIG {inst.uuid} {inst.gi} {inst.ci}" in log, log
    gpu = next(g for g in state(dynmig).node().gpus if g.uuid == inst.parent_uuid)
    state(dynmig).inject_xid(gpu.index, 94, inst.gi, inst.ci)
    line = next(s for s in wait_log(dynmig, name, "XID").splitlines() if s.startswith("XID"))
    verdict.saw(line)
    assert line == f"XID 94 {inst.gi} {inst.ci}"


def wait_log(lab: Lab, name: str, text: str, deadline_s: float = 60) -> str:
    """The pod's log once it holds `text` (the API's log, not an exec's stdout)."""
    end = time.monotonic() + deadline_s
    while True:
        log = lab.core.read_namespaced_pod_log(name, NAMESPACE)
        if text in log:
            return log
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline_s:.0f}s for {text!r} in {name}'s log: {log}")
        time.sleep(0.3)
