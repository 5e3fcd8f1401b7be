"""A lab spec -> kind's Cluster config (kind.x-k8s.io/v1alpha4).

- Each GPU node's fakenvml state dir is bind-mounted from the host at /var/lib/fakenvml
  (extraMounts), so `fakenvml inject --state-dir <host dir>` on the host reaches that
  node's library with no docker exec: one file, one inode, one inotify wake-up.
- The same dir is mounted a second time inside the node's driver root, where fakenvml
  installs the library: a library loaded from <root>/usr/lib/x86_64-linux-gnu reads
  <root>/var/lib/fakenvml when FAKENVML_STATE_DIR is unset, so a plugin whose manifest
  mounts only the driver root (NVIDIA's Helm chart: no extra env or volumes) finds the state.
- The driver root is a mount of its own (a host dir), as a driver container's is on a GPU
  node: kind's /run is tmpfs mounted noexec, where NVIDIA's DRA driver could not run the
  root's nvidia-smi (its init container's check: "Permission denied").
- The fake GPUs' PCI sysfs (fakenvml writes it in the driver root: vendor 0x10de, class,
  device and subsystem ids per profile) is bind-mounted over the node's
  /sys/bus/pci/devices, where node-feature-discovery (any chart's: it mounts the node's
  /sys) finds them, as on a GPU node (feature.node.kubernetes.io/pci-10de.present).
  The mount lives in the node container's own mount namespace: the host's sysfs and
  devices are untouched; the node's real PCI devices are hidden from its pods.
- GPU nodes of labs with the NVIDIA Container Toolkit get its binaries (`make infra`'s)
  read-only at /usr/local/nvidia/toolkit and the containerd and runtime configs that
  `nvidia-ctk runtime configure` wrote for the lab's node image (clusters/labs/toolkit.py):
  containerd starts with the nvidia runtime as its default.
- kubelet's nodeStatusUpdateFrequency is lowered (default 10 s; labs use 1 s) so node
  capacity and allocatable reach the API server within a second of a plugin update. A
  suite waits that long after most faults and heals: the seed lab's two fault files
  (gpulab's plugin, an idle machine) took 59 s at 2 s, 40 s at 1 s. Each pass reads the
  Node from the API server's watch cache (kubelet_node_status.go, tryUpdateNodeStatus)
  and writes only what changed: its nodeStatusReportFrequency is set to 1 min (left unset, it
  follows an explicit update frequency, and every node posted its whole status every
  pass whether or not anything had changed: at 2 s, a lab of three nodes made 1.5 Node
  writes a second, each sent to every watcher). A change is still posted at the next
  pass (KubeletConfiguration's reference).
- The controller manager and the scheduler run without leader election: a lab has one of
  each, and each renewed its Lease every 2 s (one write a second per lab, for nothing).
- A lab whose fleet nodes' Leases last longer than a kubelet's (`fleet_node_lease`) gets a
  node-monitor-grace-period as much longer, so a copy renewing on time stays Ready.
- On a cgroup v1 host, kubelets from 1.35 on get `failCgroupV1: false` (they refuse to
  start otherwise); cgroup v1 is in maintenance upstream, and GitHub's runners are v2.
- Labels: gpulab.dev/fake-gpus=true on GPU nodes (the fakenvml and GFD DaemonSets'
  selector) and gpulab.dev/plugin=true where the plugin starts at once. What the GPUs are
  (nvidia.com/gpu.product, .memory, .count ...) is labelled by NVIDIA's
  gpu-feature-discovery through node-feature-discovery, as in real clusters
  (clusters/labs/features.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from clusters import versions
from clusters.labs.spec import NODE_GRACE_MARGIN_S, NODE_LEASE_S, Lab, Node
from fakenvml.yamlmodel import duration_text

NODE_STATE_DIR = "/var/lib/fakenvml"  # inside the node, and in the plugin pods
DRIVER_ROOT = "/run/fakenvml/driver"  # where fakenvml's DaemonSet installs the library
# Where the GPU Operator's driver container lays out its root, and where its operands look
# (the node-status exporter whatever hostPaths.driverInstallDir says): operator labs show
# the same root there too.
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
PCI_DEVICES = "sys/bus/pci/devices"  # in the driver root (fakenvml/driver.py), and on nodes
LABEL_PREFIX = "gpulab.dev"
# A fleet node's label (clusters/labs/fleet.py), its model's name: what is not a kind node.
FLEET_LABEL = f"{LABEL_PREFIX}/fleet"
# The labs' own DaemonSets that tolerate every taint (kube-proxy, NFD's worker) get this
# affinity: else each fleet copy gets their pods, and KWOK runs them all. At 5,000 copies
# that was 10,020 pods more, and the fleet never got Ready (docs/fleet.md).
OFF_FLEET = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": FLEET_LABEL, "operator": "DoesNotExist"}]}]
}}}  # fmt: skip
TOOLKIT_DIR = "/usr/local/nvidia/toolkit"  # where NVIDIA's GPU Operator installs it on nodes
# What clusters/labs/toolkit.py writes in a lab's toolkit dir -> where GPU nodes get it.
TOOLKIT_FILES = {
    "config.toml": "/etc/containerd/config.toml",  # imports conf.d/*.toml
    "99-nvidia.toml": "/etc/containerd/conf.d/99-nvidia.toml",  # nvidia-ctk's default
    "runtime.toml": "/etc/nvidia-container-runtime/config.toml",
}


# The pod network's range, of which the controller manager gives each node a /24 (its
# podCIDR). kind's default, 10.244.0.0/16, holds 256 nodes: past that a fleet's copies got
# none, and the controller manager retried each one about every 40 s (a CIDRNotAvailable
# event each time: 750 copies of 1,000 did so for as long as they lived). /11 holds 8,192,
# as a cluster of thousands of nodes is given, and keeps clear of kind's Services (10.96.0.0/16).
POD_SUBNET = "10.224.0.0/11"
NODE_STATUS_REPORT = "1m"  # a Node's status when nothing changed (kubelet's default: 5m)
# kubeadm v1beta4 (kind's for these Kubernetes versions) lists extraArgs; a patch replaces
# the list, so kind's own controller-manager argument is repeated. A lab's
# control_plane_args come after, and win over these.
CONTROL_PLANE_ARGS = {
    "controllerManager": {"enable-hostpath-provisioner": "true", "leader-elect": "false"},
    "scheduler": {"leader-elect": "false"},
    "apiServer": {},
}


def control_plane(lab: Lab) -> str:
    """kubeadm's ClusterConfiguration patch: each component's extraArgs."""
    mine = lab.spec.control_plane_args
    by = {"controllerManager": mine.controller_manager, "scheduler": mine.scheduler,
          "apiServer": mine.api_server}  # fmt: skip
    ours = {k: dict(v) for k, v in CONTROL_PLANE_ARGS.items()}
    if (lease := int(lab.spec.fleet_node_lease)) != NODE_LEASE_S:
        grace = lease + NODE_GRACE_MARGIN_S
        ours["controllerManager"]["node-monitor-grace-period"] = f"{grace}s"
    doc: dict = {"kind": "ClusterConfiguration"}
    for part, args in ours.items():
        if merged := {**args, **by[part]}:
            doc[part] = {"extraArgs": [{"name": k, "value": v} for k, v in merged.items()]}
    return yaml.safe_dump(doc, sort_keys=False)


def state_dir(labs_root: Path, lab: Lab, node: str) -> Path:
    """Where a node's fakenvml state lives on the host."""
    return labs_root / lab.spec.name / node


def driver_dir(labs_root: Path, lab: Lab, node: str) -> Path:
    """The host dir a node's driver root is mounted from."""
    return labs_root / lab.spec.name / f"{node}.driver"


def toolkit_dir(labs_root: Path, lab: Lab) -> Path:
    """The host dir of a lab's GPU nodes' containerd and runtime configs (TOOLKIT_FILES)."""
    return labs_root / lab.spec.name / "toolkit"


def pci_dir(labs_root: Path, lab: Lab, node: str) -> Path:
    """The host dir of a node's fake PCI devices (inside its driver root's dir)."""
    return driver_dir(labs_root, lab, node) / PCI_DEVICES


def cgroup_v1() -> bool:
    """Whether this host (whose kernel kind's nodes share) mounts cgroup v1: no unified
    hierarchy's cgroup.controllers at the root."""
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def host_kubelet_config(kubernetes: str) -> str:
    """What a kubelet of that version needs on this host: failCgroupV1: false from 1.35
    on a cgroup v1 host (KubeletConfiguration fields, one per line; "" when nothing)."""
    return "failCgroupV1: false\n" if versions.kube_minor(kubernetes) >= 35 and cgroup_v1() else ""


def node_labels(node: Node) -> dict[str, str]:
    if not node.gpu_node:
        return {}
    labels = {
        f"{LABEL_PREFIX}/fake-gpus": "true",
    }
    if node.spec.plugin.start:
        labels[f"{LABEL_PREFIX}/plugin"] = "true"
    return labels


def render(lab: Lab, image: str, labs_root: Path, toolkit: str = "",
           worker_image: str | None = None) -> dict:  # fmt: skip
    """kind's config; `toolkit` is the host dir of the toolkit's binaries (infra's
    Products.toolkit), needed where the lab spec has container_toolkit. Workers and GPU
    nodes run `worker_image` where given (the same Kubernetes with an older kubelet: kind
    joins workers and inits the control plane without kubeadm's preflight checks, so the
    skew needs nothing else; a lab whose GPUs sit on its control plane runs the older
    kubelet there, where its device plugins meet it)."""
    if lab.spec.container_toolkit and lab.gpu_nodes and not toolkit:
        raise ValueError(f"lab {lab.spec.name} runs the NVIDIA Container Toolkit: no dir of it")
    nodes = []
    for n in lab.nodes:
        older = (n.spec.role == "worker" or n.gpu_node) and worker_image
        entry: dict = {"role": n.spec.role, "image": worker_image if older else image}
        if labels := node_labels(n):
            entry["labels"] = labels
            host = str(state_dir(labs_root, lab, n.name))
            roots = (DRIVER_ROOT, *((OPERATOR_DRIVER_ROOT,) if lab.spec.operator else ()))
            mounts = (NODE_STATE_DIR, *(r + NODE_STATE_DIR for r in roots))
            entry["extraMounts"] = [
                *({"hostPath": str(driver_dir(labs_root, lab, n.name)), "containerPath": r}
                  for r in roots),
                *({"hostPath": host, "containerPath": m} for m in mounts),
                {"hostPath": str(pci_dir(labs_root, lab, n.name)),
                 "containerPath": "/" + PCI_DEVICES}]  # fmt: skip
            if lab.spec.container_toolkit:
                configs = toolkit_dir(labs_root, lab)
                entry["extraMounts"] += [
                    {"hostPath": toolkit, "containerPath": TOOLKIT_DIR, "readOnly": True},
                    *({"hostPath": str(configs / f), "containerPath": path, "readOnly": True}
                      for f, path in TOOLKIT_FILES.items())]  # fmt: skip
        nodes.append(entry)
    kubelet = (
        "kind: KubeletConfiguration\n"
        f"nodeStatusUpdateFrequency: {duration_text(lab.spec.node_status_update_frequency)}\n"
        f"nodeStatusReportFrequency: {NODE_STATUS_REPORT}\n"
    )
    # One KubeletConfiguration for every node: the newest kubelet decides (an older one in
    # the skew knows failCgroupV1 too: it came in 1.31).
    kubelet += host_kubelet_config(lab.kubernetes)
    config = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": lab.spec.name,
        "networking": {"podSubnet": POD_SUBNET},
        "kubeadmConfigPatches": [kubelet, control_plane(lab)],
        "nodes": nodes,
    }
    if lab.spec.feature_gates:
        config["featureGates"] = dict(lab.spec.feature_gates)
    return config
