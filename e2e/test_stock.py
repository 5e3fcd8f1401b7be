"""NVIDIA's device-plugin Helm chart installed the way NVIDIA documents it, at its default
values, on a lab node that a stock deployment takes for a GPU node (clusters/labs/stock.yaml):
fake GPUs on its PCI bus and in its /dev, the NVIDIA Container Toolkit as its containerd's
default runtime in CDI mode (clusters/labs/toolkit.py), NFD running, and no plugin.

The values set are only those no cluster without a registry can do without and NVIDIA's
documented switches: the locally built image (repository, tag), `gfd.enabled=true` (the
chart's GFD) and `nfd.enabled=false` ("if NFD is already running"). No driver root, no
runtime class, no affinity, no env: the plugin and GFD find NVML because the runtime sees
the image's NVIDIA_VISIBLE_DEVICES=all and injects the driver's library, and workloads get
their GPUs' device nodes the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from clusters import built, versions
from clusters.charts import chart
from clusters.labs import features, spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import DeviceIds
from e2e.fixtures import NAMESPACE, lab_fixture
from e2e.pods import DEVICE_ENV, Pods
from e2e.verdict import Verdict
from fakenvml import mig
from fakenvml.model import Gpu

STOCK = spec.load("stock")
NODE = STOCK.gpu_nodes[0].name
RELEASE, CHART_NAMESPACE = "nvdp", "nvidia-device-plugin"  # as in NVIDIA's install guide
CHART_DIR = "deployments/helm/nvidia-device-plugin"
RESOURCE = "nvidia.com/gpu"
GFD_LABELS = ("nvidia.com/gpu.count", "nvidia.com/gpu.product")


@lab_fixture(STOCK.name, scope="module")
def stock(labs: Callable[..., Lab]) -> Iterator[Lab]:
    """The stock lab with NVIDIA's chart installed (`helm upgrade --install`), uninstalled
    afterwards (the lab may be kept for a rerun)."""
    lab = labs(STOCK.name)
    newest = versions.nvidia_plugin_versions()[0]
    where = chart.module_dir(f"github.com/NVIDIA/k8s-device-plugin@{newest}") / CHART_DIR
    repo, tag = chart.split_image(lab.images[f"nvidia-{newest}"])
    values = {"image": {"repository": repo, "tag": tag},
              "gfd": {"enabled": True}, "nfd": {"enabled": False}}  # fmt: skip
    chart.install(built.helm(), where, RELEASE, CHART_NAMESPACE, values, lab.kubeconfig, 180)
    yield lab
    chart.run(built.helm(), ["uninstall", RELEASE, "--namespace", CHART_NAMESPACE, "--wait"],
              lab.kubeconfig)  # fmt: skip


def pods_in(lab: Lab, ids: DeviceIds) -> Pods:
    def node_gpus(node: str) -> tuple[Sequence[Gpu], Sequence[mig.MigDevice]]:
        d = lab.fake_gpus(node)
        return d.node().gpus, mig.devices(d)

    return Pods(lab.core, NAMESPACE, lab.images["workload"], RESOURCE, ids, node_gpus)


@pytest.fixture
def spods(stock: Lab) -> Iterator[Pods]:
    stock.ensure_namespace(NAMESPACE)
    p = pods_in(stock, DeviceIds(env=DEVICE_ENV))
    yield p
    p.delete_all()


def test_the_chart_at_default_values_serves_every_gpu(stock: Lab, verdict: Verdict) -> None:
    n = stock.lab.gpu_nodes[0].gpu_count
    verdict.expect(f"{RESOURCE} {n}/{n} on {NODE}")
    stock.wait_allocatable(NODE, n, n, deadline_s=120, resource=RESOURCE)
    verdict.saw("{1}/{0}".format(*stock.capacity(NODE, RESOURCE)) + f" on {NODE}")


def test_its_gfd_labels_the_node(stock: Lab, verdict: Verdict) -> None:
    node = stock.lab.gpu_nodes[0]
    want = {GFD_LABELS[0]: str(node.gpu_count), GFD_LABELS[1]: node.gpu_product}
    verdict.expect(", ".join(f"{k}={v}" for k, v in want.items()) + ", from the chart's GFD only")

    def labelled(nodes: dict) -> tuple[bool, str]:
        labels = (nodes[NODE].metadata.labels or {}) if NODE in nodes else {}
        got = {k: labels.get(k) for k in want}
        return got == want, ", ".join(f"{k}={v}" for k, v in got.items())

    stock.kube.watch_until(f"GFD's labels on {NODE}", stock.core.list_node, labelled, 120)
    labels = stock.core.read_node(NODE).metadata.labels
    seen = ", ".join(f"{k}={labels.get(k)}" for k in want)
    gfds = [p for p in stock.core.list_namespaced_pod(CHART_NAMESPACE).items
            if "gpu-feature-discovery" in p.metadata.name]  # fmt: skip
    ours = stock.kube.pods(features.NAMESPACE, features.GFD)
    verdict.saw(f"{seen}; GFD pods: chart {len(gfds)}, gpulab {len(ours)}")
    assert [p.status.phase for p in gfds] == ["Running"] and ours == []


def test_a_pod_gets_its_gpu_through_the_container_toolkit(
    stock: Lab, spods: Pods, verdict: Verdict
) -> None:
    """The plugin hands NVIDIA_VISIBLE_DEVICES=<uuid> (its default, envvar); the runtime
    turns it into the CDI device nvidia.com/gpu=<uuid>: that GPU's device node, the
    driver's library and the fake GPUs' state, nothing of the other GPUs; and the
    driver's procfs entries a GPU host's kernel shows (the lab's hook:
    clusters/labs/toolkit.py): /proc/driver/nvidia, the driver's majors in /proc/devices."""
    verdict.expect("the GPU the plugin allocated, and only it, in the container's /dev; "
                   "libnvidia-ml.so.1 and the fake GPUs' state mounted; /proc/driver/nvidia "
                   "and the nvidia majors in /proc")  # fmt: skip
    spods.create(spods.gpu_pod("toolkit", 1, NODE))
    spods.wait_running("toolkit")
    allocated = spods.devices("toolkit")
    # The same pod, its GPUs named by the device nodes in its /dev instead.
    in_dev = pods_in(stock, DeviceIds(device_specs="/dev/nvidia{minor}")).devices("toolkit")
    files = spods.exec("toolkit", ["ls", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                   "/var/lib/fakenvml/journal.bin"],
                       lambda out: "journal" in out or "No such" in out)  # fmt: skip
    proc = spods.exec("toolkit", ["sh", "-c", "ls /proc/driver; echo --; cat /proc/devices"],
                      lambda out: "--" in out)  # fmt: skip
    listed, _, devices = proc.partition("--")
    majors = {line.split()[-1] for line in devices.splitlines() if "nvidia" in line}
    verdict.saw(f"allocated {allocated}, /dev shows {in_dev}; {' '.join(files.split())}; "
                f"/proc/driver: {' '.join(listed.split())}, majors {sorted(majors)}")  # fmt: skip
    assert len(allocated) == 1 and in_dev == allocated
    assert "No such" not in files
    assert {"nvidia", "nvidia-caps"} <= set(listed.split())
    assert {"nvidia", "nvidia-uvm", "nvidia-caps"} <= majors
