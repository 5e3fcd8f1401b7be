"""Node labels as real GPU clusters get them: node-feature-discovery (its own Helm chart,
from the Go module cache, at the version NVIDIA's plugin requires) and NVIDIA's
gpu-feature-discovery (the newest pinned plugin release's binary) over each node's fake
GPUs. GFD publishes a NodeFeature object per node; nfd-master, allowed the nvidia.com label
namespace as NVIDIA's chart configures it, turns those into nvidia.com/gpu.product,
.memory, .family, .count ... labels on the Node, which suites schedule by.
"""

from __future__ import annotations

import yaml
from kubernetes import client

from clusters import built, chart, steps, versions
from clusters.context import Context

NAMESPACE = "node-feature-discovery"
MODULE = "sigs.k8s.io/node-feature-discovery"
CHART_DIR = "deployment/helm/node-feature-discovery"
LABEL = "nvidia.com/gpu.count"  # GFD's label every fake-GPU node gets
STRATEGY = "nvidia.com/mig.strategy"  # and where MIG_STRATEGY is not none
MASTER = "app.kubernetes.io/name=node-feature-discovery,role=master"
PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"  # NFD's, for NVIDIA's PCI vendor
GFD = "app.kubernetes.io/name=gpu-feature-discovery"


def nfd_docs(image: str, kube_version: str) -> list[dict]:
    """NFD's chart rendered with the local image: master (nvidia.com allowed), worker, gc.
    Helm hooks (the post-delete cleanup Job) are left out: nothing here runs `helm
    uninstall`."""
    where = chart.module_dir(f"{MODULE}@{versions.get('NFD_VERSION')}") / CHART_DIR
    if not (where / "Chart.yaml").is_file():
        raise built.InfraMissing(f"node-feature-discovery's chart is not in {where}; "
                                 f"{built.MAKE_INFRA}")  # fmt: skip
    repo, tag = chart.split_image(image)
    values = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "master": {"config": {"extraLabelNs": ["nvidia.com"]}},
        # PCI labels as NVIDIA's device-plugin chart configures its NFD (values.yaml, nfd:
        # network and display classes, labelled by vendor): pci-10de.present, which that
        # chart's default affinity needs on a GPU node.
        "worker": {
            "tolerations": [{"operator": "Exists"}],
            "config": {
                "sources": {
                    "pci": {"deviceClassWhitelist": ["02", "03"], "deviceLabelFields": ["vendor"]}
                }
            },
        },
        "postDeleteCleanup": False,
    }
    text = chart.template(built.helm(), where, "nfd", NAMESPACE, values, kube_version,
                          include_crds=True)  # fmt: skip
    docs = [d for d in yaml.safe_load_all(text) if d]
    return [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


def gfd_docs(ctx: Context, strategy: str) -> list[dict]:
    """gpulab's GFD DaemonSet (NVIDIA's binary) for a subject's MIG strategy."""
    return steps.manifest("gfd.yaml", {"${GPULAB_IMAGE}": ctx.images["gpulab"],
                                       "${NVIDIA_IMAGE}": ctx.images["gfd"],
                                       "${MIG_STRATEGY}": strategy})  # fmt: skip


def deploy_nfd(ctx: Context) -> None:
    """NFD applied (server-side), its CRDs served: a lab with no plugin gets only this, as
    a cluster where NFD runs before anyone installs NVIDIA's chart (which then takes
    nfd.enabled=false, as NVIDIA's docs say)."""
    ctx.kube.ensure_namespace(NAMESPACE)
    nfd = nfd_docs(ctx.images["nfd"], ctx.lab.kubernetes)
    for doc in nfd:
        ctx.kube.apply(doc, namespace=NAMESPACE)
    # GFD's first pass creates a NodeFeature: before its CRD is served that fails, and the
    # container's restart back-off can outlast the wait for labels.
    crds = [d["metadata"]["name"] for d in nfd if d["kind"] == "CustomResourceDefinition"]
    ctx.kube.wait_crds_established(crds)


def deploy(ctx: Context, strategy: str) -> None:
    """NFD and GFD applied (server-side: a second apply changes only what differs, e.g.
    GFD's MIG strategy when the subject changes)."""
    deploy_nfd(ctx)
    for doc in gfd_docs(ctx, strategy):
        ctx.kube.apply(doc, namespace=NAMESPACE)


def remove_gfd(ctx: Context) -> None:
    """gpulab's GFD gone (a lab switched to no plugin: whoever installs a chart brings its
    own), its pods too."""
    ctx.kube.delete_daemonset("gpu-feature-discovery", NAMESPACE)


def wait_pci_label(ctx: Context, deadline_s: float = 120) -> None:
    """Until NFD labels every GPU node with the fake GPUs' PCI vendor (what NVIDIA's chart's
    default affinity selects on)."""
    want = {n.name for n in ctx.lab.gpu_nodes}

    def labelled(nodes: dict) -> tuple[bool, str]:
        pci = {n: (nodes[n].metadata.labels or {}).get(PCI_LABEL) for n in want if n in nodes}
        return set(pci.values()) == {"true"} and len(pci) == len(want), f"{PCI_LABEL}: {pci}"

    ctx.kube.watch_until(f"NFD's {PCI_LABEL} on {sorted(want)}", ctx.core.list_node, labelled,
                         deadline_s)  # fmt: skip


def wait_labels(ctx: Context, strategy: str, deadline_s: float = 180,
                stall_s: float = 90) -> None:  # fmt: skip
    """Until every fake-GPU node carries GFD's labels for the subject's MIG strategy: the
    strategy itself where there is one (single: gpu.count counts MIG devices), else the
    inventory's GPU count. Labels come within seconds; a v1.34 pass in CI once had none on
    any node for 180 s with every NFD and GFD pod Running. A wait that stalls that long
    prints what NFD and GFD show, restarts nfd-master and GFD once and waits again."""
    key, want = ((STRATEGY, {n.name: strategy for n in ctx.lab.gpu_nodes}) if strategy != "none"
                 else (LABEL, {n.name: str(n.gpu_count) for n in ctx.lab.gpu_nodes}))  # fmt: skip

    def labelled(nodes: dict) -> tuple[bool, str]:
        got = {n: (nodes[n].metadata.labels or {}).get(key) for n in want if n in nodes}
        # NFD's, from the fake GPUs on the node's PCI bus (what NVIDIA's chart selects on).
        pci = {n: (nodes[n].metadata.labels or {}).get(PCI_LABEL) for n in want if n in nodes}
        done = got == want and set(pci.values()) == {"true"} and len(pci) == len(want)
        return done, f"{key}: {got}; {PCI_LABEL}: {pci}"

    what = f"GFD's and NFD's labels on {sorted(want)}"
    try:
        ctx.kube.watch_until(what, ctx.core.list_node, labelled, stall_s)
        return
    except steps.StepError as e:
        ctx.console.print(f"[yellow]![/] {e}; {diagnosis(ctx)}: restarting nfd-master and GFD",
                          highlight=False)  # fmt: skip
    for labels, name in ((MASTER, "nfd-master"), (GFD, "GFD")):
        ctx.kube.restart_pods(NAMESPACE, labels, name)
    try:
        ctx.kube.watch_until(what, ctx.core.list_node, labelled, max(deadline_s - stall_s, 30))
    except steps.StepError as e:
        raise steps.StepError(f"{e} (after restarting nfd-master and GFD); {diagnosis(ctx)}"
                              ) from None  # fmt: skip


def diagnosis(ctx: Context) -> str:
    return f"NFD/GFD pods: {pod_states(ctx)}; {node_features(ctx)}; {log_tails(ctx)}"


def node_features(ctx: Context) -> str:
    """The NodeFeature objects NFD's workers and GFD published, by name."""
    try:
        got = client.CustomObjectsApi(ctx.kube.api).list_namespaced_custom_object(
            "nfd.k8s-sigs.io", "v1alpha1", NAMESPACE, "nodefeatures"
        )
    except Exception as e:  # a diagnosis must not hide the failure it explains
        return f"NodeFeatures: unreadable ({e.__class__.__name__})"
    return "NodeFeatures: " + (", ".join(sorted(i["metadata"]["name"] for i in got["items"]))
                               or "none")  # fmt: skip


def log_tails(ctx: Context, lines: int = 4) -> str:
    """The last lines of nfd-master's log and of one GFD pod's (which side stalled)."""
    out = []
    for p in ctx.kube.pods(NAMESPACE, MASTER) + ctx.kube.pods(NAMESPACE, GFD)[:1]:
        out.append(f"{p.metadata.name} log: " + " | ".join(ctx.kube.log_tail(p, lines)))
    return "; ".join(out)


def pod_states(ctx: Context) -> str:
    """What each NFD and GFD pod is doing, in one line (for a wait that failed)."""
    out = []
    for p in ctx.core.list_namespaced_pod(NAMESPACE).items:
        states = [f"{c.name} restarts={c.restart_count}"
                  + (f" {c.state.waiting.reason}" if c.state and c.state.waiting else "")
                  for c in (p.status.init_container_statuses or [])
                  + (p.status.container_statuses or [])]  # fmt: skip
        out.append(f"{p.metadata.name} {p.status.phase} [{', '.join(states)}]")
    return "; ".join(out) or "none"
