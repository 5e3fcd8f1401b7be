"""NVIDIA's GPU Operator on fake GPUs, on the `operator` lab (a control plane and one node of
two H100s, the driver and the NVIDIA Container Toolkit pre-installed): its own chart, every
image built by `make infra`, its operands deployed by it (clusters/labs/gpuoperator.py;
which run, and why the others cannot: clusters/charts/gpu-operator-values.yaml). Each test
asserts on what an operand did on the fake GPUs: the ClusterPolicy's state, the validator's
status files, GFD's labels, the exporter's metrics, the plugin's allocatable and a pod's
GPU; then Xid 79, the operator's per-node switch, a plugin upgrade through Helm and a MIG
layout by label through the operator's MIG manager.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

from clusters.labs import gpuoperator, migmanager, spec
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture
from e2e.pods import DEVICE_ENV, Pods
from e2e.verdict import Verdict
from fakenvml import mig

LAB = spec.load("operator")
NODE = LAB.gpu_nodes[0].name
GPUS = LAB.gpu_nodes[0].gpu_count
NS = gpuoperator.NAMESPACE
RESOURCE = "nvidia.com/gpu"
# The operands this lab's values run on a GPU node, by the operator's pod label.
OPERANDS = ("nvidia-operator-validator", gpuoperator.PLUGIN, "gpu-feature-discovery",
            "nvidia-mig-manager", "nvidia-node-status-exporter")  # fmt: skip
VALIDATIONS = "/run/nvidia/validations"
T = TypeVar("T")


@lab_fixture(LAB.name, scope="module")
def operated(labs: Callable[..., Lab]) -> Iterator[Lab]:
    lab = labs(LAB.name)
    yield lab
    lab.heal()


def wait_for(what: Callable[[], T], want: T, deadline_s: float = 120) -> T:
    end = time.monotonic() + deadline_s
    while (got := what()) != want and time.monotonic() < end:
        time.sleep(0.5)
    return got


def ready_pods(lab: Lab, app: str, node: str | None = None) -> int:
    pods = lab.kube.pods(NS, f"app={app}", node)
    return sum(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
               for p in pods)  # fmt: skip


def allocatable(lab: Lab) -> tuple[int, int]:
    return lab.capacity(NODE, RESOURCE)


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

    got = wait_for(labels, want)
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

    seen = wait_for(got, want, deadline_s=150)  # the exporter re-checks each minute
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


def test_the_device_plugin_off_and_on_by_its_deploy_label(operated: Lab,
                                                          verdict: Verdict) -> None:  # fmt: skip
    """nvidia.com/gpu.deploy.device-plugin=false on the node: the operator takes the plugin's
    pod off it and the node serves nothing; `true`: back, every GPU allocatable. The other
    operands stay."""
    verdict.expect(f"off: no plugin pod, allocatable 0; on: allocatable {GPUS}")
    try:
        operated.set_plugin_on(NODE, False)
        off = wait_for(lambda: allocatable(operated)[1], 0, deadline_s=90)
        others = ready_pods(operated, "gpu-feature-discovery", NODE)
    finally:
        operated.set_plugin_on(NODE, True)
    on = wait_for(lambda: allocatable(operated), (GPUS, GPUS))
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
    try:
        pods.create(pods.gpu_pod("op-held", 1, NODE))
        pods.wait_running("op-held")
        server.install(operated.ctx, {"devicePlugin": {"version": tag}})

        def rolled() -> str:
            d = operated.apps.read_namespaced_daemon_set(gpuoperator.PLUGIN, NS)
            return d.spec.template.spec.containers[0].image

        image = wait_for(rolled, new_image)
        operated.kube.wait_daemonset(gpuoperator.PLUGIN, NS)
        got = wait_for(lambda: allocatable(operated), (GPUS, GPUS))
        held = pods.get("op-held")
        restarts = sum(c.restart_count for c in held.status.container_statuses or [])
        verdict.saw(f"{image}; allocatable {got[1]} of {got[0]}; the pod {held.status.phase}, "
                    f"{restarts} restarts")  # fmt: skip
        assert image == new_image and got == (GPUS, GPUS)
        assert held.status.phase == "Running" and restarts == 0
    finally:
        pods.delete_all()
        server.install(operated.ctx)  # back to the chart's pin
        operated.kube.wait_daemonset(gpuoperator.PLUGIN, NS)
        server.wait_capacity(operated.ctx)


def test_a_mig_layout_by_label_through_the_operators_mig_manager(
    operated: Lab, verdict: Verdict
) -> None:
    """`nvidia.com/mig.config=all-1g.10gb` on the node (a config of the operator's own
    default ConfigMap): the MIG manager the operator deployed pauses the plugin and GFD,
    partitions both H100s through NVML, brings them back and says `success`; GFD (the
    chart's single strategy) counts the 14 slices as GPUs. all-disabled: whole GPUs
    served again. What the plugin serves in between is reported, not asserted: it needs
    the driver's /proc/driver/nvidia/capabilities, which its container (the host kernel's
    procfs) lacks (docs/operator.md)."""
    want = 7 * GPUS
    verdict.expect(f"all-1g.10gb success: {want} 1g.10gb in NVML, gpu.count {want}; "
                   f"all-disabled: {RESOURCE} {GPUS}")  # fmt: skip

    def count() -> str | None:
        return (operated.core.read_node(NODE).metadata.labels or {}).get("nvidia.com/gpu.count")

    try:
        t0 = time.monotonic()
        migmanager.reconfigure(operated.ctx, NODE, "all-1g.10gb")
        took = time.monotonic() - t0
        made = mig.instances(operated.fake_gpus(NODE))
        labelled = wait_for(count, str(want))
        served = allocatable(operated)
    finally:
        migmanager.reconfigure(operated.ctx, NODE, migmanager.DISABLED)
    back = wait_for(lambda: allocatable(operated), (GPUS, GPUS))
    verdict.saw(f"success in {took:.1f}s: {sum(sum(c.values()) for _, c in made)} 1g.10gb, "
                f"gpu.count {labelled} ({RESOURCE} served meanwhile: {served[1]}); "
                f"all-disabled: {back[1]}")  # fmt: skip
    assert made == [(True, Counter({"1g.10gb": 7}))] * GPUS
    assert labelled == str(want) and back == (GPUS, GPUS)
