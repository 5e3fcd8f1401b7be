"""NVIDIA's DRA driver for GPUs (sigs.k8s.io/dra-driver-nvidia-gpu) in a lab, installed the
way its docs say: its own Helm chart, from the release's Go module, as a real Helm release.
A lab spec with `dra:` gets it instead of a device plugin (the chart refuses to run beside
one: both would serve the node's GPUs).

What the driver needs besides NVML, and where the lab gives it (docs/dra-driver.md has the
evidence for each):
- a driver root with libnvidia-ml.so.1, a regular-file nvidia-smi that runs, the
  versioned library and /dev/nvidia<minor> character devices: the fake-gpus chart's
  `fakenvml install-driver` into /run/fakenvml/driver (nvidiaDriverRoot);
- /usr/bin/nvidia-cdi-hook in its image (copied to the host for the CDI specs it writes):
  built from the nvidia-container-toolkit its go.mod requires;
- containerd with CDI (the node image's), resource.k8s.io/v1 (Kubernetes >= 1.34) and,
  for health as device taints, DRADeviceTaints (GA in 1.37) and the driver's own
  NVMLDeviceHealthCheck gate (alpha, off by default: the lab turns it on);
- nodes it may run on: its default affinity wants NFD's NVIDIA PCI labels or the GPU
  operator's nvidia.com/gpu.present, which a fake host has neither of; the lab points it
  at its own gpulab.dev/fake-gpus label instead.
Compute domains (IMEX over NVLink fabric) are turned off: they need a fabric manager.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from clusters import chart, infra, kindconfig, versions

if TYPE_CHECKING:
    from clusters.lab import Lab

MODULE = "sigs.k8s.io/dra-driver-nvidia-gpu"
CHART_DIR = "deployments/helm/dra-driver-nvidia-gpu"
RELEASE = NAMESPACE = "nvidia-dra-driver-gpu"  # as in the driver's install docs
DRIVER = "gpu.nvidia.com"  # its driver name: ResourceSlices, DeviceClass, taint keys
DEVICE_CLASS = "gpu.nvidia.com"
DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"  # <chart name>-kubelet-plugin
POD_LABELS = "dra-driver-nvidia-gpu-component=kubelet-plugin"  # its pods' selector


def version() -> str:
    return versions.get("DRA_DRIVER_VERSION")


def chart_dir() -> Path:
    where = chart.module_dir(f"{MODULE}@{version()}") / CHART_DIR
    if not (where / "Chart.yaml").is_file():
        raise infra.InfraMissing(f"the DRA driver's chart is not in {where}; {infra.MAKE_INFRA}")
    return where


def values(image: str, feature_gates: dict[str, bool]) -> dict[str, Any]:
    repo, tag = chart.split_image(image)
    fake_gpus = {"key": f"{kindconfig.LABEL_PREFIX}/fake-gpus", "operator": "In",
                 "values": ["true"]}  # fmt: skip
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "nvidiaDriverRoot": kindconfig.DRIVER_ROOT,
        # The chart's guard against running beside a device plugin: the lab runs none.
        "gpuResourcesEnabledOverride": True,
        "resources": {"computeDomains": {"enabled": False}},
        "featureGates": {k: str(v).lower() for k, v in feature_gates.items()},
        "kubeletPlugin": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [fake_gpus]}]}}}},
    }  # fmt: skip


def install(kubeconfig: Path, image: str, feature_gates: dict[str, bool],
            timeout_s: int = 240) -> str:  # fmt: skip
    return chart.install(infra.helm(), chart_dir(), RELEASE, NAMESPACE,
                         values(image, feature_gates), kubeconfig, timeout_s)  # fmt: skip


def api(lab: Lab) -> client.ResourceV1Api:
    return client.ResourceV1Api(lab.kube.api)


def slices(lab: Lab, node: str | None = None) -> list[client.V1ResourceSlice]:
    """The driver's ResourceSlices (of `node` only, if given)."""
    fields = f"spec.driver={DRIVER}" + (f",spec.nodeName={node}" if node else "")
    return api(lab).list_resource_slice(field_selector=fields).items


def devices(lab: Lab, node: str) -> dict[str, client.V1Device]:
    """The node's published devices by name."""
    return {d.name: d for s in slices(lab, node) for d in s.spec.devices or []}


def attribute(device: client.V1Device, name: str) -> object:
    """An attribute's value, whatever its type (string, int, bool, version)."""
    a = (device.attributes or {}).get(name)
    if a is None:
        return None
    return next((v for v in (a.string, a.int, a.bool, a.version) if v is not None), None)


# -- lab actions (clusters/actions.py DRA)


def deploy(lab: Lab) -> None:
    gates = lab.lab.spec.dra.feature_gates if lab.lab.spec.dra else {}
    install(lab.kubeconfig, lab.images["dra"], gates)


def wait_pods(lab: Lab) -> None:
    lab.kube.wait_daemonset(DAEMONSET, NAMESPACE)


def wait_slices(lab: Lab, deadline_s: float = 180) -> None:
    """Until every GPU node's slices publish as many GPUs as its inventory has."""
    want = {n.name: n.gpu_count for n in lab.lab.gpu_nodes}

    def published(found: dict[str, client.V1ResourceSlice]) -> tuple[bool, str]:
        got: dict[str, int] = {}
        for s in found.values():
            if s.spec.node_name in want:
                got[s.spec.node_name] = got.get(s.spec.node_name, 0) + len(s.spec.devices or [])
        return got == want, f"GPUs per node {got}"

    lab.kube.watch_until(f"{DRIVER} ResourceSlices of {sorted(want)}",
                         api(lab).list_resource_slice, published, deadline_s,
                         field_selector=f"spec.driver={DRIVER}")  # fmt: skip
