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

from clusters import built, kube, steps, versions
from clusters.charts import chart
from clusters.labs import kindconfig
from clusters.labs.context import Context

NAMESPACE = "node-feature-discovery"
MODULE = "sigs.k8s.io/node-feature-discovery"
CHART_DIR = "deployment/helm/node-feature-discovery"
LABEL = "nvidia.com/gpu.count"  # GFD's label every fake-GPU node gets
STRATEGY = "nvidia.com/mig.strategy"  # and where MIG_STRATEGY is not none
MASTER = "app.kubernetes.io/name=node-feature-discovery,role=master"
WORKER = "app.kubernetes.io/name=node-feature-discovery,role=worker"
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
            "affinity": kindconfig.OFF_FLEET,
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


def wait_pci_label(ctx: Context, deadline_s: float = 120, stall_s: float = 60) -> None:
    """Until NFD labels every GPU node with the fake GPUs' PCI vendor (what NVIDIA's chart's
    default affinity selects on). Seconds as a rule; a stall is handled as in wait_labels."""
    want = {n.name for n in ctx.lab.gpu_nodes}

    def labelled(nodes: dict) -> tuple[bool, str]:
        pci = {n: (nodes[n].metadata.labels or {}).get(PCI_LABEL) for n in want if n in nodes}
        return set(pci.values()) == {"true"} and len(pci) == len(want), f"{PCI_LABEL}: {pci}"

    _wait_or_restart(ctx, f"NFD's {PCI_LABEL} on {sorted(want)}", labelled, deadline_s,
                     stall_s, ((MASTER, "nfd-master"), (WORKER, "nfd-worker")))  # fmt: skip


def wait_labels(ctx: Context, strategy: str, deadline_s: float = 180,
                stall_s: float = 90) -> None:  # fmt: skip
    """Until every fake-GPU node carries GFD's labels for the subject's MIG strategy: the
    strategy itself where there is one (single: gpu.count counts MIG devices), else the
    inventory's GPU count, and NFD's PCI label."""
    key, want = ((STRATEGY, {n.name: strategy for n in ctx.lab.gpu_nodes}) if strategy != "none"
                 else (LABEL, {n.name: str(n.gpu_count) for n in ctx.lab.gpu_nodes}))  # fmt: skip

    def labelled(nodes: dict) -> tuple[bool, str]:
        got = {n: (nodes[n].metadata.labels or {}).get(key) for n in want if n in nodes}
        # NFD's, from the fake GPUs on the node's PCI bus (what NVIDIA's chart selects on).
        pci = {n: (nodes[n].metadata.labels or {}).get(PCI_LABEL) for n in want if n in nodes}
        done = got == want and set(pci.values()) == {"true"} and len(pci) == len(want)
        return done, f"{key}: {got}; {PCI_LABEL}: {pci}"

    _wait_or_restart(ctx, f"GFD's and NFD's labels on {sorted(want)}", labelled, deadline_s,
                     stall_s, ((MASTER, "nfd-master"), (WORKER, "nfd-worker"), (GFD, "GFD")),
                     )  # fmt: skip


def _wait_or_restart(ctx: Context, what: str, labelled: kube.Check, deadline_s: float,
                     stall_s: float, restart: tuple[tuple[str, str], ...]) -> None:  # fmt: skip
    """Labels come within seconds. Twice in CI none came (every pod Running): a v1.34 pass
    had no GFD label on any of hetero's nodes for 180 s, and a v1.37 `stock` bring-up had no
    NFD PCI label for 120 s; neither was seen again, and neither printed enough to say
    which side stalled. A wait that stalls for `stall_s` prints the NFD and GFD pods
    (restarts, last exit), which NodeFeature objects hold the PCI label (none: the worker's
    side; all: nfd-master's) and the log tails, restarts the pods in `restart` once, and
    waits out the rest of `deadline_s` (docs/not-done-yet.md, "Seen once, not explained")."""
    try:
        ctx.kube.watch_until(what, ctx.core.list_node, labelled, stall_s)
        return
    except steps.StepError as e:
        names = ", ".join(name for _, name in restart)
        ctx.console.print(f"[yellow]![/] {e}; {diagnosis(ctx)}: restarting {names}",
                          highlight=False)  # fmt: skip
    for labels, name in restart:
        ctx.kube.restart_pods(NAMESPACE, labels, name)
    try:
        ctx.kube.watch_until(what, ctx.core.list_node, labelled, max(deadline_s - stall_s, 30))
    except steps.StepError as e:
        raise steps.StepError(f"{e} (after restarting {names}); {diagnosis(ctx)}") from None


def diagnosis(ctx: Context) -> str:
    return f"NFD/GFD pods: {pod_states(ctx)}; {node_features(ctx)}; {log_tails(ctx)}"


def node_features(ctx: Context) -> str:
    """The NodeFeature objects NFD's workers and GFD published, by name, each with whether
    it carries the PCI label (a worker's object without it: the worker never saw the fake
    GPUs; with it and no label on the Node: nfd-master never applied it)."""
    try:
        got = client.CustomObjectsApi(ctx.kube.api).list_namespaced_custom_object(
            "nfd.k8s-sigs.io", "v1alpha1", NAMESPACE, "nodefeatures"
        )
    except Exception as e:  # a diagnosis must not hide the failure it explains
        return f"NodeFeatures: unreadable ({e.__class__.__name__})"
    out = sorted(f"{i['metadata']['name']} (PCI label: "
                 f"{((i.get('spec') or {}).get('labels') or {}).get(PCI_LABEL, 'no')})"
                 for i in got["items"])  # fmt: skip
    return "NodeFeatures: " + (", ".join(out) or "none")


def log_tails(ctx: Context, lines: int = 4) -> str:
    """The last lines of nfd-master's log, of one worker's and of one GFD pod's (which side
    stalled)."""
    out = []
    pods = (ctx.kube.pods(NAMESPACE, MASTER) + ctx.kube.pods(NAMESPACE, WORKER)[:1]
            + ctx.kube.pods(NAMESPACE, GFD)[:1])  # fmt: skip
    for p in pods:
        out.append(f"{p.metadata.name} log: " + " | ".join(ctx.kube.log_tail(p, lines)))
    return "; ".join(out)


def pod_states(ctx: Context) -> str:
    """What each NFD and GFD pod is doing, in one line (for a wait that failed)."""
    out = []
    for p in ctx.core.list_namespaced_pod(NAMESPACE).items:
        states = [f"{c.name} restarts={c.restart_count}"
                  + (f" {c.state.waiting.reason}" if c.state and c.state.waiting else "")
                  + (f" last exit {t.exit_code} ({t.reason})"
                     if c.last_state and (t := c.last_state.terminated) else "")
                  for c in (p.status.init_container_statuses or [])
                  + (p.status.container_statuses or [])]  # fmt: skip
        out.append(f"{p.metadata.name} {p.status.phase} [{', '.join(states)}]")
    return "; ".join(out) or "none"
