"""NVIDIA's MIG manager on a lab's GPU node, with NVIDIA's device plugin beside it, both as the
GPU Operator deploys them (its namespace, its node labels), so that a MIG layout is changed
the way platform teams change it: `nvidia.com/mig.config=<name>` on the node.

The MIG manager (clusters/charts/manifests/mig-manager.yaml) pauses the node's GPU clients
through their `nvidia.com/gpu.deploy.*` labels, waits for their pods to go, applies the
layout with nvidia-mig-parted through NVML (fakenvml's state), brings the clients back and
sets `nvidia.com/mig.config.state`. The device plugin is the `nvidia-mig` subject's
DaemonSet (NVIDIA's plugin, mixed strategy, with the driver's MIG capabilities) given the
operator's pod label and node selector, so the pause takes it off the node and the new
plugin pod serves the new layout.

Without the operator, the node labels it would set are set here: the deploy labels `true`
and `nvidia.com/mig.config=all-disabled` (the operator's default for MIG-capable nodes).
"""

from __future__ import annotations

from clusters import steps
from clusters.kube import Kube
from clusters.labs import kindconfig
from clusters.subjects import subject

NAMESPACE = "gpu-operator"  # the operator's documented namespace
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
DEPLOY_LABELS = ("nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.mig-manager")
# The operands the MIG manager pauses and brings back (it sets each to `true` if unset).
PAUSED_LABELS = tuple(f"nvidia.com/gpu.deploy.{o}" for o in (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm"))  # fmt: skip
PLUGIN_APP = "nvidia-device-plugin-daemonset"  # what the MIG manager waits to see go
PLUGIN_SUBJECT = "nvidia-mig"
DISABLED = "all-disabled"


def plugin_docs(images: dict[str, str]) -> list[dict]:
    """The nvidia-mig subject's DaemonSet (its newest version) as the operator's
    device-plugin operand: its namespace, its `app` label, on nodes whose deploy label is
    `true`."""
    s = subject.load(PLUGIN_SUBJECT)
    docs = s.render({"GPULAB_IMAGE": images["gpulab"],
                     "SUBJECT_IMAGE": images[f"nvidia-{s.version}"]})  # fmt: skip
    for d in docs:
        d["metadata"]["namespace"] = NAMESPACE
        if d["kind"] == "DaemonSet":
            d["metadata"]["name"] = PLUGIN_APP
            pod = d["spec"]["template"]
            pod["metadata"]["labels"]["app"] = PLUGIN_APP
            pod["spec"]["nodeSelector"] = {DEPLOY_LABELS[0]: "true"}
    return docs


def manager_docs(image: str) -> list[dict]:
    return steps.manifest("mig-manager.yaml", {
        "${NAMESPACE}": NAMESPACE, "${MIG_MANAGER_IMAGE}": image,
        "${STATE_DIR}": kindconfig.NODE_STATE_DIR})  # fmt: skip


def deploy(kube: Kube, images: dict[str, str], node: str, deadline_s: float = 180) -> None:
    """Both operands on `node`, its layout `all-disabled` and the MIG manager's state
    `success`."""
    kube.ensure_namespace(NAMESPACE)
    kube.label_node(node, {**dict.fromkeys(DEPLOY_LABELS, "true"), CONFIG_LABEL: DISABLED,
                           STATE_LABEL: None})  # fmt: skip
    for doc in plugin_docs(images) + manager_docs(images["mig-manager"]):
        kube.apply(doc, namespace=NAMESPACE)
    kube.wait_daemonset("nvidia-mig-manager", NAMESPACE, deadline_s)
    wait_state(kube, node, "success", deadline_s)
    kube.wait_daemonset(PLUGIN_APP, NAMESPACE, deadline_s)


def state(kube: Kube, node: str) -> str | None:
    return (kube.core.read_node(node).metadata.labels or {}).get(STATE_LABEL)


def wait_state(kube: Kube, node: str, want: str, deadline_s: float) -> None:
    """Until the node's nvidia.com/mig.config.state is `want`; a `failed` state when
    `want` is not ends the wait at once."""

    def reached(found: dict) -> tuple[bool, str]:
        n = found.get(node)
        got = (n.metadata.labels or {}).get(STATE_LABEL) if n else None
        if got == "failed" and want != "failed":
            raise steps.StepError(f"{node}: {STATE_LABEL}=failed (the MIG manager's log says why)")
        return got == want, f"{STATE_LABEL}={got}"

    kube.watch_until(f"{node}'s {STATE_LABEL}={want}", kube.core.list_node, reached,
                     deadline_s, field_selector=f"metadata.name={node}")  # fmt: skip


def reconfigure(kube: Kube, node: str, config: str, deadline_s: float = 300) -> None:
    """`nvidia.com/mig.config=<config>` on the node, and the MIG manager done with it
    (state `success`; `failed` raises). The state label is taken off first, so a
    `success` left by the last change is not read as this one's."""
    kube.label_node(node, {STATE_LABEL: None})
    kube.label_node(node, {CONFIG_LABEL: config})
    wait_state(kube, node, "success", deadline_s)


def remove(kube: Kube, node: str) -> None:
    """Both DaemonSets gone and the node's labels taken off."""
    kube.delete_daemonset("nvidia-mig-manager", NAMESPACE)
    kube.delete_daemonset(PLUGIN_APP, NAMESPACE)
    kube.label_node(node, {**dict.fromkeys(DEPLOY_LABELS + PAUSED_LABELS), CONFIG_LABEL: None,
                           STATE_LABEL: None})  # fmt: skip
