"""What serves a lab's GPUs to its pods: one object, asked — never branched on.

A lab's GPUs are served either by a device plugin (the subject under test: pods ask for an
extended resource, its health shows as a Node's allocatable) or by a DRA driver (NVIDIA's,
clusters/labs/dra.py: pods ask through ResourceClaims, health shows as device taints in its
ResourceSlices), or by nothing (`subject: none`: a suite installs its own). Each kind is a
`Serving` with its own deploy actions, pods, restart, health signal and heal step; the lab,
the suites, the experiments and their reports ask it.

One way back to health (`heal`), on one rule for which GPUs are faulted
(fakenvml.node.NodeDir.faulted): recover them, make the server forget what it saw where it
would not by itself, and wait until its health signal shows every device again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from clusters.kube import ready
from clusters.labs import actions, capacity, features, kindconfig, registration
from clusters.labs.actions import SKIP, Action
from clusters.labs.context import Context
from clusters.steps import StepError
from clusters.subjects.subject import NONE, DeviceIds, Logs, Subject
from clusters.subjects.subject import load as load_subject

RESOURCE = "nvidia.com/gpu"
SUBJECT_LABEL = f"{kindconfig.LABEL_PREFIX}/subject"  # on every DaemonSet a lab deploys
# What a subject deploys that acts on the cluster by itself (its plugin, its companions'
# schedulers and webhooks): labelled with its name, deleted when another takes its place.
OWNED_KINDS = ("DaemonSet", "Deployment", "MutatingWebhookConfiguration",
               "ValidatingWebhookConfiguration")  # fmt: skip
WORKLOADS = ("DaemonSet", "Deployment")  # what a deploy waits for
# Heals wait this long for the health signal before they restart the server once more.
HEAL_WAIT_S = 60.0


class Serving(ABC):
    """What serves the GPUs: its actions, pods, restart, health signal and heal step."""

    name: str  # a column in the suites' grid, a report directory's suffix
    words: str  # in a sentence: "subject gpulab", "NVIDIA's DRA driver v0.4.1"
    resource: str = RESOURCE  # the extended resource pods ask for (none advertised: 0)
    mig_strategy: str = "none"  # GFD's MIG_STRATEGY on the lab's nodes
    # How a fault shows on the API server: "allocatable" (a Node's count of the resource
    # drops) or "taints" (the device gets a taint in the driver's ResourceSlice).
    signal: str = "allocatable"
    grace_s: int = 0  # workload pods' termination grace
    # How a container learns which GPUs it got: what NVIDIA's runtime and every NVIDIA
    # image go by (a subject states its own).
    device_ids: DeviceIds = DeviceIds(env="NVIDIA_VISIBLE_DEVICES")
    # The scheduler workload pods name (a subject's own: its `scheduler`), or the default.
    scheduler_name: str | None = None
    switches = True  # another subject (or none) may take its place on the running lab
    # What its pods log when they act, which the experiments read (a subject's `logs:`):
    # none stated unless it says.
    logs: Logs = Logs()

    @property
    def recorded(self) -> str:
        """How an experiment's recording and report name it (a plugin: the subject's name,
        which its report directory carries too)."""
        return self.name

    @property
    def report_suffix(self) -> str:
        """What an experiment's report directory adds to the experiment's name."""
        return f"-{self.name}"

    @abstractmethod
    def actions(self) -> list[Action]:
        """What deploys it on a lab whose cluster is up, in order."""

    def pods(self, ctx: Context, node: str | None = None) -> list[client.V1Pod]:
        """Its pods (on `node` only, if given): what restarts and logs."""
        return []

    def restart(self, ctx: Context, nodes: Collection[str] | None = None) -> None:
        """Its pods deleted (on `nodes` only, if given); back when the health signal shows
        every device."""
        return None  # no pods: nothing to restart

    def forget(self, ctx: Context) -> None:
        """After GPUs were recovered under it, before a deploy: make it forget what it saw,
        without waiting (the deploy's own waits follow)."""
        return None  # nothing that saw them

    def heal(self, ctx: Context, disturbed: frozenset[str]) -> str:
        """Until the health signal shows every device, restarting it where it will not come
        back by itself (`disturbed`: the nodes where a fault happened since the lab was last
        healthy; only their pods restart). Returns "" or, where it came back only after an
        unplanned restart, why."""
        return ""

    def set_on(self, ctx: Context, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop its pod on `node` (the gpulab.dev/plugin label its pods need) and
        wait until what it serves there is back, or gone."""
        raise NotImplementedError(f"{self.words}: nothing runs on a node to start or stop")

    def back_on(self, ctx: Context) -> None:
        """On again wherever a suite or an experiment stopped it on a node whose spec starts
        it (a heal's first step)."""
        label = f"{kindconfig.LABEL_PREFIX}/plugin"
        for n in ctx.lab.gpu_nodes:
            labels = ctx.core.read_node(n.name).metadata.labels or {}
            if n.spec.plugin.start and labels.get(label) != "true":
                self.set_on(ctx, n.name, True)

    def taints(self, api: client.ApiClient) -> dict[str, dict[str, list[str]]]:
        """node -> device -> its taints, where its health signal is taints."""
        return {}

    # -- workloads: how a pod asks for GPUs, and what it got

    def ask(self, ctx: Context, namespace: str, name: str, selector: str | None,
            gpus: int, mig: str | None = None) -> None:  # fmt: skip
        """Before pods named by `name` ask for `gpus` (MIG devices of profile `mig`, if
        given): whatever they refer to (a claim template)."""
        return None  # a pod names what it asks for itself

    def request(self, doc: dict, name: str, gpus: int | None) -> dict:
        """A pod document made to ask for `gpus` (None: as it stands) of what it serves."""
        if gpus is not None:
            res = doc["spec"]["containers"][0].setdefault("resources", {})
            for k in ("limits", "requests"):
                res.setdefault(k, {})[self.resource] = gpus
        return doc

    def given(self, ctx: Context, namespace: str, pod: client.V1Pod) -> list[str] | None:
        """The UUIDs of the GPUs a running pod was given where the API says it (claims), or
        None where only the pod's own environment says it."""
        return None

    def claimed(self, ctx: Context, namespace: str, pod: client.V1Pod) -> list[str]:
        """The names of the devices a pod's claim was allocated (none where pods ask for an
        extended resource)."""
        return []

    def devices(self, ctx: Context, node: str, uuids: list[str]) -> dict[str, int] | None:
        """Its device names on `node` -> the GPU index they are on, where it names devices
        apart from GPUs (a DRA driver's), else None."""
        return None

    def clean(self, ctx: Context, namespace: str) -> None:
        """What workloads in `namespace` left besides pods (claims), gone."""
        return None  # pods only


def recover(ctx: Context, since: dict[str, int] | None = None) -> tuple[int, frozenset[str]]:
    """Every faulted GPU of the lab recovered; (how many, the nodes where one was recovered
    or, with `since` — node -> journal position, as `NodeDir.position()` gave it — any GPU
    had a fault since, even one recovered meanwhile: a plugin that never re-adds a device
    still holds it)."""
    recovered, disturbed = 0, set()
    for n in ctx.lab.gpu_nodes:
        d = ctx.fake_gpus(n.name)
        for gpu in sorted(d.faulted()):
            d.recover(gpu)
            recovered += 1
            disturbed.add(n.name)
        if since is not None and n.name in since and d.faulted(since[n.name], recovered_too=True):
            disturbed.add(n.name)
    return recovered, frozenset(disturbed)


@dataclass(frozen=True)
class Healed:
    recovered: int  # GPUs recovered
    restart: str  # "" or why the server needed a restart it should not have


def heal(ctx: Context, serving: Serving, since: dict[str, int] | None = None) -> Healed:
    """The lab back to health: faulted GPUs recovered, the server healed (Serving.heal).
    With `since` (what a test touched: node -> journal position) only where a GPU had a
    fault since: a test that injected nothing leaves the lab as it found it."""
    recovered, disturbed = recover(ctx, since)
    if since is not None and not disturbed:
        return Healed(0, "")
    return Healed(recovered, serving.heal(ctx, disturbed))


def respec(ctx: Context) -> list[str]:
    """The GPU nodes of a reused cluster whose fake GPUs are not the spec's (its YAML was
    edited since: a GPU count, a profile), given the spec's now; their names."""
    changed = []
    for n in ctx.lab.gpu_nodes:
        d = ctx.fake_gpus(n.name)
        if d.exists() and [g.uuid for g in d.node().gpus] != [g.uuid for g in n.gpu_node.gpus]:
            d.init(n.gpu_node)
            changed.append(n.name)
    return changed


def clear_faults(serving: Serving) -> Action:
    """UP's last action on a reused cluster: a lab starts from its spec (an interrupted test
    never recovered what it injected; a GPU node's inventory edited in the YAML since), and
    what serves it forgets what it saw. The new inventory is written here, before the
    forget: a server discovers GPUs when it starts (the DRA driver's forget restarts it at
    once), and the chart's deploy that follows finds the state it would write."""

    def clear(ctx: Context) -> object:
        if ctx.created:
            return SKIP
        changed = respec(ctx)
        if changed:
            ctx.console.print(f"  GPUs changed in the spec since the cluster was made: "
                              f"{', '.join(changed)}", highlight=False)  # fmt: skip
        if recover(ctx)[0] or changed:
            serving.forget(ctx)
        return None

    return Action("Clear faults left from an earlier run (and GPUs the spec changed)", clear)


def wait_pod_on(ctx: Context, what: str, namespace: str, selector: str, node: str, on: bool,
                deadline_s: float) -> None:  # fmt: skip
    """Until `node` has one Ready pod of `selector` (`on`), or none."""

    def there(pods: dict[str, client.V1Pod]) -> tuple[bool, str]:
        up = ready(list(pods.values()))
        return (len(up) == 1) if on else not pods, f"{len(pods)} pods, {len(up)} ready"

    ctx.kube.watch_until(f"{what} {'on' if on else 'off'} {node}", ctx.core.list_namespaced_pod,
                         there, deadline_s, namespace=namespace, label_selector=selector,
                         field_selector=f"spec.nodeName={node}")  # fmt: skip


# -- device plugins


def delete_subjects(ctx: Context, keep: str | None) -> None:
    """Delete what subjects other than `keep` (None: all of them) deployed (OWNED_KINDS)
    and wait for their pods to go: one plugin under test at a time."""

    def mine(o: Any) -> bool:
        return o.metadata.labels.get(SUBJECT_LABEL) == keep

    def others(items: list) -> list:
        return [o for o in items if not mine(o)]

    # Webhooks first: a webhook whose server is gone would refuse (failurePolicy: Fail)
    # every pod it matches.
    ctx.kube.delete_webhook_configurations(SUBJECT_LABEL, keep=mine)
    for ds in others(ctx.apps.list_daemon_set_for_all_namespaces(
            label_selector=SUBJECT_LABEL).items):  # fmt: skip
        ctx.kube.delete_daemonset(ds.metadata.name, ds.metadata.namespace)
    # Companions' Deployments (a subject's scheduler): another subject's would schedule
    # nothing and still watch the whole cluster.
    for d in others(ctx.apps.list_deployment_for_all_namespaces(
            label_selector=SUBJECT_LABEL).items):  # fmt: skip
        ctx.kube.delete_deployment(d.metadata.name, d.metadata.namespace)


def kube_scheduler_image(ctx: Context) -> str:
    """The cluster's own kube-scheduler image (its static pod's): every kind node has it,
    so a subject's companion can run a second scheduler without a registry."""
    pods = ctx.core.list_namespaced_pod("kube-system", label_selector="component=kube-scheduler")
    if not pods.items:
        raise StepError("no kube-scheduler pod in kube-system (component=kube-scheduler)")
    return pods.items[0].spec.containers[0].image


def plugin_config(ctx: Context) -> dict:
    """gpulab's plugin reads its per-node config (the lab spec's extra resources) here."""
    data = {f"{n.name}.yaml": yaml.safe_dump({"extra_resources": n.spec.extra_resources})
            for n in ctx.lab.gpu_nodes if n.spec.extra_resources}  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpulab-plugin-config", "namespace": "kube-system"},
            "data": data}  # fmt: skip


class DevicePlugin(Serving):
    """A device plugin under test (a subject: clusters/subjects/subject.py), its DaemonSet one per
    GPU node; health is each Node's allocatable of its resource."""

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.name = subject.name
        self.words = f"subject {subject.name}"
        self.resource = subject.spec.resource
        self.mig_strategy = subject.expects.mig
        self.device_ids = subject.spec.device_ids
        # Named on each pod unless a companion webhook names it (as for a user's pods).
        sched = subject.spec.scheduler
        self.scheduler_name = sched.name if sched and not sched.webhook else None
        self.logs = subject.logs
        self.mark: registration.Mark | None = None  # taken by deploy, used by its wait
        # (kind, name, namespace) of what deploy applied and wait_pods waits for, in order.
        self.workloads: list[tuple[str, str, str]] = []

    def actions(self) -> list[Action]:
        return [
            *actions.gpus(subject=self.subject),
            Action(f"Deploy {self.name}", self.deploy),
            Action(f"Wait for {self.name}'s pods", self.wait_pods),
            Action(
                "Wait for every GPU node's capacity",
                lambda ctx: self.wait_capacity(ctx, since=self.mark),
            ),
            *actions.labels(self.mig_strategy),
        ]

    def deploy(self, ctx: Context) -> None:
        """The lab's per-node plugin config and the subject's manifest, applied; every other
        subject's DaemonSet deleted first (one plugin per node, as in real clusters)."""
        s = self.subject
        self.mark = self.mark_plugin(ctx)
        delete_subjects(ctx, keep=s.name)
        images = {"GPULAB_IMAGE": ctx.images["gpulab"], "SUBJECT_IMAGE": ctx.images["subject"]}
        if s.spec.companions:
            images["KUBE_SCHEDULER_IMAGE"] = kube_scheduler_image(ctx)
        # The companions first: a plugin that asks its scheduler's objects at start finds them.
        companions = s.companion_docs(images)
        own = [(d, s.default_namespace) for d in s.render(images)]
        for doc, _ in companions + own:
            if doc["kind"] in OWNED_KINDS:
                doc["metadata"].setdefault("labels", {})[SUBJECT_LABEL] = s.name
        ctx.kube.apply(plugin_config(ctx))
        for c in s.charts:
            ctx.kube.ensure_namespace(c.namespace)  # helm's --create-namespace
        for doc, ns in companions + own:
            ctx.kube.apply(doc, namespace=ns)

        def workload(doc: dict, ns: str) -> tuple[str, str, str]:
            return doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", ns)

        # Of its own manifest, only Deployments (a HAMi-like chart's scheduler) and the
        # plugin: a chart's other DaemonSets may select no node yet (NVIDIA's MPS control
        # daemon, until a node is labelled for it).
        self.workloads = [workload(d, ns) for d, ns in companions if d["kind"] in WORKLOADS] + [
            workload(d, ns) for d, ns in own if d["kind"] == "Deployment"] + [
            ("DaemonSet", s.daemonset_name, s.namespace)]  # fmt: skip

    def wait_pods(self, ctx: Context) -> None:
        """Every Deployment and DaemonSet deploy applied (the plugin's last) ready."""
        s = self.subject
        for kind, name, ns in self.workloads or [("DaemonSet", s.daemonset_name, s.namespace)]:
            if kind == "Deployment":
                ctx.kube.wait_deployment(name, ns)
            else:
                ctx.kube.wait_daemonset(name, ns)

    def pods(self, ctx: Context, node: str | None = None) -> list[client.V1Pod]:
        return ctx.kube.pods(self.subject.namespace, self.subject.selector, node)

    def mark_plugin(self, ctx: Context) -> registration.Mark:
        return capacity.mark(ctx, self.subject, lambda node: self.pods(ctx, node))

    def wait_capacity(self, ctx: Context, deadline_s: float = 300,
                      since: registration.Mark | None = None) -> None:  # fmt: skip
        capacity.wait_capacity(ctx, self.subject, lambda node: self.pods(ctx, node),
                               deadline_s, since)  # fmt: skip

    def restart(self, ctx: Context, nodes: Collection[str] | None = None) -> None:
        """NVIDIA's plugin only forgets an Unhealthy device when it restarts."""
        since = self.mark_plugin(ctx)
        s = self.subject
        ctx.kube.restart_pods(s.namespace, s.selector, s.daemonset_name, nodes=nodes)
        self.wait_capacity(ctx, since=since)

    def set_on(self, ctx: Context, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop the plugin's pod on `node` (its gpulab.dev/plugin label) and wait
        until the pod is there and Ready, or gone."""
        ctx.kube.label_node(node, {f"{kindconfig.LABEL_PREFIX}/plugin": "true" if on else None})
        s = self.subject
        wait_pod_on(ctx, s.daemonset_name, s.namespace, s.selector, node, on, deadline_s)

    def forget(self, ctx: Context) -> None:
        delete_subjects(ctx, keep=None)  # the deploy that follows starts fresh pods

    def heal(self, ctx: Context, disturbed: frozenset[str]) -> str:
        self.back_on(ctx)
        restarted = False
        if disturbed and self.subject.spec.expects.recovers is not True:
            # e.g. NVIDIA's never returns a GPU to Healthy. Only where a fault was: the
            # other nodes' pods restarting too cost every heal a few seconds under load.
            self.restart(ctx, disturbed)
            restarted = True
        try:
            self.wait_capacity(ctx, deadline_s=HEAL_WAIT_S)
            return ""
        except StepError as e:
            if restarted:
                raise
            # A plugin that lost track (a recovering subject that did not recover; stale
            # health after a kubelet restart): fresh pods, so it does not spill further.
            self.restart(ctx)
            return f"{self.name} came back only after a restart: {str(e).splitlines()[0]}"


def for_subject(subject: str | Path | Subject) -> Serving:
    """The device plugin a subject names, or none for `none`."""
    return NoPlugin() if subject == NONE else DevicePlugin(load_subject(subject))


class NoPlugin(Serving):
    """`subject: none`: fake GPUs, NFD, and no plugin, not even gpulab's GFD — for a suite
    that installs its own, as a user's chart would on a cluster with a GPU driver, the
    NVIDIA Container Toolkit and NFD."""

    name = "none"
    words = "no plugin (subject: none)"

    def actions(self) -> list[Action]:
        return [
            *actions.gpus(),
            Action(
                "No plugin under test: any subject's DaemonSet removed",
                lambda ctx: delete_subjects(ctx, keep=None),
            ),
            Action("No gpu-feature-discovery: a chart brings its own", features.remove_gfd),
            Action("Deploy node-feature-discovery", features.deploy_nfd),
            Action("Wait for NFD's PCI label on every GPU node", features.wait_pci_label),
        ]
