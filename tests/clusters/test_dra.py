"""The DRA lab's spec and the values gpulab gives NVIDIA's DRA driver chart, rendered by
the real helm from the release's own chart (clusters/dra.py)."""

from __future__ import annotations

import pytest
import yaml

from clusters import chart, dra, infra, kindconfig, spec

IMAGE = "gpulab/dra-driver-nvidia-gpu:v0.4.1-abc"


def test_the_dra_lab_serves_its_gpus_with_nvidias_dra_driver_on_1_37() -> None:
    lab = spec.load("dra")
    assert lab.spec.dra is not None
    assert lab.spec.dra.feature_gates == {"NVMLDeviceHealthCheck": True}
    assert lab.kubernetes == "v1.37.0"  # device taints are GA there
    assert [n.gpu_product for n in lab.gpu_nodes] == ["NVIDIA-H100-80GB-HBM3", "Tesla-T4"]


def test_a_dra_section_with_an_unknown_key_is_refused_in_one_line() -> None:
    bad = {"name": "x", "dra": {"gates": {}}, "nodes": [{"role": "control-plane"}]}
    with pytest.raises(spec.SpecError) as e:
        spec.from_dict(bad)
    assert "dra.gates" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    infra.require(())  # helm and the module are `make infra`'s
    values = dra.values(IMAGE, {"NVMLDeviceHealthCheck": True})
    text = chart.template(infra.helm(), dra.chart_dir(), dra.RELEASE, dra.NAMESPACE, values,
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
