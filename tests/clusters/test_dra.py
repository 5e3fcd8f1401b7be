"""The DRA lab's spec and the values gpulab gives NVIDIA's DRA driver chart, rendered by
the real helm from the release's own chart (clusters/dra.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from clusters import built, chart, dra, kindconfig, post_render, spec
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
        {"key": "gpulab.dev/fake-gpus", "operator": "In", "values": ["true"]}]}]  # fmt: skip
    selector = ds["spec"]["selector"]["matchLabels"]
    assert ",".join(f"{k}={v}" for k, v in selector.items()) == dra.POD_LABELS


def test_the_dra_mig_lab_has_a_whole_gpu_beside_one_in_mig_mode() -> None:
    lab = spec.load("dra-mig")
    assert lab.spec.dra is not None and lab.kubernetes == "v1.37.0"
    (node,) = lab.gpu_nodes
    assert node.name == "dra-mig-worker"
    assert [g.mig_layout for g in node.gpu_node.gpus] == ["", "3g.40gb,2g.20gb,1g.10gb"]
    assert dra.has_mig(lab) and not dra.has_mig(spec.load("dra"))


@pytest.fixture(scope="module")
def rendered_mig() -> list[dict]:
    built.require(())
    values = dra.values(IMAGE, {"NVMLDeviceHealthCheck": True}, static_mig=True)
    text = chart.template(built.helm(), dra.chart_dir(), dra.RELEASE, dra.NAMESPACE, values,
                          "v1.37.0", post=dra.renderer(static_mig=True))  # fmt: skip
    return [d for d in yaml.safe_load_all(text) if d]


def test_a_mig_lab_points_the_plugin_at_the_roots_proc_devices(
    rendered: list[dict], rendered_mig: list[dict]
) -> None:
    """ALT_PROC_DEVICES_PATH (the driver's knob for hosts without NVIDIA's majors) names the
    fake root's proc/devices in MIG labs only; the rest of the container is unchanged."""

    def gpus(docs: list[dict]) -> dict:
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        return next(c for c in ds["spec"]["template"]["spec"]["containers"]
                    if c["name"] == dra.CONTAINER)  # fmt: skip

    plain, mig = gpus(rendered), gpus(rendered_mig)
    env = {e["name"]: e.get("value") for e in mig["env"]}
    assert env["ALT_PROC_DEVICES_PATH"] == "/driver-root/proc/devices"
    assert "ALT_PROC_DEVICES_PATH" not in {e["name"] for e in plain["env"]}
    assert [e for e in mig["env"] if e["name"] != "ALT_PROC_DEVICES_PATH"] == plain["env"]
    # The chart mounts nvidiaDriverRoot where dra.py's paths say.
    mounts = {m["name"]: m["mountPath"] for m in mig["volumeMounts"]}
    assert mounts["driver-root"] == dra.CONTAINER_DRIVER_ROOT


def test_the_plugins_command_mounts_the_roots_proc_driver_first_and_once(
    rendered: list[dict], rendered_mig: list[dict]
) -> None:
    """The release's own manifests (helm's post-renderer, so an upgrade keeps it): the MIG
    lab's plugin script is the chart's with the bind mount first; a plain lab's is the
    chart's."""

    def gpus(docs: list[dict]) -> dict:
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus"]
        return c

    plain, mig = gpus(rendered), gpus(rendered_mig)
    assert mig["command"] == plain["command"] == ["bash", "-c"]
    first, rest = mig["args"][0].split("\n", 1)
    assert first == "mount --bind /driver-root/proc/driver /proc/driver"
    assert rest == plain["args"][0]
    assert rest.rstrip().endswith("gpu-kubelet-plugin -v $(LOG_VERBOSITY)")
    assert mig["args"][1:] == plain["args"][1:]
    assert not plain["args"][0].startswith("mount")


def test_the_post_renderer_adds_its_line_once_and_refuses_a_chart_without_the_container(
    tmp_path: Path,
) -> None:
    docs = [{"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
        {"name": "gpus", "command": ["bash", "-c"], "args": ["exec plugin\n"]}]}}}}]  # fmt: skip
    assert post_render.render(docs, "gpus", "mount x") == 1
    assert post_render.render(docs, "gpus", "mount x") == 1
    (gpus,) = docs[0]["spec"]["template"]["spec"]["containers"]
    assert gpus["args"] == ["mount x\nexec plugin\n"]
    # Run as helm runs it: a file, manifests on stdin; a missing container fails the render.
    script = dra.renderer(static_mig=True)
    assert script is not None and dra.renderer(static_mig=False) is None
    res = subprocess.run([script[0], script[1], "other", "mount x"], input=yaml.safe_dump_all(docs),
                         capture_output=True, text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert res.returncode == 1 and "no `bash -c` container 'other'" in res.stderr


def test_the_lab_waits_for_each_mig_device_in_place_of_its_gpu(tmp_path: Path) -> None:
    """dra.expected_devices, from the node's fake state: the whole GPU counts once, the
    MIG-mode GPU as its three MIG devices (v0.4.1 publishes those instead of the GPU)."""
    lab = spec.load("dra-mig")
    (node,) = lab.gpu_nodes
    state = NodeDir(tmp_path / "state")
    state.init(node.gpu_node)

    class Running:  # what expected_devices reads of a running lab
        def fake_gpus(self, name: str) -> NodeDir:
            assert name == node.name
            return state

    assert dra.expected_devices(Running(), node.name) == 1 + 3  # type: ignore[arg-type]


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
