"""A lab spec -> kind's Cluster config (kind.x-k8s.io/v1alpha4).

- Each GPU node's fakenvml state dir is bind-mounted from the host at /var/lib/fakenvml
  (extraMounts), so `fakenvml inject --state-dir <host dir>` on the host reaches that
  node's library with no docker exec: one file, one inode, one inotify wake-up.
- kubelet's nodeStatusUpdateFrequency is lowered (default 10 s; labs use 2 s) so node
  capacity and allocatable reach the API server within seconds of a plugin update.
- Labels: gpulab.dev/gpu-product and gpulab.dev/gpu-count (what GPU feature discovery
  would publish, named for us), gpulab.dev/fake-gpus=true on GPU nodes (the fakenvml
  DaemonSet's selector) and gpulab.dev/plugin=true where the plugin starts at once.
"""

from __future__ import annotations

from pathlib import Path

from clusters.spec import Lab, Node
from fakenvml.yamlmodel import duration_text

NODE_STATE_DIR = "/var/lib/fakenvml"  # inside the node, and in the plugin pods
LABEL_PREFIX = "gpulab.dev"


def state_dir(labs_root: Path, lab: Lab, node: str) -> Path:
    """Where a node's fakenvml state lives on the host."""
    return labs_root / lab.spec.name / node


def node_labels(node: Node) -> dict[str, str]:
    if not node.gpu_node:
        return {}
    labels = {
        f"{LABEL_PREFIX}/fake-gpus": "true",
        f"{LABEL_PREFIX}/gpu-product": node.gpu_product,
        f"{LABEL_PREFIX}/gpu-count": str(node.gpu_count),
    }
    if node.spec.plugin.start:
        labels[f"{LABEL_PREFIX}/plugin"] = "true"
    return labels


def render(lab: Lab, image: str, labs_root: Path) -> dict:
    nodes = []
    for n in lab.nodes:
        entry: dict = {"role": n.spec.role, "image": image}
        if labels := node_labels(n):
            entry["labels"] = labels
            entry["extraMounts"] = [{
                "hostPath": str(state_dir(labs_root, lab, n.name)),
                "containerPath": NODE_STATE_DIR,
            }]  # fmt: skip
        nodes.append(entry)
    kubelet = (
        "kind: KubeletConfiguration\n"
        f"nodeStatusUpdateFrequency: {duration_text(lab.spec.node_status_update_frequency)}\n"
    )
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": lab.spec.name,
        "kubeadmConfigPatches": [kubelet],
        "nodes": nodes,
    }
