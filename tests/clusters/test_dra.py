"""The DRA lab's spec and the values gpulab gives NVIDIA's DRA driver chart, rendered by
the real helm from the release's own chart (clusters/labs/dra.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import docker
import pytest
import yaml

from clusters import built
from clusters.charts import chart
from clusters.labs import dra, kindconfig, spec
from fakenvml import driver, inventory, mig
from fakenvml.node import NodeDir

IMAGE = "gpulab/dra-driver-nvidia-gpu:v0.4.1-abc"


def test_the_dra_lab_serves_its_gpus_with_nvidias_dra_driver_on_1_37() -> None:
    lab = spec.load("dra")
    assert lab.spec.dra is not None
    assert lab.spec.dra.feature_gates == {"NVMLDeviceHealthCheck": True}
    assert lab.kubernetes == "v1.37.0"  # device taints are GA there
    assert [n.gpu_product for n in lab.gpu_nodes] == [
        "NVIDIA-H100-80GB-HBM3", "Tesla-T4", "NVIDIA-A100-SXM4-80GB"]  # fmt: skip
    # hetero's products and counts, so the selection suites see the same choices.
    hetero = spec.load("hetero")
    assert sorted((n.gpu_product, n.gpu_count) for n in lab.gpu_nodes) == sorted(
        (n.gpu_product, n.gpu_count) for n in hetero.gpu_nodes)  # fmt: skip


def test_a_dra_section_with_an_unknown_key_is_refused_in_one_line() -> None:
    bad = {"name": "x", "dra": {"gates": {}}, "nodes": [{"role": "control-plane"}]}
    with pytest.raises(spec.SpecError) as e:
        spec.from_dict(bad)
    assert "dra.gates" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    built.require(())  # helm and the module are `make infra`'s
    values = dra.values(IMAGE, {"NVMLDeviceHealthCheck": True})
    text = chart.template(built.helm(), dra.chart_dir(), dra.RELEASE, dra.NAMESPACE, values,
                          "v1.37.0")  # fmt: skip
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_chart_renders_the_kubelet_plugin_only_for_gpus(rendered: list[dict]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    assert ("DaemonSet", dra.DAEMONSET) in kinds
    assert ("DeviceClass", dra.DEVICE_CLASS) in kinds
    # Compute domains are off: no controller Deployment, no compute-domain classes.
    assert not [d for d in rendered if d["kind"] == "Deployment"]
    assert not [n for k, n in kinds if k == "DeviceClass" and "compute-domain" in n]


def test_the_kubelet_plugin_gets_the_fake_driver_root_gate_image_and_nodes(
    rendered: list[dict],
) -> None:
    ds = next(d for d in rendered if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (gpus,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in gpus["env"]}
    assert env["NVIDIA_DRIVER_ROOT"] == kindconfig.DRIVER_ROOT
    assert env["FEATURE_GATES"].rstrip(",") == "NVMLDeviceHealthCheck=true"
    assert gpus["image"] == IMAGE and gpus["imagePullPolicy"] == "IfNotPresent"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "gpulab.dev/fake-gpus", "operator": "In", "values": ["true"]},
        {"key": "gpulab.dev/plugin", "operator": "In", "values": ["true"]}]}]  # fmt: skip
    selector = ds["spec"]["selector"]["matchLabels"]
    assert ",".join(f"{k}={v}" for k, v in selector.items()) == dra.POD_LABELS


def test_the_dra_mig_lab_has_a_whole_gpu_beside_one_in_mig_mode() -> None:
    lab = spec.load("dra-mig")
    assert lab.spec.dra is not None and lab.kubernetes == "v1.37.0"
    (node,) = lab.gpu_nodes
    assert node.name == "dra-mig-control-plane"  # one node: the GPUs on the control plane
    assert [g.mig_layout for g in node.gpu_node.gpus] == ["", "3g.40gb,2g.20gb,1g.10gb"]


def test_the_plugin_runs_by_name_privileged_with_the_driver_root_where_the_wrapper_looks(
    rendered: list[dict],
) -> None:
    """What the image's wrapper (clusters/infra/images/dra-kubelet-plugin.sh) relies on in the
    chart: the script runs `gpu-kubelet-plugin` by name (the wrapper is first in PATH), the
    container may mount, and the driver root is at /driver-root."""
    ds = next(d for d in rendered if d["kind"] == "DaemonSet")
    (gpus,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus"]
    assert gpus["command"] == ["bash", "-c"]
    assert gpus["args"][0].rstrip().endswith("\ngpu-kubelet-plugin -v $(LOG_VERBOSITY)")
    assert gpus["securityContext"]["privileged"] is True
    mounts = {m["name"]: m["mountPath"] for m in gpus["volumeMounts"]}
    assert mounts["driver-root"] == dra.CONTAINER_DRIVER_ROOT == "/driver-root"


def test_the_driver_image_shows_the_fake_roots_proc_driver_as_the_kernels(tmp_path: Path) -> None:
    """The image's `gpu-kubelet-plugin` on a fake host: the root's proc/driver over
    /proc/driver, then the unchanged binary; with no root, /proc/driver is the kernel's."""
    image = built.require(["dra"]).images["dra"]
    root = tmp_path / "root"
    node = inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 1}]}, "n")
    driver.install(root, node)
    cap = "/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access"
    script = f"gpu-kubelet-plugin --version && cat {cap}"
    engine = docker.from_env()
    mounts = {str(root): {"bind": "/driver-root", "mode": "ro"}}
    out = engine.containers.run(image, ["sh", "-c", script], privileged=True, remove=True,
                                volumes=mounts)  # fmt: skip
    assert dra.version() in out.decode()
    assert "DeviceFileMinor:" in out.decode()
    with pytest.raises(docker.errors.ContainerError):
        engine.containers.run(image, ["sh", "-c", script], privileged=True, remove=True)


def test_the_driver_image_shows_the_fake_gpus_in_the_kernels_pci_tree(tmp_path: Path) -> None:
    """The image's `gpu-kubelet-plugin` on a fake host: each fake GPU's
    /sys/bus/pci/devices entry is the kernel's link into /sys/devices under its root
    complex, the form NVIDIA's DRA driver reads pcieRoot from (k8s.io/dynamic-resource-
    allocation deviceattribute: the link, relative to bus/pci/devices, must lead to
    devices/pci.../<bus id>); the files behind it read; the host's devices are still there."""
    image = built.require(["dra"]).images["dra"]
    root = tmp_path / "root"
    node = inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 4}]}, "n")
    driver.install(root, node)
    host = sorted(p.name for p in Path("/sys/bus/pci/devices").iterdir())
    fakes = [driver.pci_address(g) for g in node.gpus]
    script = ("gpu-kubelet-plugin --version >/dev/null && cd /sys/bus/pci/devices && "
              "for d in *; do echo \"$d $(readlink $d) $(cat $d/numa_node)\"; done")  # fmt: skip
    engine = docker.from_env()
    mounts = {str(root): {"bind": "/driver-root", "mode": "ro"}}
    out = engine.containers.run(image, ["sh", "-c", script], privileged=True, remove=True,
                                volumes=mounts).decode()  # fmt: skip
    seen = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert sorted(seen) == sorted(host + fakes)
    paths = driver.pcie_paths(node.gpus)
    for gpu, address in zip(node.gpus, fakes, strict=True):
        link, numa = seen[address]
        target = os.path.normpath(os.path.join("bus/pci/devices", link))
        assert target == f"devices/{paths[address]}" and target.startswith("devices/pci")
        assert numa == str(gpu.numa_node)
    assert len({paths[a].split("/")[0] for a in fakes}) == 2  # two sockets, two roots


def test_the_driver_starts_without_pcie_root_where_sysfs_cannot_be_overlaid(
    tmp_path: Path,
) -> None:
    """No right to mount (an unprivileged container): the driver still starts, the wrapper
    says why there is no pcieRoot, and /sys is the kernel's."""
    image = built.require(["dra"]).images["dra"]
    root = tmp_path / "root"
    node = inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 1}]}, "n")
    driver.install(root, node)
    shutil.rmtree(root / "proc/driver/nvidia")  # the /proc/driver mount is MIG's, not this
    address = driver.pci_address(node.gpus[0])
    script = f"gpu-kubelet-plugin --version && ls /sys/bus/pci/devices/{address} || echo absent"
    mounts = {str(root): {"bind": "/driver-root", "mode": "ro"}}
    container = docker.from_env().containers.run(image, ["sh", "-c", script], detach=True,
                                                 volumes=mounts)  # fmt: skip
    try:
        assert container.wait()["StatusCode"] == 0
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert dra.version() in out and out.rstrip().endswith("absent")
    assert "cannot show the fake GPUs in /sys (no pcieRoot attribute)" in err


class Running:
    """What expected_devices reads of a running lab: one node's fake state."""

    def __init__(self, node: str, state: NodeDir) -> None:
        self.node, self.state = node, state

    def fake_gpus(self, name: str) -> NodeDir:
        assert name == self.node
        return self.state


def test_the_lab_waits_for_each_mig_device_in_place_of_its_gpu(tmp_path: Path) -> None:
    """dra.expected_devices, from the node's fake state: the whole GPU counts once, the
    MIG-mode GPU as its three MIG devices (v0.4.1 publishes those instead of the GPU)."""
    lab = spec.load("dra-mig")
    (node,) = lab.gpu_nodes
    state = NodeDir(tmp_path / "state")
    state.init(node.gpu_node)

    assert dra.expected_devices(Running(node.name, state), node.name) == 1 + 3  # type: ignore[arg-type]


def test_with_dynamic_mig_the_lab_waits_for_every_placement_and_names_what_claims_made(
    tmp_path: Path,
) -> None:
    """The dra-dynmig lab's driver publishes each H100 80GB whole and at every placement of
    its GPU-instance profiles (1 + 25), whatever MIG devices claims have made; the MIG
    devices that exist are named as the driver names them (a smaller compute instance by
    its slices)."""
    lab = spec.load("dra-dynmig")
    (node,) = lab.gpu_nodes
    assert lab.spec.dra is not None and dra.DraDriver(lab.spec.dra).dynamic_mig
    state = NodeDir(tmp_path / "state")
    state.init(node.gpu_node)

    running = Running(node.name, state)
    gpu = state.node().gpus[1]
    assert dra.dynamic_placements(gpu) == {"gpu": 1, "1g.10gb": 7, "1g.10gb+me": 7,
                                           "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2,
                                           "4g.40gb": 1, "7g.80gb": 1}  # fmt: skip
    assert dra.expected_devices(running, node.name, dynamic_mig=True) == 2 * 26  # type: ignore[arg-type]
    assert dra.made_mig_devices(state) == {}
    plan = mig.Plan(state)
    m = plan.gpu(1)
    plan.mode(m, True)
    plan.reset(m)  # a pending mode takes effect
    gi = plan.create_gi(m, "3g.40gb", 4)
    plan.create_ci(m, gi)
    gi = plan.create_gi(m, "3g.40gb", 0)
    plan.create_ci(m, gi, slices=1)
    plan.write()
    assert dra.made_mig_devices(state) == {"gpu-1-mig-3g40gb-9-4": 1, "gpu-1-mig-1c3g40gb-9-0": 1}
    # Counted the same with devices made: the driver publishes placements, not instances.
    assert dra.expected_devices(running, node.name, dynamic_mig=True) == 2 * 26  # type: ignore[arg-type]


def test_mig_device_changes_time_each_device_from_the_journal(tmp_path: Path) -> None:
    """What an experiment reads after its run: each MIG device made or destroyed, at its
    journal record's time, from `since_ns` on; a placement destroyed and made again (one
    claim's device, then the next's) is two changes however close together."""
    (node,) = spec.load("dra-dynmig").gpu_nodes
    state = NodeDir(tmp_path / "state")
    state.init(node.gpu_node)

    def change(make: bool, gid: int = 0) -> int:
        plan = mig.Plan(state)
        m = plan.gpu(1)
        if make:
            gid = plan.create_gi(m, "4g.40gb", 0)
            plan.create_ci(m, gid)
        else:
            plan.destroy_gi(m, gid)
        plan.write()
        return gid

    plan = mig.Plan(state)
    plan.mode(plan.gpu(1), True)
    plan.reset(plan.gpu(1))
    plan.write()
    first = change(make=True)
    since = time.time_ns()
    change(make=False, gid=first)
    change(make=True)
    name = "gpu-1-mig-4g40gb-5-0"
    changes = dra.mig_device_changes(state, since)
    assert [c[1:] for c in changes] == [(name, 1, False), (name, 1, True)]
    assert since <= changes[0][0] <= changes[1][0]
    everything = dra.mig_device_changes(state, 0)
    assert [c[1:] for c in everything] == [(name, 1, True), (name, 1, False), (name, 1, True)]


def test_a_new_fakenvml_rolls_the_kubelet_plugins() -> None:
    """The gpulab image (whose library the driver root holds) is a pod annotation, so a
    changed library changes the pod template and the running plugins, which keep the
    library they loaded, are replaced. Without one, no annotation."""
    built.require(())

    def annotations(library: str) -> dict:
        values = dra.values(IMAGE, {}, library=library)
        text = chart.template(built.helm(), dra.chart_dir(), dra.RELEASE, dra.NAMESPACE,
                              values, "v1.37.0")  # fmt: skip
        ds = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet")
        return ds["spec"]["template"]["metadata"].get("annotations") or {}

    assert annotations("gpulab/gpulab:aaa") == {"gpulab.dev/fakenvml": "gpulab/gpulab:aaa"}
    assert annotations("gpulab/gpulab:bbb") != annotations("gpulab/gpulab:aaa")
    assert annotations("") == {}
