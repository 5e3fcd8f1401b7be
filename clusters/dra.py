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

Static MIG (a lab whose spec puts a GPU in MIG mode): preparing a claim for a MIG device
reads the device's two capability files at /proc/driver/nvidia/capabilities/gpu<minor>/mig/
gi<N>[/ci<M>]/access (a path fixed in the binary) and the nvidia-caps major from
/proc/devices. On a GPU host the kernel shows both in every container's /proc; here the fake
driver root holds them (`fakenvml install-driver`), a volume cannot put them under /proc
(runc refuses any mount inside /proc), so in such labs the kubelet plugin's own command
bind-mounts the root's proc/driver over /proc/driver before the unchanged binary starts
(what the nvidia-mig subject does for NVIDIA's device plugin; here a Helm post-renderer of
the release, clusters/post_render.py), and the driver's own ALT_PROC_DEVICES_PATH points
at the root's proc/devices.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from clusters import built, chart, kindconfig, post_render, spec, versions
from fakenvml import mig

if TYPE_CHECKING:
    from clusters.lab import Lab

MODULE = "sigs.k8s.io/dra-driver-nvidia-gpu"
CHART_DIR = "deployments/helm/dra-driver-nvidia-gpu"
RELEASE = NAMESPACE = "nvidia-dra-driver-gpu"  # as in the driver's install docs
DRIVER = "gpu.nvidia.com"  # its driver name: ResourceSlices, DeviceClass, taint keys
DEVICE_CLASS = "gpu.nvidia.com"
DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"  # <chart name>-kubelet-plugin
POD_LABELS = "dra-driver-nvidia-gpu-component=kubelet-plugin"  # its pods' selector
CONTAINER = "gpus"  # the kubelet plugin's container (the chart's `gpus` resources)
CONTAINER_DRIVER_ROOT = "/driver-root"  # where the chart mounts nvidiaDriverRoot


def version() -> str:
    return versions.get("DRA_DRIVER_VERSION")


def chart_dir() -> Path:
    where = chart.module_dir(f"{MODULE}@{version()}") / CHART_DIR
    if not (where / "Chart.yaml").is_file():
        raise built.InfraMissing(f"the DRA driver's chart is not in {where}; {built.MAKE_INFRA}")
    return where


# Static MIG labs: the driver root's procfs files where the kubelet plugin reads them.
PROC_DEVICES = f"{CONTAINER_DRIVER_ROOT}/proc/devices"
MOUNT_PROC_DRIVER = f"mount --bind {CONTAINER_DRIVER_ROOT}/proc/driver /proc/driver"


def has_mig(lab: spec.Lab) -> bool:
    """Whether the lab's spec puts a GPU in MIG mode (its inventory's `mig:`)."""
    return any(g.mig_layout for n in lab.gpu_nodes if n.gpu_node for g in n.gpu_node.gpus)


def values(image: str, feature_gates: dict[str, bool], static_mig: bool = False,
           library: str = "") -> dict[str, Any]:  # fmt: skip
    """The chart's values. `library`: the gpulab image whose fakenvml the driver root holds,
    as a pod annotation, so a new library rolls the kubelet plugins (a running one keeps
    the library it loaded: a lab reused after `make infra` tested the old one)."""
    repo, tag = chart.split_image(image)
    fake_gpus = {"key": f"{kindconfig.LABEL_PREFIX}/fake-gpus", "operator": "In",
                 "values": ["true"]}  # fmt: skip
    plugin: dict[str, Any] = {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [fake_gpus]}]}}}}  # fmt: skip
    if library:
        plugin["podAnnotations"] = {f"{kindconfig.LABEL_PREFIX}/fakenvml": library}
    if static_mig:
        plugin["containers"] = {CONTAINER: {"env": [
            {"name": "ALT_PROC_DEVICES_PATH", "value": PROC_DEVICES}]}}  # fmt: skip
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "nvidiaDriverRoot": kindconfig.DRIVER_ROOT,
        # The chart's guard against running beside a device plugin: the lab runs none.
        "gpuResourcesEnabledOverride": True,
        "resources": {"computeDomains": {"enabled": False}},
        "featureGates": {k: str(v).lower() for k, v in feature_gates.items()},
        "kubeletPlugin": plugin,
    }


def install(kubeconfig: Path, image: str, feature_gates: dict[str, bool],
            static_mig: bool = False, library: str = "", timeout_s: int = 240) -> str:  # fmt: skip
    return chart.install(built.helm(), chart_dir(), RELEASE, NAMESPACE,
                         values(image, feature_gates, static_mig, library), kubeconfig,
                         timeout_s, renderer(static_mig))  # fmt: skip


def renderer(static_mig: bool) -> list[str] | None:
    """In static-MIG labs, the helm post-renderer that makes the kubelet plugin's command
    bind-mount the root's proc/driver over /proc/driver before the plugin starts."""
    if not static_mig:
        return None
    return [sys.executable, str(Path(post_render.__file__)), CONTAINER, MOUNT_PROC_DRIVER]


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
    static_mig = has_mig(lab.lab)
    install(lab.kubeconfig, lab.images["dra"], gates, static_mig, lab.images["gpulab"])


def wait_pods(lab: Lab) -> None:
    lab.kube.wait_daemonset(DAEMONSET, NAMESPACE)


def expected_devices(lab: Lab, node: str) -> int:
    """How many devices the driver publishes for `node`, by its fake state: a GPU in MIG
    mode as its MIG devices (v0.4.1 without DynamicMIG: the statically made ones, and
    nothing for one with none), any other GPU as itself."""
    return sum(sum(1 for gi in m.gis.values() for _ in gi.cis) if m.current else 1
               for m in mig.layout(lab.fake_gpus(node)))  # fmt: skip


def wait_slices(lab: Lab, deadline_s: float = 180, untainted: bool = False) -> None:
    """Until every GPU node's slices publish as many devices as its fake GPUs make (and,
    with `untainted`, none of them has a taint: a restarted driver's slices replace the
    old ones, and between the two a node may have none, which is not "untainted")."""
    want = {n.name: expected_devices(lab, n.name) for n in lab.lab.gpu_nodes}

    def published(found: dict[str, client.V1ResourceSlice]) -> tuple[bool, str]:
        got: dict[str, int] = {}
        tainted: list[str] = []
        for s in found.values():
            if s.spec.node_name in want:
                got[s.spec.node_name] = got.get(s.spec.node_name, 0) + len(s.spec.devices or [])
                tainted += [f"{s.spec.node_name}/{d.name}" for d in s.spec.devices or []
                            if d.taints and untainted]  # fmt: skip
        seen = f"devices per node {got}" + (f", tainted: {', '.join(sorted(tainted))}"
                                            if tainted else "")  # fmt: skip
        return got == want and not tainted, seen

    what = "untainted " if untainted else ""
    lab.kube.watch_until(f"{what}{DRIVER} ResourceSlices of {sorted(want)}",
                         api(lab).list_resource_slice, published, deadline_s,
                         field_selector=f"spec.driver={DRIVER}")  # fmt: skip
