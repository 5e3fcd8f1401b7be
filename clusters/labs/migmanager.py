"""NVIDIA's MIG manager on a lab's GPU node, with NVIDIA's device plugin and GFD beside it,
all three as the GPU Operator deploys them (its namespace, its pod labels, its node labels),
so that a MIG layout is changed the way platform teams change it:
`nvidia.com/mig.config=<name>` on the node.

The MIG manager (clusters/charts/manifests/mig-manager.yaml) pauses the node's GPU clients
through their `nvidia.com/gpu.deploy.*` labels, waits for their pods to go, applies the
layout with nvidia-mig-parted through NVML (fakenvml's state), brings the clients back and
sets `nvidia.com/mig.config.state`. The device plugin is the `nvidia-mig` subject's
DaemonSet (NVIDIA's plugin with the driver's MIG capabilities) and GFD the lab's GFD
DaemonSet (clusters/labs/features.py), both with the MIG strategy asked for and given the
operator's namespace, pod label and node selector: the pause takes them off the node, and
their new pods serve and label the new layout.

Without the operator, the node labels it would set are set here: the deploy labels `true`
and `nvidia.com/mig.config=all-disabled` (the operator's default for MIG-capable nodes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes import client

from clusters import steps
from clusters.kube import absent_ok
from clusters.labs import capacity, features, kindconfig
from clusters.labs.context import Context
from clusters.subjects import subject

NAMESPACE = "gpu-operator"  # the operator's documented namespace
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
MANAGER = "nvidia-mig-manager"
# The operands the MIG manager pauses and brings back (it sets each to `true` if unset),
# and the one that deploys it.
PAUSED_LABELS = tuple(f"nvidia.com/gpu.deploy.{o}" for o in (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm"))  # fmt: skip
MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
# The operator's pod label of each operand the suite runs (what the MIG manager waits to
# see go), and the deploy label that puts it on a node.
OPERANDS = {
    "nvidia-device-plugin-daemonset": "nvidia.com/gpu.deploy.device-plugin",
    "gpu-feature-discovery": "nvidia.com/gpu.deploy.gpu-feature-discovery",
}
PLUGIN, GFD = OPERANDS
PLUGIN_SUBJECT = "nvidia-mig"
DISABLED = "all-disabled"
NODE_FEATURES = ("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")


def as_operand(docs: list[dict], app: str) -> list[dict]:
    """Manifests moved into the operator's namespace, their DaemonSet named and its pods
    labelled `app` (the operator's names) on nodes whose deploy label is `true`."""
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["namespace"] = NAMESPACE
        for s in d.get("subjects", []):
            s["namespace"] = NAMESPACE
        if d["kind"] == "DaemonSet":
            d["metadata"]["name"] = app
            pod = d["spec"]["template"]
            pod["metadata"]["labels"]["app"] = app
            pod["spec"]["nodeSelector"] = {OPERANDS[app]: "true"}
    return docs


def operand_docs(ctx: Context, strategy: str) -> list[dict]:
    """The device plugin (the nvidia-mig subject's DaemonSet, its newest version, with the
    config manager) and GFD, with MIG strategy `strategy`, as the operator's operands."""
    s = subject.load(PLUGIN_SUBJECT)
    image = ctx.images[f"nvidia-{s.version}"]
    plugin = s.render({"GPULAB_IMAGE": ctx.images["gpulab"], "SUBJECT_IMAGE": image})
    for d in plugin:
        if d["kind"] == "DaemonSet":
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["env"] = [e for e in c["env"] if e["name"] != "MIG_STRATEGY"]
            c["env"].append({"name": "MIG_STRATEGY", "value": strategy})
            with_config_manager(d["spec"]["template"]["spec"], image)
    return (as_operand(plugin, PLUGIN) + config_manager_docs()
            + as_operand(features.gfd_docs(ctx, strategy), GFD))  # fmt: skip


# The device plugin's configs, by name (the operator's devicePlugin.config: a ConfigMap of
# plugin configs, one picked per node by the nvidia.com/device-plugin.config label). The
# MIG strategy stays the plugin's env (a flag set by env overrides the file's).
CONFIG_MAP = "device-plugin-configs"
CONFIG_LABEL_PLUGIN = "nvidia.com/device-plugin.config"
DEFAULT_PLUGIN_CONFIG = "default"
TIME_SLICED = {"ts-4": 4}
# The process the config manager signals: its argv[0] (the config manager's
# PROCESS_TO_SIGNAL; the kernel's comm keeps only 15 characters of it).
PLUGIN_PROCESS = "nvidia-device-plugin"
PLUGIN_CONFIGS = {
    DEFAULT_PLUGIN_CONFIG: "version: v1\n",
    **{name: ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
              f"      - name: nvidia.com/gpu\n        replicas: {n}\n")
       for name, n in TIME_SLICED.items()},
}  # fmt: skip


T = TypeVar("T")


# SIGHUPs switch_config gives the plugin at most after the kubelet dropped its registration:
# each one is the same few-ms race again, which a loaded node may lose again.
REREGISTERS = 3


def switch_config(ctx: Context, node: str, config: str | None, read: Callable[[], T],
                  want: T, deadline_s: float = 120) -> tuple[T, str]:  # fmt: skip
    """`nvidia.com/device-plugin.config=<config>` on `node` (None: the label off, the
    default config); then read() until it is `want` or the deadline: its last value, and a
    note ("" when nothing was done but the label).

    NVIDIA's plugin takes the config manager's SIGHUP by registering its socket again a
    few ms after stopping it; a v1.34 kubelet that handles the old stream's end after that
    Register drops the new registration (registration.DROPPED; in CI under load): at once,
    or silently, so that allocatable reads `want` and keeps it after the plugin stops
    serving, and a later test sees it. So the kubelet's own lines are read even when
    `want` was read. Only where they show the drop, the plugin gets a SIGHUP more, as from
    its config manager, and its new registration is waited for and read again (at most
    REREGISTERS times). The note says so, with the kubelet's lines."""
    since = time.time() - 1  # the node's journal is this host's clock, in whole seconds

    def registrations() -> tuple[int, list[str]]:
        return capacity.registrations_since(ctx, node, "nvidia.com/gpu", since)

    ctx.kube.label_node(node, {CONFIG_LABEL_PLUGIN: config})
    got = steps.settle(read, want, deadline_s)
    asked, lines = registrations()
    seen: list[str] = []
    while lines and len(seen) < REREGISTERS:
        seen.append(" | ".join(lines))
        ctx.node_exec(node, "pkill", "-HUP", "-f", f"^{PLUGIN_PROCESS}( |$)")
        steps.settle(lambda before=asked: registrations()[0] > before, True, 30)
        got = steps.settle(read, want, deadline_s)
        asked, lines = registrations()
    if not seen:
        return got, ""
    return got, ("the kubelet dropped the plugin's registration (kubernetes/kubernetes#121994: "
                 + "; then ".join(seen) + f"); {len(seen)} SIGHUP(s) more to the plugin"
                 + ("" if not lines else ", the last dropped too"))  # fmt: skip


def config_manager_docs() -> list[dict]:
    """The configs' ConfigMap, and what the config manager may read: its node's labels."""
    sa = {"kind": "ServiceAccount", "name": "nvidia-device-plugin", "namespace": NAMESPACE}
    role = "gpulab-nvidia-device-plugin-config-manager"
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE}, "data": PLUGIN_CONFIGS},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": sa["name"], "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}},
    ]  # fmt: skip


def with_config_manager(pod: dict, image: str) -> None:
    """The pod given NVIDIA's config manager as the operator gives it
    (assets/state-device-plugin): an init container that writes the config the node's
    label names (ONESHOT), a sidecar that writes it again when the label changes and sends
    the plugin SIGHUP (a shared process namespace), the plugin reading /config/config.yaml."""

    def manager(name: str, oneshot: bool) -> dict:
        env = {"ONESHOT": str(oneshot).lower(), "KUBECONFIG": "",
               "NODE_LABEL": CONFIG_LABEL_PLUGIN, "CONFIG_FILE_SRCDIR": "/available-configs",
               "CONFIG_FILE_DST": "/config/config.yaml", "DEFAULT_CONFIG": DEFAULT_PLUGIN_CONFIG,
               "SEND_SIGNAL": str(not oneshot).lower(), "SIGNAL": "" if oneshot else "1",
               "PROCESS_TO_SIGNAL": "" if oneshot else PLUGIN_PROCESS}  # fmt: skip
        return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["config-manager"], "securityContext": {"privileged": True},
                "env": [{"name": "NODE_NAME",
                         "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        *({"name": k, "value": v} for k, v in env.items())],
                "volumeMounts": [{"name": "available-configs", "mountPath": "/available-configs"},
                                 {"name": "config", "mountPath": "/config"}]}  # fmt: skip

    pod["serviceAccountName"] = "nvidia-device-plugin"
    pod["shareProcessNamespace"] = True
    pod.setdefault("initContainers", []).append(manager("config-manager-init", True))
    plugin = pod["containers"][0]
    plugin["env"].append({"name": "CONFIG_FILE", "value": "/config/config.yaml"})
    # The config manager links /config/config.yaml to the chosen file: both are mounted.
    plugin["volumeMounts"] += [{"name": "available-configs", "mountPath": "/available-configs"},
                               {"name": "config", "mountPath": "/config"}]  # fmt: skip
    pod["containers"].append(manager("config-manager", False))
    pod["volumes"] += [{"name": "available-configs", "configMap": {"name": CONFIG_MAP}},
                       {"name": "config", "emptyDir": {}}]  # fmt: skip


def manager_docs(image: str) -> list[dict]:
    return steps.manifest("mig-manager.yaml", {
        "${NAMESPACE}": NAMESPACE, "${MIG_MANAGER_IMAGE}": image,
        "${STATE_DIR}": kindconfig.NODE_STATE_DIR})  # fmt: skip


def deploy(ctx: Context, node: str, image: str, strategy: str, deadline_s: float = 180) -> None:
    """The MIG manager (`image`), the plugin and GFD on `node`, its layout `all-disabled`
    and the MIG manager's state `success`."""
    kube = ctx.kube
    kube.ensure_namespace(NAMESPACE)
    kube.label_node(node, {**dict.fromkeys(OPERANDS.values(), "true"), MANAGER_LABEL: "true",
                           CONFIG_LABEL: DISABLED, STATE_LABEL: None})  # fmt: skip
    for doc in operand_docs(ctx, strategy) + manager_docs(image):
        kube.apply(doc, namespace=NAMESPACE)
    kube.wait_daemonset(MANAGER, NAMESPACE, deadline_s)
    wait_state(ctx, node, "success", deadline_s)
    for app in OPERANDS:
        kube.wait_daemonset(app, NAMESPACE, deadline_s)


def wait_state(ctx: Context, node: str, want: str, deadline_s: float) -> None:
    """Until the node's nvidia.com/mig.config.state is `want`; a `failed` state when
    `want` is not ends the wait at once."""

    def reached(found: dict) -> tuple[bool, str]:
        n = found.get(node)
        got = (n.metadata.labels or {}).get(STATE_LABEL) if n else None
        if got == "failed" and want != "failed":
            raise steps.StepError(f"{node}: {STATE_LABEL}=failed (the MIG manager's log says why)")
        return got == want, f"{STATE_LABEL}={got}"

    ctx.kube.watch_until(f"{node}'s {STATE_LABEL}={want}", ctx.kube.core.list_node, reached,
                         deadline_s, field_selector=f"metadata.name={node}")  # fmt: skip


def label(ctx: Context, node: str, config: str) -> None:
    """`nvidia.com/mig.config=<config>` on the node, its state label taken off first so a
    state left by the last change is not read as this one's."""
    ctx.kube.label_node(node, {STATE_LABEL: None})
    ctx.kube.label_node(node, {CONFIG_LABEL: config})


def reconfigure(ctx: Context, node: str, config: str, deadline_s: float = 300) -> None:
    """The label set and the MIG manager done with it (`success`; `failed` raises)."""
    label(ctx, node, config)
    wait_state(ctx, node, "success", deadline_s)


def remove(ctx: Context, node: str) -> None:
    """The DaemonSets gone, GFD's NodeFeature objects deleted (nfd-master then takes their
    labels off) and the node's operator labels taken off."""
    kube = ctx.kube
    for name in (MANAGER, *OPERANDS):
        kube.delete_daemonset(name, NAMESPACE)
    group, version, plural = NODE_FEATURES
    custom = client.CustomObjectsApi(kube.api)
    for f in custom.list_namespaced_custom_object(group, version, NAMESPACE, plural)["items"]:
        # Gone with its pod, maybe: GFD makes the pod its owner.
        absent_ok(custom.delete_namespaced_custom_object, group, version, NAMESPACE, plural,
                  f["metadata"]["name"])  # fmt: skip
    kube.label_node(node, {**dict.fromkeys((*PAUSED_LABELS, MANAGER_LABEL)), CONFIG_LABEL: None,
                           STATE_LABEL: None, CONFIG_LABEL_PLUGIN: None})  # fmt: skip
