"""A lab's bring-up as ordered actions, the way kind creates a cluster: each action one
step with a title, run in order with one progress line (✓ or ✗ and its seconds). An action
that has nothing to do in this run (the cluster already exists, say) returns SKIP and
prints nothing.

    UP      the cluster: infrastructure, reuse or recreate, state dirs, the NVIDIA Container
            Toolkit's configs for GPU nodes' containerd, kind create, faults
    SUBJECT images, load, fake GPUs (the fake-gpus chart), their CDI spec, the plugin under
            test, its pods, every node's capacity, NFD and GFD labels
    DRA     instead of SUBJECT where the lab spec says `dra:`: fake GPUs, NFD and GFD, NVIDIA's
            DRA driver (its chart), its pods, every GPU node's ResourceSlices
    NO_PLUGIN  instead of SUBJECT for `subject: none`: images, fake GPUs, NFD and no plugin
            (any subject's DaemonSet and gpulab's GFD removed): for a suite that installs
            its own, as a user's chart would be on a cluster with a GPU driver, the NVIDIA
            Container Toolkit and NFD
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from clusters import built, dra, fakegpus, features, kindconfig, toolkit, versions
from fakenvml.errors import FakeNvmlError

if TYPE_CHECKING:
    from clusters.lab import Lab

SKIP = object()  # an action's result when it had nothing to do
SUBJECT_LABEL = f"{kindconfig.LABEL_PREFIX}/subject"  # on every DaemonSet a lab deploys


@dataclass(frozen=True)
class Action:
    title: str  # str.format()ed with lab= and subject= (the names)
    run: Callable[[Lab], object]


# -- the cluster


def infrastructure(lab: Lab) -> None:
    lab.host.kind = built.require((), lab.lab.kubernetes).kind


def reuse_or_recreate(lab: Lab) -> object:
    """A cluster left from an earlier run must answer: Docker restarts kind's nodes with the
    engine; most come back within a minute, some never do. Those are deleted (and made
    again by the next actions)."""
    if not lab.host.exists():
        return SKIP
    stale = changed_config(lab) or stale_states(lab)
    if stale:
        # Its nodes' libraries and plugins hold the old format: only a new cluster is sure.
        lab.console.print(f"[yellow]![/] {lab.name}: {stale}: recreating it", highlight=False)
        lab.down()
        return None
    ok, why = lab.kube.healthy(lab.health_deadline_s)
    if not ok:
        lab.console.print(f"[yellow]![/] {why}", highlight=False)
        lab.console.print(f"[yellow]![/] {lab.name} does not recover (left from an earlier "
                          "run and restarted?): recreating it")  # fmt: skip
        lab.down()
    return None


def kind_config(lab: Lab) -> dict:
    p = built.require((), lab.lab.kubernetes)
    if lab.lab.spec.container_toolkit and not p.toolkit:
        raise built.InfraMissing(f"the NVIDIA Container Toolkit is not built; {built.MAKE_INFRA}")
    return kindconfig.render(lab.lab, p.node_images[lab.lab.kubernetes], lab.labs_root, p.toolkit)


def changed_config(lab: Lab) -> str:
    """Why the cluster's kind config is not the one this checkout renders (its nodes' mounts
    or image differ: kind cannot change them on a running cluster), or ""."""
    want = kind_config(lab)
    have = lab.host.config()
    if have is None:
        return "its kind config was not recorded"
    return "" if have == want else "its kind config differs from this checkout's"


def stale_states(lab: Lab) -> str:
    """Why a GPU node's fake-GPU state cannot be used as it is (written by another gpulab
    version, or damaged), or "" when every one reads."""
    for n in lab.lab.gpu_nodes:
        try:
            lab.fake_gpus(n.name).node()
        except FakeNvmlError as e:
            return f"fake GPU state of {n.name}: {e}"
    return ""


def state_dirs(lab: Lab) -> object:
    """Empty fakenvml state and driver-root dirs on the host for a new cluster's GPU nodes
    (kind bind-mounts them; the fake-gpus chart's DaemonSets write into them)."""
    if lab.host.exists():
        return SKIP
    for n in lab.lab.gpu_nodes:
        for d in (lab.fake_gpus(n.name).path,
                  kindconfig.driver_dir(lab.labs_root, lab.lab, n.name)):  # fmt: skip
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        # kind bind-mounts it over the node's /sys/bus/pci/devices: it must exist first.
        kindconfig.pci_dir(lab.labs_root, lab.lab, n.name).mkdir(parents=True)
    return None


def toolkit_configs(lab: Lab) -> object:
    """The containerd and runtime configs a new cluster's GPU nodes start with."""
    if lab.host.exists() or not lab.lab.spec.container_toolkit:
        return SKIP
    p = built.require((), lab.lab.kubernetes)
    toolkit.prepare(kindconfig.toolkit_dir(lab.labs_root, lab.lab),
                    p.node_images[lab.lab.kubernetes], p.toolkit)  # fmt: skip
    return None


def create_cluster(lab: Lab) -> object:
    if lab.host.exists():
        return SKIP
    lab.created = True
    lab.host.create(kind_config(lab))
    return None


def clear_faults(lab: Lab) -> object:
    """Recover every fake GPU whose last event is a fault: a reused lab starts from its spec
    (an interrupted test never recovered what it injected), and a plugin that never re-adds
    a device it marked Unhealthy gets fresh pods."""
    if lab.created:
        return SKIP
    cleared = 0
    for n in lab.lab.gpu_nodes:
        d = lab.fake_gpus(n.name)
        for gpu in sorted(d.faulted()):
            d.recover(gpu)
            cleared += 1
    if cleared and lab.lab.spec.dra:
        # NVIDIA's DRA driver never lifts a taint it set: only a restart forgets it.
        lab.kube.restart_pods(dra.NAMESPACE, dra.POD_LABELS, dra.DAEMONSET)
    elif cleared:
        delete_subjects(lab, keep=None)
    return None


# -- the plugin under test


def lab_images(lab: Lab) -> None:
    # The newest NVIDIA image too: the images share the base layer, so one `kind load` of
    # all costs little more than of one, and a later switch of subjects loads less. A DRA
    # lab runs no device plugin: the DRA driver's image instead of the subject's.
    newest = f"nvidia-{versions.nvidia_plugin_versions()[0]}"
    wanted = ["gpulab", "workload", newest, "nfd"] + (["dra"] if lab.lab.spec.dra else [])
    products = built.require(wanted, lab.lab.kubernetes)
    lab.images = {k: products.images[k] for k in wanted}
    if lab.serves_plugin:
        lab.images["subject"] = lab.subject.image_ref(products)
    lab.images["gfd"] = products.images[newest]  # GFD is a command of NVIDIA's image


def load_images(lab: Lab) -> None:
    # GPU nodes run the lab's pods (fakenvml, the plugin, GFD, GPU workloads); NFD runs
    # on every node (its master may land on the control plane).
    gpu = [n.name for n in lab.lab.gpu_nodes]
    lab.host.load([i for k, i in lab.images.items() if k != "nfd"], gpu)
    lab.host.load([lab.images["nfd"]], [n.name for n in lab.lab.nodes])


def deploy(lab: Lab) -> None:
    """The lab's per-node plugin config and the subject's manifest, applied; every other
    subject's DaemonSet deleted first (one plugin per node, as in real clusters)."""
    lab.plugin_mark = lab.mark_plugin()
    delete_subjects(lab, keep=lab.subject.name)
    placeholders = {"GPULAB_IMAGE": lab.images["gpulab"], "SUBJECT_IMAGE": lab.images["subject"]}
    subject_docs = lab.subject.render(placeholders)
    for doc in subject_docs:
        if doc["kind"] == "DaemonSet":
            doc["metadata"].setdefault("labels", {})[SUBJECT_LABEL] = lab.subject.name
    lab.kube.apply(plugin_config(lab))
    if lab.subject.spec.chart is not None:
        lab.kube.ensure_namespace(lab.subject.default_namespace)  # helm's --create-namespace
    for doc in subject_docs:
        lab.kube.apply(doc, namespace=lab.subject.default_namespace)


def delete_subjects(lab: Lab, keep: str | None) -> None:
    """Delete the DaemonSets of subjects other than `keep` (None: all of them) and wait
    for their pods to go: one plugin under test at a time."""
    found = lab.apps.list_daemon_set_for_all_namespaces(label_selector=SUBJECT_LABEL).items
    for ds in found:
        if ds.metadata.labels.get(SUBJECT_LABEL) != keep:
            lab.kube.delete_daemonset(ds.metadata.name, ds.metadata.namespace)


def plugin_config(lab: Lab) -> dict:
    """gpulab's plugin reads its per-node config (the lab spec's extra resources) here."""
    data = {f"{n.name}.yaml": yaml.safe_dump({"extra_resources": n.spec.extra_resources})
            for n in lab.lab.gpu_nodes if n.spec.extra_resources}  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpulab-plugin-config", "namespace": "kube-system"},
            "data": data}  # fmt: skip


def remove_plugins(lab: Lab) -> None:
    delete_subjects(lab, keep=None)


def wait_plugin(lab: Lab) -> None:
    lab.kube.wait_daemonset(lab.subject.daemonset_name, lab.subject.namespace)


def wait_capacity(lab: Lab) -> None:
    lab.wait_capacity(since=lab.plugin_mark)


UP = [
    Action("Infrastructure (built by `make infra`)", infrastructure),
    Action("Cluster {lab} exists: is it healthy?", reuse_or_recreate),
    Action("Fake-GPU state dirs on the host", state_dirs),
    Action("NVIDIA Container Toolkit configs (nvidia-ctk runtime configure)", toolkit_configs),
    Action("Cluster {lab}", create_cluster),
    Action("Clear faults left from an earlier run", clear_faults),
]
SUBJECT = [
    Action("Lab images (built by `make infra`)", lab_images),
    Action("Load images into the nodes", load_images),
    Action("Fake GPUs through the fake-gpus Helm chart", fakegpus.deploy),
    Action("CDI spec of every GPU node (nvidia-ctk cdi generate)", toolkit.refresh),
    Action("Deploy {subject}", deploy),
    Action("Wait for {subject}'s pods", wait_plugin),
    Action("Wait for every GPU node's capacity", wait_capacity),
    Action("Deploy node-feature-discovery and gpu-feature-discovery", features.deploy),
    Action("Wait for GFD's and NFD's labels on every GPU node", features.wait_labels),
]
NO_PLUGIN = [
    Action("Lab images (built by `make infra`)", lab_images),
    Action("Load images into the nodes", load_images),
    Action("Fake GPUs through the fake-gpus Helm chart", fakegpus.deploy),
    Action("CDI spec of every GPU node (nvidia-ctk cdi generate)", toolkit.refresh),
    Action("No plugin under test: any subject's DaemonSet removed", remove_plugins),
    Action("No gpu-feature-discovery: a chart brings its own", features.remove_gfd),
    Action("Deploy node-feature-discovery", features.deploy_nfd),
    Action("Wait for NFD's PCI label on every GPU node", features.wait_pci_label),
]
DRA = [
    Action("Lab images (built by `make infra`)", lab_images),
    Action("Load images into the nodes", load_images),
    Action("Fake GPUs through the fake-gpus Helm chart", fakegpus.deploy),
    Action("CDI spec of every GPU node (nvidia-ctk cdi generate)", toolkit.refresh),
    Action("Deploy node-feature-discovery and gpu-feature-discovery", features.deploy),
    Action("Wait for GFD's and NFD's labels on every GPU node", features.wait_labels),
    Action(f"NVIDIA's DRA driver {dra.version()} through its Helm chart", dra.deploy),
    Action("Wait for the DRA driver's kubelet plugin pods", dra.wait_pods),
    Action("Wait for every GPU node's ResourceSlices", dra.wait_slices),
]
