"""Fake GPUs through gpulab's Helm chart (clusters/charts/fake-gpus): the chart a user installs on
any cluster, and the one every lab installs its fake GPUs with, as a real Helm release
(`helm upgrade --install`, so `helm test` runs its checks). A lab gets one pool per GPU node
(nodeSelector kubernetes.io/hostname=<node>, the lab spec's inventory) and no plugin from
the chart: the subject deploys the plugin under test. The chart's DaemonSets write each
node's state into its /var/lib/fakenvml, which kind bind-mounts from the host, so the host
injects faults there directly; on other clusters `fakenvml inject --node` goes through the
API (fakenvml/remote.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusters import built
from clusters.charts import chart
from clusters.labs import spec
from clusters.labs.context import Context
from fakenvml import inventory

CHART = Path(__file__).resolve().parents[1] / "charts" / "fake-gpus"
RELEASE = "fake-gpus"
NAMESPACE = "kube-system"
LEGACY = "fakenvml"  # the DaemonSet labs applied before the chart


def install(kubeconfig: Path, release: str, namespace: str, values: dict[str, Any],
            timeout_s: int = 180) -> str:  # fmt: skip
    """`helm upgrade --install --wait` (helm waits for Deployments and DaemonSets by its own
    rule, which lets a one-node DaemonSet pass with no pod ready: callers wait for theirs)."""
    return chart.install(built.helm(), CHART, release, namespace, values, kubeconfig, timeout_s)


def test(kubeconfig: Path, release: str, namespace: str, timeout_s: int = 180) -> str:
    """`helm test` with its pods' logs; ChartError (their logs in it) when one fails."""
    args = ["test", release, "--namespace", namespace, "--logs", "--timeout", f"{timeout_s}s"]
    return chart.run(built.helm(), args, kubeconfig, timeout_s + 30)


def uninstall(kubeconfig: Path, release: str, namespace: str) -> str:
    """Returns once the release's pods are gone too: with helm's default (background)
    cascade, --wait ends when the DaemonSets are deleted, before the garbage collector has
    even marked their pods (CI saw both pods still running after it returned)."""
    args = ["uninstall", release, "--namespace", namespace, "--wait", "--cascade", "foreground"]
    return chart.run(built.helm(), args, kubeconfig)


def lab_values(
    lab: spec.Lab, image: str, inventories: dict[str, dict] | None = None
) -> dict[str, Any]:
    """A lab's values: one pool per GPU node, named after it, with the node's inventory
    (`inventories`' instead where it names the node); `image` is gpulab's."""
    repo, tag = chart.split_image(image)
    chosen = inventories or {}
    pools = [{"name": n.name, "nodeSelector": {"kubernetes.io/hostname": n.name},
              "inventory": chosen.get(n.name, n.inventory)} for n in lab.gpu_nodes]  # fmt: skip
    return {"image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
            "pools": pools, "plugin": {"kind": "none"}}  # fmt: skip


def deploy(ctx: Context, inventories: dict[str, dict] | None = None) -> None:
    """The lab's fake GPUs through the chart, with `inventories`' instead of the spec's for
    the nodes it names (a changed inventory rolls that node's pod, which writes the new
    state: what serves the GPUs sees it when it restarts; deploy(ctx) puts the spec's
    back). A cluster an older gpulab made carries a plain `fakenvml` DaemonSet instead:
    deleted first, or each node would run two."""
    unknown = set(inventories or {}) - {n.name for n in ctx.lab.gpu_nodes}
    if unknown:
        raise ValueError(f"lab {ctx.lab.name} has no GPU node {', '.join(sorted(unknown))}")
    for name, inv in (inventories or {}).items():
        inventory.from_dict(inv, name)  # FakeNvmlError, one line, before the cluster is touched
    ctx.kube.delete_daemonset(LEGACY, NAMESPACE)  # the chart's are fakenvml-<pool>
    install(ctx.kubeconfig, RELEASE, NAMESPACE,
            lab_values(ctx.lab, ctx.images["gpulab"], inventories))  # fmt: skip
    # helm's --wait lets a DaemonSet of one node count as ready with none ready (its
    # maxUnavailable is 1): wait for every pool's pod ourselves.
    for n in ctx.lab.gpu_nodes:
        ctx.kube.wait_daemonset(f"fakenvml-{n.name}", NAMESPACE)
