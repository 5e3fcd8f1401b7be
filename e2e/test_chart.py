"""Fake GPUs on any cluster, through the fake-gpus Helm chart: a plain kind cluster (kind's
defaults, no gpulab mounts or labels; only what this host's kubelet needs), one node
labelled into a pool by the test, `helm upgrade --install` with the plugin of choice,
`helm test`, faults from outside with `fakenvml --node` (pod exec through the API: this
node's state dir is nowhere on the host), a switch of plugins, and values the chart
refuses without touching the release. The labs install their fake GPUs through the same
chart (clusters/labs/fakegpus.py); test_lab_release_passes_helm_test runs its checks there.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml

from clusters import built, versions
from clusters.charts import chart
from clusters.kube import Kube, ready
from clusters.labs import fakegpus, kindconfig
from clusters.labs.capacity import node_gpus
from clusters.labs.host import Host
from clusters.labs.lab import LABS_ROOT, Lab
from clusters.steps import StepError
from e2e.fixtures import lab_fixture

CLUSTER = "gpulab-any"
NODE = f"{CLUSTER}-control-plane"  # one node: kind removes the control-plane taint
RELEASE, NAMESPACE = "fake-gpus", "fake-gpus"
POOL_LABEL = {"example.com/gpu-pool": "a100"}  # a label the cluster's owner chose
INVENTORY = {"gpus": [{"profile": "A100-SXM4-80GB", "count": 4}]}
RESOURCE = "nvidia.com/gpu"


@dataclass
class Cluster:
    host: Host
    kube: Kube
    images: dict[str, str]

    def values(self, plugin: str) -> dict:
        repo, tag = chart.split_image(self.images["gpulab"])
        values: dict = {"image": {"repository": repo, "tag": tag},
                        "pools": [{"name": "a100", "nodeSelector": POOL_LABEL,
                                   "inventory": INVENTORY}],
                        "plugin": {"kind": plugin}}  # fmt: skip
        if plugin == "nvidia":
            repo, tag = chart.split_image(self.images["nvidia"])
            values["plugin"]["image"] = {"repository": repo, "tag": tag}
        return values

    def wait_gpus(self, cap: int, alloc: int, deadline_s: float = 120) -> None:
        def seen(nodes: dict) -> tuple[bool, str]:
            got = node_gpus(nodes[NODE], RESOURCE) if NODE in nodes else None
            return got == (cap, alloc), f"capacity/allocatable {got}"

        self.kube.watch_until(f"{NODE} {RESOURCE} {alloc}/{cap}", self.kube.core.list_node, seen,
                              deadline_s)  # fmt: skip

    def fakenvml(self, *args: str) -> subprocess.CompletedProcess:
        """The fakenvml CLI as a user outside the cluster runs it."""
        return subprocess.run([sys.executable, "-m", "fakenvml", *args, "--node", NODE,
                               "--kubeconfig", str(self.host.kubeconfig)],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip

    def down(self) -> None:
        self.host.delete()

    def revision(self) -> int:
        out = chart.run(built.helm(), ["status", RELEASE, "-n", NAMESPACE, "-o", "yaml"],
                        self.host.kubeconfig)  # fmt: skip
        return int(yaml.safe_load(out)["version"])


def plain_cluster() -> Cluster:
    """The plain cluster, made by the lab pool (e2e/fixtures.py CLUSTER_MAKERS) beside the
    suites before this one, as a lab is; deleted when it goes down or fails to come up."""
    kube_version = versions.kube_version()
    newest = f"nvidia-{versions.nvidia_plugin_versions()[0]}"
    products = built.require(["gpulab", newest], kube_version)
    host = Host(CLUSTER, LABS_ROOT / CLUSTER)
    if host.exists():
        host.delete()
    config: dict = {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
                    "nodes": [{"role": "control-plane",
                               "image": products.node_images[kube_version]}]}  # fmt: skip
    if extra := kindconfig.host_kubelet_config(kube_version):
        config["kubeadmConfigPatches"] = ["kind: KubeletConfiguration\n" + extra]
    # The preloaded node image where there is one: the same node, with the images below
    # already in its containerd, so the load sends nothing (docs/labs.md).
    host.create(config, products.lab_node_images())
    try:
        images = {"gpulab": products.images["gpulab"], "nvidia": products.images[newest]}
        host.load(list(images.values()), [NODE])
        kube = Kube(host.kubeconfig)
        ok, why = kube.healthy(180)
        if not ok:
            raise StepError(f"{CLUSTER}: {why}")
        kube.label_node(NODE, POOL_LABEL)
        return Cluster(host, kube, images)
    except BaseException:
        host.delete()
        raise


@lab_fixture(CLUSTER, scope="module", make=plain_cluster)
def cluster(labs: Callable[..., Cluster]) -> Cluster:
    return labs(CLUSTER)


def test_the_chart_makes_a_labelled_node_a_fake_gpu_node_with_gpulabs_plugin(
    cluster: Cluster,
) -> None:
    fakegpus.install(cluster.host.kubeconfig, RELEASE, NAMESPACE, cluster.values("gpulab"))
    cluster.wait_gpus(4, 4)
    out = fakegpus.test(cluster.host.kubeconfig, RELEASE, NAMESPACE)
    # The test pod got one GPU from the plugin, and NVML in it lists the pool's four.
    assert "NVML lists 4 GPUs (want 4)" in out and "PASS" in out, out
    assert "NVIDIA_VISIBLE_DEVICES=GPU-" in out, out


def test_faults_injected_from_outside_through_the_api(cluster: Cluster) -> None:
    res = cluster.fakenvml("inject", "xid", "2", "79")
    assert res.returncode == 0, res.stderr
    cluster.wait_gpus(4, 3)  # gpulab's plugin marks GPU 2 Unhealthy
    res = cluster.fakenvml("events", "--json")
    assert res.returncode == 0, res.stderr
    events = [yaml.safe_load(line) for line in res.stdout.splitlines() if line.strip()]
    assert any(e["kind"] == "xid" and e["data"] == 79 and e["gpu"] == 2 for e in events), res.stdout
    res = cluster.fakenvml("recover", "2")
    assert res.returncode == 0, res.stderr
    cluster.wait_gpus(4, 4)


def test_a_fault_on_a_node_without_fake_gpus_is_refused_in_one_line(cluster: Cluster) -> None:
    res = subprocess.run([sys.executable, "-m", "fakenvml", "inject", "xid", "0", "79",
                          "--node", "no-such-node", "--kubeconfig", str(cluster.host.kubeconfig)],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert res.returncode != 0
    assert len(res.stderr.strip().splitlines()) == 1 and "no-such-node" in res.stderr


def test_switching_the_chart_to_nvidias_plugin(cluster: Cluster) -> None:
    fakegpus.install(cluster.host.kubeconfig, RELEASE, NAMESPACE, cluster.values("nvidia"))
    # helm's --wait counts a one-node DaemonSet ready with 0 pods ready (maxUnavailable 1).
    cluster.kube.wait_daemonset("nvidia-device-plugin", NAMESPACE)
    pods = cluster.kube.pods(NAMESPACE, "app.kubernetes.io/name=nvidia-device-plugin")
    assert len(ready(pods)) == 1
    # Helm deleted gpulab's DaemonSet; its pod stops within its grace period.
    gpulab = "app.kubernetes.io/name=gpulab-device-plugin"
    assert not cluster.kube.apps.list_namespaced_daemon_set(NAMESPACE, label_selector=gpulab).items
    cluster.kube.wait_pods_gone(NAMESPACE, gpulab, "gpulab")
    cluster.wait_gpus(4, 4)
    out = fakegpus.test(cluster.host.kubeconfig, RELEASE, NAMESPACE)
    assert "NVML lists 4 GPUs (want 4)" in out and "NVIDIA_VISIBLE_DEVICES=GPU-" in out, out


def test_bad_values_are_refused_and_change_nothing(cluster: Cluster) -> None:
    before = cluster.revision()
    bad = cluster.values("nvidia")
    bad["plugin"]["kind"] = "amd"
    with pytest.raises(chart.ChartError) as e:
        fakegpus.install(cluster.host.kubeconfig, RELEASE, NAMESPACE, bad)
    assert "\n" not in str(e.value) and "kind" in str(e.value)
    assert cluster.revision() == before
    assert cluster.kube.pods(NAMESPACE, "app.kubernetes.io/name=nvidia-device-plugin")


def test_uninstall_removes_the_fake_gpus_daemonsets_and_their_pods(cluster: Cluster) -> None:
    fakegpus.uninstall(cluster.host.kubeconfig, RELEASE, NAMESPACE)
    assert cluster.kube.apps.list_namespaced_daemon_set(NAMESPACE).items == []
    left = [p.metadata.name for p in cluster.kube.core.list_namespaced_pod(NAMESPACE).items]
    # Only the finished `helm test` pod stays, as Helm keeps test hooks (its log can be read).
    assert left == ["fake-gpus-test-a100"]


@pytest.mark.varies_with()  # the release is the same whichever plugin serves
def test_lab_release_passes_helm_test(lab: Lab) -> None:
    """In a lab the chart runs without a plugin (the subject is deployed apart): its test
    pods check that NVML on every GPU node lists the node's inventory."""
    out = fakegpus.test(lab.kubeconfig, fakegpus.RELEASE, fakegpus.NAMESPACE)
    for n in lab.lab.gpu_nodes:
        assert f"NVML lists {n.gpu_count} GPUs (want {n.gpu_count})" in out, out
    assert out.count("PASS") == len(lab.lab.gpu_nodes), out
