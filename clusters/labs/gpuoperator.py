"""NVIDIA's GPU Operator serving a lab's GPUs: its own Helm chart (deployments/gpu-operator
of the pinned module, `make infra`'s copy) installed with `helm upgrade --install`, every
image built here, on nodes that have the driver (fakenvml's driver root) and the NVIDIA
Container Toolkit pre-installed. The operator finds the GPU nodes by NFD's PCI label (the
lab's NFD; the fake GPUs' PCI sysfs), labels them, and deploys its operands — validator,
NVIDIA's device plugin, GFD, the MIG manager, the node-status exporter — as on a GPU
cluster. Which operands run, and why the others cannot, is one values file:
clusters/charts/gpu-operator-values.yaml; a lab spec's `operator: {values: ...}` goes over it.

Health is the Node's allocatable of nvidia.com/gpu, as with a plugin under test: the
plugin the operator deploys is NVIDIA's, which never returns an Unhealthy GPU to Healthy,
so a heal restarts its pods.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from clusters import built, steps, versions
from clusters.charts import chart
from clusters.kube import or_none
from clusters.labs import actions, capacity, features, spec
from clusters.labs.actions import Action
from clusters.labs.context import Context
from clusters.labs.serving import HEAL_WAIT_S, RESOURCE, Serving, wait_pod_on

NAMESPACE = "gpu-operator"  # the chart's documented namespace
RELEASE = "gpu-operator"
VALUES = Path(__file__).resolve().parents[1] / "charts" / "gpu-operator-values.yaml"
POLICY = ("nvidia.com", "v1", "clusterpolicies")
POLICY_NAME = "cluster-policy"  # the chart's ClusterPolicy
PLUGIN = "nvidia-device-plugin-daemonset"  # the operator's DaemonSet and pod label
PLUGIN_PODS = f"app={PLUGIN}"
GFD = "gpu-feature-discovery"  # likewise
DEPLOY = "nvidia.com/gpu.deploy"  # + .<operand>: the operator's per-node switches


def version() -> str:
    return versions.get("GPU_OPERATOR_VERSION")


def chart_dir() -> Path:
    """The chart `make infra` copied from the module (clusters/infra/scripts/gpu-operator.sh)."""
    where = built.cache_dir() / "gpu-operator" / version() / "chart"
    if not (where / "Chart.yaml").is_file():
        raise built.InfraMissing(f"the GPU Operator's chart is not in {where}; {built.MAKE_INFRA}")
    return where


def chart_pin(key: str) -> str:
    """The operand version the chart pins (its values.yaml `<key>.version`)."""
    return str(yaml.safe_load((chart_dir() / "values.yaml").read_text())[key]["version"])


def images() -> dict[str, str]:
    """The chart's image keys -> the gpulab image role (`make infra`'s) each runs: NVIDIA's
    plugin at the version the chart pins; GFD from the newest plugin release (the chart's
    v0.17.4 GFD does not build here: docs/operator.md)."""
    return {
        "operator": "gpu-operator",
        "validator": "gpu-operator-validator",
        "nodeStatusExporter": "gpu-operator-validator",
        "devicePlugin": f"nvidia-{chart_pin('devicePlugin')}",
        "gfd": f"nvidia-{versions.nvidia_plugin_versions()[0]}",
        "migManager": "mig-manager",
    }


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, maps key by key (Helm's rule for values)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def values(refs: dict[str, str], over: dict[str, Any]) -> dict[str, Any]:
    """The chart's values: the project's file, each operand's image (`refs`: chart key ->
    image reference), then the lab's own."""
    out = yaml.safe_load(VALUES.read_text())
    for key, ref in refs.items():
        repo, tag = chart.split_image(ref)
        registry, _, name = repo.rpartition("/")
        out = merge(out, {key: {"repository": registry, "image": name, "version": tag}})
    return merge(out, over)


def policy(ctx: Context) -> dict[str, Any] | None:
    return or_none(client.CustomObjectsApi(ctx.kube.api).get_cluster_custom_object,
                   *POLICY, POLICY_NAME)  # fmt: skip


def policy_state(ctx: Context) -> str:
    p = policy(ctx)
    return ((p or {}).get("status") or {}).get("state", "") if p else "no ClusterPolicy"


def unsettled(ctx: Context) -> str:
    """What keeps the operator's work from being done, or "": its ClusterPolicy not
    `ready`, an operand DaemonSet not rolled out, a GPU node GFD has not labelled yet, or a
    MIG-capable one whose MIG manager has not applied its first config. The ClusterPolicy
    alone says `ready` too soon: the MIG manager's DaemonSet wants no pod until GFD has
    labelled the node MIG-capable, and that manager's first pass then restarts the plugin
    and GFD (a fault injected meanwhile reaches no plugin)."""
    state = policy_state(ctx)
    if state != "ready":
        return f"ClusterPolicy state {state!r}"
    for ds in ctx.apps.list_namespaced_daemon_set(NAMESPACE).items:
        st = ds.status
        want, up = st.desired_number_scheduled, st.number_ready
        if not want == up == (st.updated_number_scheduled or 0):
            return f"DaemonSet {ds.metadata.name}: {up} of {want} ready"
    for n in ctx.lab.gpu_nodes:
        labels = ctx.core.read_node(n.name).metadata.labels or {}
        if "nvidia.com/gpu.count" not in labels:
            return f"{n.name}: no GFD labels yet"
        mig_state = labels.get("nvidia.com/mig.config.state")
        if labels.get("nvidia.com/mig.capable") == "true" and mig_state != "success":
            return f"{n.name}: nvidia.com/mig.config.state={mig_state}"
    return ""


def wait_ready(ctx: Context, deadline_s: float = 300) -> None:
    """Until the operator's work is done (`unsettled` says nothing)."""

    def done() -> tuple[bool, str]:
        why = unsettled(ctx)
        return not why, why

    steps.poll("the GPU Operator's operands to settle", done, deadline_s)


def wait_clients_back(ctx: Context, node: str, deadline_s: float = 300) -> None:
    """After its MIG manager's `success`: until the plugin and GFD it paused each have a
    Ready pod on `node` again. Not at once: the manager also restarts the validator, whose
    preStop deletes its `*-ready` files, and both operands' init containers wait for a new
    toolkit-ready — the old validator's 30 s grace (its `sleep infinity` ignores SIGTERM),
    the new one's init containers, their 5 s polls: 38 s on an idle lab here, past a minute
    under `make test`'s load (the manager logs "Restarting validator pod to re-run all
    validations")."""
    for app in (PLUGIN, GFD):
        wait_pod_on(ctx, app, NAMESPACE, f"app={app}", node, True, deadline_s)


class GpuOperator(Serving):
    """The GPU Operator: NVIDIA's device plugin, deployed by it, serves nvidia.com/gpu."""

    name = "gpu-operator"
    switches = False  # the lab's spec chose it: no subject can take its place

    def __init__(self, op: spec.OperatorSpec) -> None:
        self.over = op.values
        self.words = f"NVIDIA's GPU Operator {version()}"

    @property
    def recorded(self) -> str:
        return self.words

    def actions(self) -> list[Action]:
        return [
            *actions.gpus(wanted=sorted(set(images().values()))),
            Action("The operator's image into the control plane", self.load_operator),
            Action("Deploy node-feature-discovery", features.deploy_nfd),
            Action("Wait for NFD's PCI label on every GPU node", features.wait_pci_label),
            Action(f"{self.words} through its Helm chart", self.install),
            Action("Wait for the ClusterPolicy and every operand to be ready", wait_ready),
            Action("Wait for every GPU node's capacity", self.wait_capacity),
        ]

    def load_operator(self, ctx: Context) -> None:
        ctx.host.load([ctx.images["gpu-operator"]], [ctx.lab.control_plane.name])

    def refs(self, ctx: Context) -> dict[str, str]:
        return {key: ctx.images[role] for key, role in images().items()}

    def install(self, ctx: Context, over: dict[str, Any] | None = None,
                timeout_s: int = 300) -> None:  # fmt: skip
        """`helm upgrade --install` with the lab's values (and `over` on top: an upgrade)."""
        vals = values(self.refs(ctx), merge(self.over, over or {}))
        chart.install(built.helm(), chart_dir(), RELEASE, NAMESPACE, vals, ctx.kubeconfig,
                      timeout_s)  # fmt: skip

    # -- health: the plugin it deployed

    def pods(self, ctx: Context, node: str | None = None) -> list[client.V1Pod]:
        return ctx.kube.pods(NAMESPACE, PLUGIN_PODS, node)

    def wait_capacity(self, ctx: Context, deadline_s: float = 300) -> None:
        """Until every GPU node shows capacity = allocatable = its GPUs."""
        want = {n.name: n.gpu_count for n in ctx.lab.gpu_nodes}
        capacity.wait_nodes(ctx, f"{RESOURCE} of {want}", set(want),
                            lambda got: all(got.get(n) == (c, c) for n, c in want.items()),
                            deadline_s, RESOURCE)  # fmt: skip

    def restart(self, ctx: Context, nodes: Collection[str] | None = None) -> None:
        ctx.kube.restart_pods(NAMESPACE, PLUGIN_PODS, PLUGIN, nodes=nodes)
        self.wait_capacity(ctx)

    def set_on(self, ctx: Context, node: str, on: bool, deadline_s: float = 120) -> None:
        """The operator's own switch: nvidia.com/gpu.deploy.device-plugin on the node."""
        ctx.kube.label_node(node, {f"{DEPLOY}.device-plugin": "true" if on else "false"})
        wait_pod_on(ctx, PLUGIN, NAMESPACE, PLUGIN_PODS, node, on, deadline_s)

    def back_on(self, ctx: Context) -> None:
        for n in ctx.lab.gpu_nodes:
            labels = ctx.core.read_node(n.name).metadata.labels or {}
            if labels.get(f"{DEPLOY}.device-plugin") == "false":
                self.set_on(ctx, n.name, True)

    def forget(self, ctx: Context) -> None:
        if self.pods(ctx):
            ctx.kube.restart_pods(NAMESPACE, PLUGIN_PODS, PLUGIN)

    def heal(self, ctx: Context, disturbed: frozenset[str]) -> str:
        self.back_on(ctx)
        if disturbed:  # NVIDIA's plugin keeps an Unhealthy GPU until it restarts
            self.restart(ctx, disturbed)
        self.wait_capacity(ctx, deadline_s=HEAL_WAIT_S)
        wait_ready(ctx)  # the ClusterPolicy ready again after its plugin pods' restart
        return ""
