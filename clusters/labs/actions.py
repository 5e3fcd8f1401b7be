"""A lab's bring-up as ordered actions, the way kind creates a cluster: each action one
step with a title, run in order with one progress line (✓ or ✗ and its seconds). An action
that has nothing to do in this run (the cluster already exists, say) returns SKIP and
prints nothing.

    UP        the cluster: infrastructure, reuse or recreate, state dirs, the NVIDIA
              Container Toolkit's configs for GPU nodes' containerd, kind create
    gpus()    images (gpulab's and the server's), load, fake GPUs (the fake-gpus chart),
              their CDI spec: the first actions of whatever serves the GPUs

What serves the GPUs (clusters/labs/serving.py: a device plugin under test, or none;
clusters/labs/dra.py: NVIDIA's DRA driver) brings its own actions after those. Every action
takes the lab's Context (clusters/labs/context.py), never the Lab that runs it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clusters import built, versions
from clusters.labs import fakegpus, features, kindconfig, toolkit
from clusters.labs.context import Context
from clusters.subjects.subject import Subject
from fakenvml.errors import FakeNvmlError

SKIP = object()  # an action's result when it had nothing to do


@dataclass(frozen=True)
class Action:
    title: str  # str.format()ed with lab= (its name)
    run: Callable[[Context], object]


# -- the cluster


def infrastructure(ctx: Context) -> None:
    ctx.host.kind = built.require((), ctx.lab.kubernetes, ctx.lab.kubelet).kind


def reuse_or_recreate(ctx: Context) -> object:
    """A cluster left from an earlier run must answer: Docker restarts kind's nodes with the
    engine; most come back within a minute, some never do. Those are deleted (and made
    again by the next actions), as is one whose kubeconfig is gone (a run killed while it
    created or deleted it): nothing can reach it, and its name blocks a new one."""
    state = ctx.host.state()
    if state == "orphaned":
        ctx.console.print(f"[yellow]![/] {ctx.name}: kind has the cluster but the lab has no "
                          "kubeconfig (a run killed while it created or deleted it): recreating it",
                          highlight=False)  # fmt: skip
        ctx.delete()
        return None
    if state == "none":
        return SKIP
    stale = changed_config(ctx) or stale_states(ctx)
    if stale:
        # Its nodes' libraries and plugins hold the old format: only a new cluster is sure.
        ctx.console.print(f"[yellow]![/] {ctx.name}: {stale}: recreating it", highlight=False)
        ctx.delete()
        return None
    # The lab's own nodes: a fleet's KWOK nodes are Ready only while KWOK runs, and a
    # suite that stopped half-way may have left some (the next fleet.up replaces them).
    ok, why = ctx.kube.healthy(ctx.health_deadline_s, f"!{kindconfig.FLEET_LABEL}")
    if not ok:
        ctx.console.print(f"[yellow]![/] {why}", highlight=False)
        ctx.console.print(f"[yellow]![/] {ctx.name} does not recover (left from an earlier "
                          "run and restarted?): recreating it")  # fmt: skip
        ctx.delete()
    return None


def kind_config(ctx: Context) -> dict:
    lab = ctx.lab
    p = built.require((), lab.kubernetes, lab.kubelet)
    if lab.spec.container_toolkit and not p.toolkit:
        raise built.InfraMissing(f"the NVIDIA Container Toolkit is not built; {built.MAKE_INFRA}")
    return kindconfig.render(lab, p.node_image(lab.kubernetes), ctx.labs_root, p.toolkit,
                             worker_image=p.node_image(lab.kubernetes, lab.kubelet))  # fmt: skip


def changed_config(ctx: Context) -> str:
    """Why the cluster's kind config is not the one this checkout renders (its nodes' mounts
    or image differ: kind cannot change them on a running cluster), or ""."""
    want = kind_config(ctx)
    have = ctx.host.config()
    if have is None:
        return "its kind config was not recorded"
    return "" if have == want else "its kind config differs from this checkout's"


def stale_states(ctx: Context) -> str:
    """Why a GPU node's fake-GPU state cannot be used as it is (written by another gpulab
    version, or damaged), or "" when every one reads."""
    for n in ctx.lab.gpu_nodes:
        try:
            ctx.fake_gpus(n.name).node()
        except FakeNvmlError as e:
            return f"fake GPU state of {n.name}: {e}"
    return ""


def state_dirs(ctx: Context) -> object:
    """Empty fakenvml state and driver-root dirs on the host for a new cluster's GPU nodes
    (kind bind-mounts them; the fake-gpus chart's DaemonSets write into them)."""
    if ctx.host.exists():
        return SKIP
    for n in ctx.lab.gpu_nodes:
        for d in (ctx.fake_gpus(n.name).path,
                  kindconfig.driver_dir(ctx.labs_root, ctx.lab, n.name)):  # fmt: skip
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        # kind bind-mounts it over the node's /sys/bus/pci/devices: it must exist first.
        kindconfig.pci_dir(ctx.labs_root, ctx.lab, n.name).mkdir(parents=True)
    return None


def toolkit_configs(ctx: Context) -> object:
    """The containerd and runtime configs a new cluster's GPU nodes start with."""
    if ctx.host.exists() or not ctx.lab.spec.container_toolkit:
        return SKIP
    lab = ctx.lab
    p = built.require((), lab.kubernetes, lab.kubelet)
    # GPU nodes run the workers' image (kindconfig.render): its containerd is the one configured.
    toolkit.prepare(kindconfig.toolkit_dir(ctx.labs_root, lab),
                    p.node_image(lab.kubernetes, lab.kubelet), p.toolkit)  # fmt: skip
    return None


def create_cluster(ctx: Context) -> object:
    if ctx.host.exists():
        return SKIP
    ctx.created = True
    ctx.host.create(kind_config(ctx), built.Products.load().lab_node_images())
    return None


# -- the fake GPUs: what every server of them stands on


def lab_images(wanted: Sequence[str], subject: Subject | None) -> Callable[[Context], None]:
    """The lab's images: gpulab's, the workload's, NFD's, the newest NVIDIA image (GFD is a
    command of it), what serves the GPUs names in `wanted`, and a subject's own image."""

    def images(ctx: Context) -> None:
        # The newest NVIDIA image always: the images share the base layer, so one `kind
        # load` of all costs little more than of one, and a later switch of subjects loads
        # less.
        newest = f"nvidia-{versions.nvidia_plugin_versions()[0]}"
        roles = ["gpulab", "workload", newest, "nfd", *wanted]
        products = built.require(roles, ctx.lab.kubernetes, ctx.lab.kubelet)
        ctx.images = {k: products.images[k] for k in roles}
        if subject is not None:
            ctx.images["subject"] = subject.image_ref(products)
        ctx.images["gfd"] = products.images[newest]

    return images


def load_images(ctx: Context) -> None:
    # GPU nodes run the lab's pods (fakenvml, the plugin, GFD, GPU workloads); NFD runs
    # on every node (its master may land on the control plane).
    gpu = [n.name for n in ctx.lab.gpu_nodes]
    ctx.host.load([i for k, i in ctx.images.items() if k != "nfd"], gpu)
    ctx.host.load([ctx.images["nfd"]], [n.name for n in ctx.lab.nodes])


def gpus(wanted: Sequence[str] = (), subject: Subject | None = None) -> list[Action]:
    """The first actions of every server of the GPUs: images, fake GPUs, their CDI spec."""
    return [
        Action("Lab images (built by `make infra`)", lab_images(wanted, subject)),
        Action("Load images into the nodes", load_images),
        Action("Fake GPUs through the fake-gpus Helm chart", fakegpus.deploy),
        Action("CDI spec of every GPU node (nvidia-ctk cdi generate)", toolkit.refresh),
    ]


def labels(strategy: str) -> list[Action]:
    """NFD and gpulab's GFD (for a MIG strategy), and the wait for their node labels: what a
    server of the GPUs that schedules by GFD's labels runs after the fake GPUs."""
    return [
        Action("Deploy node-feature-discovery and gpu-feature-discovery",
               lambda ctx: features.deploy(ctx, strategy)),
        Action("Wait for GFD's and NFD's labels on every GPU node",
               lambda ctx: features.wait_labels(ctx, strategy)),
    ]  # fmt: skip


UP = [
    Action("Infrastructure (built by `make infra`)", infrastructure),
    Action("Cluster {lab} exists: is it healthy?", reuse_or_recreate),
    Action("Fake-GPU state dirs on the host", state_dirs),
    Action("NVIDIA Container Toolkit configs (nvidia-ctk runtime configure)", toolkit_configs),
    Action("Cluster {lab}", create_cluster),
]
