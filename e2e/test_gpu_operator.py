"""NVIDIA's GPU Operator on fake GPUs, on the `operator` lab (a control plane and one node of
two H100s, the driver and the NVIDIA Container Toolkit pre-installed): its own chart, every
image built by `make infra`, its operands deployed by it (clusters/labs/gpuoperator.py;
which run, and why the others cannot: clusters/charts/gpu-operator-values.yaml). Each test
asserts on what an operand did on the fake GPUs: the ClusterPolicy's state, the validator's
status files, GFD's labels, the exporter's metrics, the plugin's allocatable and a pod's
GPU; then Xid 79 and a GPU off the bus (what the exporter says), the operator's per-node
switch, a plugin upgrade through Helm, time-slicing and a MIG layout by label from the
lab's own ConfigMaps (clusters/labs/operator.yaml) through the operator's config-manager
and MIG manager.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import yaml

from clusters import steps
from clusters.labs import gpuoperator, migmanager, spec
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture, lab_job
from e2e.pods import DEVICE_ENV, Pods, restarts
from e2e.verdict import Verdict
from fakenvml import mig

# The platform above the node: `make test` runs it in a lane of its own, beside the rest.
pytestmark = pytest.mark.platform

LAB = spec.load("operator")
NODE = LAB.gpu_nodes[0].name
GPUS = LAB.gpu_nodes[0].gpu_count
NS = gpuoperator.NAMESPACE
RESOURCE = "nvidia.com/gpu"
# The operands this lab's values run on a GPU node, by the operator's pod label.
OPERANDS = ("nvidia-operator-validator", gpuoperator.PLUGIN, "gpu-feature-discovery",
            "nvidia-mig-manager", "nvidia-node-status-exporter")  # fmt: skip
VALIDATIONS = "/run/nvidia/validations"
GFD_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
# The configs the lab gives the operator (clusters/labs/operator.yaml: ConfigMaps the chart
# creates), read from there: a plugin config and a MIG layout by name.
VALUES = LAB.spec.operator.values if LAB.spec.operator else {}
TS = "ts-4"
TIME_SLICED = yaml.safe_load(VALUES["devicePlugin"]["config"]["data"][TS])
LAYOUT = "small-and-large"


@lab_fixture(LAB.name, scope="module")
def operated(labs: Callable[..., Lab]) -> Iterator[Lab]:
    lab = labs(LAB.name)
    yield lab
    lab.heal()


def ready_pods(lab: Lab, app: str, node: str | None = None) -> int:
    pods = lab.kube.pods(NS, f"app={app}", node)
    return sum(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
               for p in pods)  # fmt: skip


def allocatable(lab: Lab) -> tuple[int, int]:
    return lab.capacity(NODE, RESOURCE)


def mig_layout(name: str) -> list[tuple[bool, Counter[str]]]:
    """Layout `name` of the lab's MIG ConfigMap, GPU by GPU (as mig.instances has one)."""
    configs = yaml.safe_load(VALUES["migManager"]["config"]["data"]["config.yaml"])
    out: list[tuple[bool, Counter[str]]] = [(False, Counter())] * GPUS
    for entry in configs["mig-configs"][name]:
        for i in range(GPUS) if entry["devices"] == "all" else entry["devices"]:
            out[i] = (entry["mig-enabled"], Counter(entry.get("mig-devices") or {}))
    return out


def gfd_output(lab: Lab, keys: dict[str, str]) -> dict[str, str | None]:
    """`keys` as GFD last wrote them on NODE (None: not written, or no file: its pod is
    being replaced)."""
    text = lab.node_exec(NODE, "sh", "-c", f"cat {GFD_OUTPUT} 2>/dev/null || true")
    found = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: found.get(k) for k in keys}


def metrics(lab: Lab) -> dict[str, float]:
    """The node-status exporter's metrics on NODE (through the API server's pod proxy)."""
    (pod,) = lab.kube.pods(NS, "app=nvidia-node-status-exporter", NODE)
    text = lab.core.connect_get_namespaced_pod_proxy_with_path(
        f"{pod.metadata.name}:8000", NS, "metrics")  # fmt: skip
    found = re.findall(r"^(gpu_operator_\w+)(?:\{[^}]*\})? (\S+)$", text, re.M)
    return {k: float(v) for k, v in found}


def test_cluster_policy_ready_with_every_operand_on_the_gpu_node(
    operated: Lab, verdict: Verdict
) -> None:
    """The ClusterPolicy `ready`; one Ready pod of each operand on the GPU node and none on
    the control plane, which has no GPU (the operator labels only nodes NFD found NVIDIA's
    PCI vendor on)."""
    verdict.expect(f"ClusterPolicy ready; on {NODE} 1 Ready pod each of {', '.join(OPERANDS)}")
    state = gpuoperator.policy_state(operated.ctx)
    on_gpu = {a: ready_pods(operated, a, NODE) for a in OPERANDS}
    on_cp = {a: len(operated.kube.pods(NS, f"app={a}", LAB.control_plane.name)) for a in OPERANDS}
    labels = operated.core.read_node(NODE).metadata.labels or {}
    verdict.saw(f"ClusterPolicy {state}; {on_gpu}; control plane {sum(on_cp.values())} pods")
    assert state == "ready"
    assert on_gpu == dict.fromkeys(OPERANDS, 1)
    assert not any(on_cp.values()), on_cp
    assert labels.get("nvidia.com/gpu.present") == "true"


def test_the_validator_validated_the_fake_driver_and_the_toolkit(
    operated: Lab, verdict: Verdict
) -> None:
    """The validator's status files on the node: the driver's (found where the operator's
    driver container would lay it out, not a host driver), the toolkit's (nvidia-smi in a
    container the nvidia runtime gave every GPU), CUDA's and the plugin's; its driver check
    ran the root's real nvidia-smi on fakenvml: every GPU of the node in its table."""
    want = ["cuda-ready", "driver-ready", "plugin-ready", "toolkit-ready"]
    verdict.expect(
        f"{', '.join(want)}; driver-ready IS_HOST_DRIVER=false; {GPUS} GPUs in nvidia-smi"
    )
    files = operated.node_exec(NODE, "ls", VALIDATIONS).split()
    driver = operated.node_read(NODE, f"{VALIDATIONS}/driver-ready")
    (pod,) = operated.kube.pods(NS, "app=nvidia-operator-validator", NODE)
    log = operated.core.read_namespaced_pod_log(
        pod.metadata.name, NS, container="driver-validation"
    )
    product = LAB.gpu_nodes[0].gpu_node.gpus[0].name
    rows = len(re.findall(rf"^\|\s+\d+\s+{re.escape(product[:20])}", log, re.M))
    verdict.saw(f"{', '.join(f for f in files if f.endswith('-ready'))}; "
                f"{' '.join(driver.split())}; {rows} GPUs in nvidia-smi")  # fmt: skip
    assert set(want) <= set(files)
    assert "IS_HOST_DRIVER=false" in driver and "NVIDIA_DRIVER_ROOT=/run/nvidia/driver" in driver
    assert rows == GPUS


def test_gfd_labels_the_node_from_nvml(operated: Lab, verdict: Verdict) -> None:
    """GFD, deployed by the operator: the node's product, count and memory as NVML says."""
    n = LAB.gpu_nodes[0]
    want = {"nvidia.com/gpu.product": n.gpu_product, "nvidia.com/gpu.count": str(GPUS),
            "nvidia.com/gpu.memory": str(n.gpu_node.gpus[0].memory_total >> 20)}  # fmt: skip
    verdict.expect(str(want))

    def labels() -> dict[str, str | None]:
        found = operated.core.read_node(NODE).metadata.labels or {}
        return {k: found.get(k) for k in want}

    got = steps.settle(labels, want)
    verdict.saw(str(got))
    assert got == want


def test_the_node_status_exporter_reports_the_node(operated: Lab, verdict: Verdict) -> None:
    """The exporter's metrics: the driver validated, the toolkit, CUDA and the plugin ready,
    the plugin's devices on the node; its NVIDIA PCI count is what `lspci` in its container
    finds (the container's own sysfs: the host's devices, not the node's fake ones)."""
    want = {"gpu_operator_node_driver_validation": 1.0, "gpu_operator_node_driver_ready": 1.0,
            "gpu_operator_node_toolkit_ready": 1.0, "gpu_operator_node_plugin_ready": 1.0,
            "gpu_operator_node_device_plugin_devices_total": float(GPUS)}  # fmt: skip
    verdict.expect(str(want))

    def got() -> dict[str, float | None]:
        m = metrics(operated)
        return {k: m.get(k) for k in want}

    seen = steps.settle(got, want, deadline_s=150)  # the exporter re-checks each minute
    pci = metrics(operated).get("gpu_operator_nvidia_pci_devices_total")
    verdict.saw(f"{seen}; gpu_operator_nvidia_pci_devices_total {pci}")
    assert seen == want


def test_a_pod_gets_one_of_the_nodes_gpus(operated: Lab, verdict: Verdict) -> None:
    uuids = {g.uuid for g in operated.fake_gpus(NODE).node().gpus}
    verdict.expect(f"{DEVICE_ENV} = one of {len(uuids)} UUIDs")
    operated.ensure_namespace(NAMESPACE)
    pods = Pods(operated.core, NAMESPACE, operated.images["workload"], RESOURCE)
    got = pods.visible_devices("op-gpu", 1, NODE)
    verdict.saw(f"{DEVICE_ENV}={','.join(got)}")
    assert len(got) == 1 and got[0] in uuids


def test_xid_79_takes_a_gpu_out_until_the_plugin_restarts(operated: Lab,
                                                         verdict: Verdict) -> None:  # fmt: skip
    """Xid 79 (fallen off the bus) on GPU 0: the plugin the operator deployed marks it
    unhealthy, allocatable drops by one with capacity kept; a heal (recover, restart its
    pod: NVIDIA's plugin never re-adds a GPU) brings it back."""
    verdict.expect(f"allocatable {GPUS - 1} of {GPUS}, then {GPUS} of {GPUS}")
    operated.fake_gpus(NODE).inject_xid(0, 79)
    operated.wait_allocatable(NODE, GPUS - 1, GPUS, resource=RESOURCE)
    during = allocatable(operated)
    operated.heal()
    after = allocatable(operated)
    verdict.saw(f"{during[1]} of {during[0]}, then {after[1]} of {after[0]}")
    assert during == (GPUS, GPUS - 1) and after == (GPUS, GPUS)


EXPORTED = ("gpu_operator_node_driver_validation", "gpu_operator_node_device_plugin_devices_total")


@dataclass(frozen=True)
class LostGpu:
    """What the operator's stack said about the node while its GPU 0 was off the bus, and
    after a heal: the plugin's allocatable, the node-status exporter's EXPORTED metrics,
    and how long the exporter took to say each."""

    allocatable: tuple[int, int]
    during: dict[str, float | None]
    down_s: float
    after: dict[str, float | None]
    up_s: float


@lab_job(LAB.name)
def lost_gpu(lab: Lab) -> LostGpu:
    """GPU 0 falls off the bus (Xid 79, then every NVML call on it answers GPU_IS_LOST),
    then a heal. A job beside the other labs' suites: the exporter validates the driver
    once a minute (validator/metrics.go), so each answer takes up to a minute."""

    def exported() -> dict[str, float | None]:
        m = metrics(lab)
        return {k: m.get(k) for k in EXPORTED}

    def validation(want: float) -> tuple[dict[str, float | None], float]:
        """The metrics once the validation is `want` (two passes of the exporter at most)."""
        t0 = time.monotonic()
        steps.settle(lambda: exported()[EXPORTED[0]], want, 150)
        return exported(), time.monotonic() - t0

    lab.fake_gpus(NODE).fall_off_bus(0)
    try:
        lab.wait_allocatable(NODE, 0, GPUS, resource=RESOURCE)
        held = allocatable(lab)
        during, down_s = validation(0.0)
    finally:
        lab.heal()
    after, up_s = validation(1.0)
    return LostGpu(held, during, down_s, after, up_s)


def test_a_gpu_off_the_bus_fails_the_exporters_driver_validation(
    lost_gpu: LostGpu, verdict: Verdict
) -> None:
    """GPU 0 off the bus: the plugin the operator deployed takes every GPU out (its event
    wait answers GPU_IS_LOST, after which NVIDIA's plugin marks all devices unhealthy: its
    internal/rm/health.go), capacity kept; the node-status exporter's driver validation
    (the real nvidia-smi, which exits 15: "Unable to determine the device handle ... GPU is
    lost") turns 0 on its next pass, while its device count, which counts the node's capacity,
    stays at every GPU. After a heal its validation turns 1 again by itself."""
    verdict.expect(f"allocatable 0 of {GPUS}; exporter driver validation 0, "
                   f"devices {GPUS}; healed: validation 1")  # fmt: skip
    r = lost_gpu
    verdict.saw(f"allocatable {r.allocatable[1]} of {r.allocatable[0]}; exporter {r.during} "
                f"after {r.down_s:.0f}s; healed: {r.after} after {r.up_s:.0f}s")  # fmt: skip
    verdict.property("exporter's validation down (s)", round(r.down_s, 1))
    assert r.allocatable == (GPUS, 0)
    assert r.during == {EXPORTED[0]: 0.0, EXPORTED[1]: float(GPUS)}
    assert r.after == {EXPORTED[0]: 1.0, EXPORTED[1]: float(GPUS)}


def test_the_device_plugin_off_and_on_by_its_deploy_label(operated: Lab,
                                                          verdict: Verdict) -> None:  # fmt: skip
    """nvidia.com/gpu.deploy.device-plugin=false on the node: the operator takes the plugin's
    pod off it and the node serves nothing; `true`: back, every GPU allocatable. The other
    operands stay."""
    verdict.expect(f"off: no plugin pod, allocatable 0; on: allocatable {GPUS}")
    try:
        operated.set_plugin_on(NODE, False)
        off = steps.settle(lambda: allocatable(operated)[1], 0, deadline_s=90)
        others = ready_pods(operated, "gpu-feature-discovery", NODE)
    finally:
        operated.set_plugin_on(NODE, True)
    on = steps.settle(lambda: allocatable(operated), (GPUS, GPUS))
    verdict.saw(f"off: allocatable {off}, GFD pods {others}; on: {on[1]} of {on[0]}")
    assert off == 0 and others == 1 and on == (GPUS, GPUS)


def test_a_plugin_upgrade_through_helm_keeps_running_pods(operated: Lab,
                                                          verdict: Verdict) -> None:  # fmt: skip
    """`helm upgrade` with the newest plugin release in ClusterPolicy (the chart pins
    v0.17.4): the operator rolls the plugin's DaemonSet to it, the node serves every GPU
    again, and a pod that held a GPU across the roll is still Running (no admission error,
    no restart)."""
    ds = operated.apps.read_namespaced_daemon_set(gpuoperator.PLUGIN, NS)
    old_image = ds.spec.template.spec.containers[0].image
    new_image = operated.images["gfd"]  # the newest plugin release's image
    verdict.expect(f"{gpuoperator.PLUGIN}: {old_image} -> {new_image}; allocatable {GPUS}; "
                   "the pod Running, 0 restarts")  # fmt: skip
    operated.ensure_namespace(NAMESPACE)
    pods = Pods(operated.core, NAMESPACE, operated.images["workload"], RESOURCE)
    pods.delete_all()
    server = operated.serving
    assert isinstance(server, gpuoperator.GpuOperator)
    tag = new_image.rpartition(":")[2]

    def rolled() -> str:
        d = operated.apps.read_namespaced_daemon_set(gpuoperator.PLUGIN, NS)
        return d.spec.template.spec.containers[0].image

    try:
        pods.create(pods.gpu_pod("op-held", 1, NODE))
        pods.wait_running("op-held")
        server.install(operated.ctx, {"devicePlugin": {"version": tag}})
        image = steps.settle(rolled, new_image)
        operated.kube.wait_daemonset(gpuoperator.PLUGIN, NS)
        got = steps.settle(lambda: allocatable(operated), (GPUS, GPUS))
        held = pods.get("op-held")
        restarted, said = restarts(held)
        verdict.saw(f"{image}; allocatable {got[1]} of {got[0]}; the pod {held.status.phase}, "
                    f"{said}")  # fmt: skip
        assert image == new_image and got == (GPUS, GPUS)
        assert held.status.phase == "Running" and restarted == 0, said
    finally:
        pods.delete_all()
        server.install(operated.ctx)  # back to the chart's pin
        # The operator reconciles after Helm returns: the DaemonSet is the pin's again
        # before its rollout is waited for, and the operator's work done before the next.
        steps.settle(rolled, old_image)
        operated.kube.wait_daemonset(gpuoperator.PLUGIN, NS)
        server.wait_capacity(operated.ctx)
        gpuoperator.wait_ready(operated.ctx)


def test_time_slicing_by_the_plugin_config_label(operated: Lab, verdict: Verdict) -> None:
    """`nvidia.com/device-plugin.config=ts-4` on the node (a config of the lab's own
    ConfigMap, given to the operator as devicePlugin.config): the config-manager sidecars
    the operator added to the plugin and GFD write it and signal them; the node serves each
    GPU `replicas` times from the same plugin pod, and GFD's output (the features.d file
    NFD makes node labels of on its next pass, within its minute) says time-slicing. The
    label off: the ConfigMap's default, each GPU once."""
    replicas = TIME_SLICED["sharing"]["timeSlicing"]["resources"][0]["replicas"]
    want = {"nvidia.com/gpu.replicas": str(replicas),
            "nvidia.com/gpu.sharing-strategy": "time-slicing"}  # fmt: skip
    verdict.expect(f"{TS}: {RESOURCE} {GPUS * replicas}, same plugin pod, GFD {want}; "
                   f"default: {GPUS}, GFD replicas 1")  # fmt: skip
    (pod,) = operated.kube.pods(NS, f"app={gpuoperator.PLUGIN}", NODE)
    try:
        sliced, dropped = migmanager.switch_config(operated.ctx, NODE, TS,
                                                   lambda: allocatable(operated),
                                                   (GPUS * replicas,) * 2)  # fmt: skip
        gfd = steps.settle(lambda: gfd_output(operated, want), want, 30)
        (after,) = operated.kube.pods(NS, f"app={gpuoperator.PLUGIN}", NODE)
        restarted, said = restarts(after)
    finally:
        back, dropped_back = migmanager.switch_config(operated.ctx, NODE, None,
                                                      lambda: allocatable(operated),
                                                      (GPUS, GPUS))  # fmt: skip
    one = {"nvidia.com/gpu.replicas": "1"}
    gfd_back = steps.settle(lambda: gfd_output(operated, one), one, 30)
    verdict.saw(f"{TS}: {sliced[1]}, {said}, GFD {gfd}; default: {back[1]}, GFD {gfd_back}"
                + "".join(f"; {n}" for n in (dropped, dropped_back) if n))  # fmt: skip
    assert sliced == (GPUS * replicas,) * 2 and gfd == want
    assert (after.metadata.uid, restarted) == (pod.metadata.uid, 0), said
    assert back == (GPUS, GPUS) and gfd_back == one


def test_a_mig_layout_of_the_labs_configmap_through_the_operators_mig_manager(
    operated: Lab, verdict: Verdict
) -> None:
    """`nvidia.com/mig.config=small-and-large` on the node, a layout of the lab's own MIG
    ConfigMap (given to the operator as migManager.config) that differs by GPU: the MIG
    manager the operator deployed pauses the plugin and GFD, partitions each H100 through
    NVML as the ConfigMap says, brings them back and says `success`; the plugin (the lab's
    mixed strategy) serves each profile's slices (it reads their capability files in the
    driver's /proc/driver, which the lab's runtime shows its container:
    clusters/labs/toolkit.py), GFD counts them, and the ClusterPolicy stays `ready`.
    all-disabled: whole GPUs served again."""
    want = mig_layout(LAYOUT)
    total: Counter[str] = sum((c for _, c in want), Counter())
    counts = {f"nvidia.com/mig-{p}.count": str(n) for p, n in sorted(total.items())}
    slices = {f"nvidia.com/mig-{p}": n for p, n in sorted(total.items())}
    verdict.expect(f"{LAYOUT} success: {want} in NVML, allocatable {slices}, GFD {counts}, "
                   f"ClusterPolicy ready; all-disabled: {RESOURCE} {GPUS}")  # fmt: skip

    def served() -> dict[str, int]:
        return {r: operated.capacity(NODE, r)[1] for r in slices}

    try:
        t0 = time.monotonic()
        migmanager.reconfigure(operated.ctx, NODE, LAYOUT)
        took = time.monotonic() - t0
        made = mig.instances(operated.fake_gpus(NODE))
        gpuoperator.wait_clients_back(operated.ctx, NODE)
        # GFD writes its file as it starts; the plugin registers as it starts.
        gfd = steps.settle(lambda: gfd_output(operated, counts), counts, 60)
        got = steps.settle(served, slices, 60)
        # The operator's next pass sees the plugin's new pod Ready.
        state = steps.settle(lambda: gpuoperator.policy_state(operated.ctx), "ready", 120)
    finally:
        migmanager.reconfigure(operated.ctx, NODE, migmanager.DISABLED)
    gpuoperator.wait_clients_back(operated.ctx, NODE)
    back = steps.settle(lambda: allocatable(operated), (GPUS, GPUS), 60)
    verdict.saw(f"success in {took:.1f}s: {made}, allocatable {got}, GFD {gfd}, ClusterPolicy "
                f"{state}; all-disabled: {back[1]}")  # fmt: skip
    assert made == want
    assert got == slices and gfd == counts and state == "ready"
    assert back == (GPUS, GPUS)
