"""Subjects: the plugin under test in one file, validated like lab specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusters import chart, spec, subject
from clusters.infra import InfraMissing
from clusters.subject import SubjectError
from e2e.fixtures import summary_key

DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: my-plugin, namespace: gpu-system}
spec:
  selector: {matchLabels: {app: my-plugin, tier: node}}
  template:
    metadata: {labels: {app: my-plugin, tier: node}}
    spec:
      initContainers: [{name: wait, image: "${GPULAB_IMAGE}"}]
      containers: [{name: plugin, image: "${SUBJECT_IMAGE}"}]
"""

MINE = {
    "name": "my-plugin",
    "image": {"ref": "example/my-plugin:1.0"},
    "daemonset": "ds.yaml",
    "socket": "my.sock",
    "device_ids": {"env": "MY_DEVICES"},
    "ready_log": "serving",
    "expects": {
        "recovers": True,
        "lost_gpu": "that-device",
        "double_bit_ecc": "ignored",
        "preferred_allocation_on_64_gpus": False,
        "health_across_kubelet_restarts": False,
    },
}


def write(tmp_path: Path, data: dict, ds: str = DAEMONSET) -> Path:
    (tmp_path / "ds.yaml").write_text(ds)
    path = tmp_path / "my-plugin.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return path


def test_shipped_subjects_are_gpulab_and_each_pinned_nvidia_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPULAB_NVIDIA_PLUGIN_VERSIONS", "v0.19.3,v0.17.4")
    found = {s.name: s for s in subject.shipped()}
    assert sorted(found) == [
        "gpulab",
        "gpulab-mig",
        "gpulab-mig-single",
        "gpulab-timeslicing",
        "nvidia-cdi-v0.17.4",
        "nvidia-cdi-v0.19.3",
        "nvidia-helm-v0.17.4",
        "nvidia-helm-v0.19.3",
        "nvidia-mig-single-v0.17.4",
        "nvidia-mig-single-v0.19.3",
        "nvidia-mig-v0.17.4",
        "nvidia-mig-v0.19.3",
        "nvidia-timeslicing-v0.17.4",
        "nvidia-timeslicing-v0.19.3",
        "nvidia-v0.17.4",
        "nvidia-v0.19.3",
    ]
    old = found["nvidia-v0.17.4"]
    assert old.version == "v0.17.4" and old.spec.image.infra == "nvidia-v0.17.4"
    assert "v0.17.4" in old.spec.description
    assert not old.expects.recovers and old.expects.lost_gpu == "every-device"
    assert found["gpulab"].expects.recovers and found["gpulab"].expects.extra_resources
    # The bare name is the newest pinned release.
    assert subject.load("nvidia").name == "nvidia-v0.19.3"
    # Time-slicing configs: 4 replicas each; a fault takes out all 4 (ours) or one (NVIDIA's).
    ts = found["nvidia-timeslicing-v0.19.3"]
    assert ts.expects.time_sliced and ts.expects.out_per_faulted_gpu == 1
    assert found["gpulab-timeslicing"].expects.out_per_faulted_gpu == 4
    assert not found["gpulab"].expects.time_sliced
    # CDI: Allocate names CDI devices; `needs("cdi")` selects the CDI scenarios.
    cdi = found["nvidia-cdi-v0.19.3"]
    assert cdi.cdi and cdi.spec.device_ids.cdi == "k8s.device-plugin.nvidia.com/gpu"
    assert cdi.needs_met(("cdi", "replicas=1")) and not found["gpulab"].needs_met(("cdi",))
    config = next(d for d in ts.manifest if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(config)["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 4
    # MIG: the subject's env sets the strategy in its DaemonSet's containers.
    mig = found["nvidia-mig-single-v0.19.3"]
    assert mig.expects.mig == "single" and mig.needs_met(("mig=single",))
    (ds,) = [d for d in mig.render({}) if d["kind"] == "DaemonSet"]
    env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "MIG_STRATEGY"] == ["single"]


def test_the_pinned_versions_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAB_NVIDIA_PLUGIN_VERSIONS", "v0.20.0")
    names = [s.name for s in subject.shipped()]
    assert names == [
        "gpulab-mig-single", "gpulab-mig", "gpulab-timeslicing", "gpulab", "nvidia-cdi-v0.20.0",
        "nvidia-helm-v0.20.0", "nvidia-mig-single-v0.20.0", "nvidia-mig-v0.20.0",
        "nvidia-timeslicing-v0.20.0", "nvidia-v0.20.0",
    ]  # fmt: skip


def test_a_users_subject_file_with_its_own_daemonset(tmp_path: Path) -> None:
    s = subject.load(write(tmp_path, MINE))
    assert s.name == "my-plugin" and s.spec.device_ids.env == "MY_DEVICES"
    assert (s.daemonset_name, s.namespace) == ("my-plugin", "gpu-system")
    assert s.selector == "app=my-plugin,tier=node"
    ds = s.render({"SUBJECT_IMAGE": "example/my-plugin:1.0", "GPULAB_IMAGE": "gpulab/x:1"})[0]
    pod = ds["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example/my-plugin:1.0"
    assert pod["initContainers"][0]["image"] == "gpulab/x:1"


def test_needs_are_read_from_expects(tmp_path: Path) -> None:
    s = subject.load(write(tmp_path, MINE))
    assert s.needs_met(("recovers", "lost_gpu=that-device"))
    assert not s.needs_met(("extra_resources",))
    assert not s.needs_met(("lost_gpu=every-device",))
    assert s.needs_met(("healthcheck_env",))  # a default


@pytest.mark.parametrize(
    "change, message",
    [
        ({"image": {"ref": "a", "infra": "b"}}, "image: give exactly one of infra, ref, build"),
        ({"image": {}}, "image: give exactly one of infra, ref, build"),
        ({"expects": {"recovers": True}}, "expects.lost_gpu: required key missing"),
        (
            {"expects": {**MINE["expects"], "lost_gpu": "some"}},
            "expects.lost_gpu: expected 'that-device' or 'every-device', found 'some'",
        ),
        ({"colour": "red"}, "colour: unknown key (expected one of: name, description, "),
        ({"daemonset": "absent.yaml"}, "daemonset: no file"),
        ({"chart": {"path": "chart"}}, "give exactly one of daemonset, chart"),
        ({"daemonset": None}, "give exactly one of daemonset, chart"),
        ({"daemonset": None, "chart": {"path": "nowhere"}}, "chart.path: no chart (Chart.yaml) in"),
        ({"daemonset": None, "chart": {}}, "chart: give exactly one of path, go_module"),
        (
            {"daemonset": None, "chart": {"path": "c", "go_module": "example.com/m@v1.0.0"}},
            "chart: give exactly one of path, go_module",
        ),
        (
            {"daemonset": None, "chart": {"path": "c", "dir": "x"}},
            "chart: dir: goes with go_module",
        ),
        (
            {"daemonset": None, "chart": {"go_module": "example.com/m", "dir": "x"}},
            "chart: go_module: expected <module>@<version>, found 'example.com/m'",
        ),
        ({"daemonset": None, "chart": {"path": "c", "valuez": {}}}, "chart.valuez: unknown key"),
        (
            {"daemonset": None, "chart": {"path": "c", "values": []}},
            "chart.values: expected a mapping",
        ),
        ({"name": "My Plugin"}, "name: 'My Plugin': expected lower-case"),
        ({"versions": "NOT_PINNED"}, "versions: NOT_PINNED is not pinned"),
        ({"device_ids": {}}, "device_ids: give exactly one of env, cdi, devices"),
        (
            {"device_ids": {"env": "X", "cdi": "a/gpu"}},
            "device_ids: give exactly one of env, cdi, devices",
        ),
        ({"device_ids": {"env": "X", "id": "nvidia{minor}"}}, "device_ids: id: only with devices"),
        ({"device_ids": {"devices": True, "id": "gpu{bus}"}}, "device_ids: id: 'gpu{bus}': "),
    ],
)
def test_a_bad_subject_is_one_line_naming_the_file_and_key(
    tmp_path: Path, change: dict, message: str
) -> None:
    path = write(tmp_path, {**MINE, **change})
    with pytest.raises(SubjectError) as e:
        subject.load(path)
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_manifest_without_a_daemonset_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINE, ds="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(SubjectError, match=r"ds\.yaml has no DaemonSet"):
        subject.load(path)


def test_malformed_and_missing_subject_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SubjectError, match=r"bad\.yaml: not valid YAML at line 2, column 1"):
        subject.load(bad)
    with pytest.raises(SubjectError, match="no subject file"):
        subject.load(tmp_path / "absent.yaml")
    with pytest.raises(
        SubjectError,
        match=r"no subject 'nope' \(shipped: gpulab, gpulab-mig, gpulab-mig-single, gpulab-ti",
    ):
        subject.load("nope")


def test_a_lab_spec_names_a_subject_that_exists() -> None:
    lab = {"name": "x", "subject": "nope", "nodes": [{"role": "control-plane"}]}
    with pytest.raises(spec.SpecError, match="subject: no subject 'nope'"):
        spec.from_dict(lab)
    assert spec.from_dict({**lab, "subject": "nvidia-v0.17.4"}).spec.subject == "nvidia-v0.17.4"


def test_the_summary_table_keys_subject_names_with_dashes_and_dots() -> None:
    names = ["gpulab", "nvidia-v0.19.3", "nvidia-v0.17.4"]
    assert summary_key("e2e/test_faults.py::test_gpu_lost[nvidia-v0.17.4]", names) == (
        "test_gpu_lost",
        "nvidia-v0.17.4",
    )
    assert summary_key(
        "e2e/test_hetero.py::test_p[nvidia-v0.19.3-Tesla-T4-hetero-worker3]", names
    ) == ("test_p [Tesla-T4-hetero-worker3]", "nvidia-v0.19.3")
    assert summary_key("e2e/test_seed.py::test_x[other]", names) is None


def test_prepare_goes_with_build_only(tmp_path: Path) -> None:
    path = write(tmp_path, {**MINE, "image": {"ref": "a", "prepare": "p.sh"}})
    with pytest.raises(SubjectError, match="image: prepare: only with build"):
        subject.load(path)


def test_the_example_plugin_is_a_subject_of_its_own() -> None:
    tiny, devices = subject.examples()
    assert tiny.name == "tiny-gpu-plugin"
    assert tiny.spec.resource == "example.com/gpu"
    assert tiny.spec.device_ids.env == "TINY_GPU_UUIDS"
    assert tiny.spec.image.build == "." and tiny.path(tiny.spec.image.prepare or "").is_file()
    # Its devices mode: another subject of the same build directory (one image).
    assert devices.name == "tiny-gpu-plugin-devices" and devices.plugin == tiny.plugin
    assert devices.spec.device_ids.devices and devices.spec.device_ids.env is None


def test_a_subject_deployed_from_its_own_chart_directory(tmp_path: Path) -> None:
    (tmp_path / "chart").mkdir()
    (tmp_path / "chart/Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    chart = {"path": "chart", "release": "r", "namespace": "gpu", "values": {"a": 1}}
    data = {**MINE, "daemonset": None, "chart": chart}
    s = subject.load(write(tmp_path, data))
    assert s.spec.chart is not None and s.spec.chart.values == {"a": 1}
    assert s.chart_dir() == tmp_path / "chart" and s.default_namespace == "gpu"


def test_a_chart_in_a_go_module_not_yet_fetched_names_make_infra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))
    chart = {"go_module": "github.com/Example/Plugin@v1.2.3", "dir": "deploy/chart"}
    s = subject.load(write(tmp_path, {**MINE, "daemonset": None, "chart": chart}))
    # The module cache's own spelling of upper case.
    assert (
        s.chart_dir() == tmp_path / "cache/go/mod/github.com/!example/!plugin@v1.2.3/deploy/chart"
    )
    with pytest.raises(
        InfraMissing, match=r"Plugin@v1.2.3 is not in the Go module cache .*make infra"
    ):
        s.manifest  # noqa: B018


@pytest.mark.parametrize(
    "ref, parts",
    [
        (
            "gpulab/nvidia-device-plugin:v0.19.3-c89b",
            ("gpulab/nvidia-device-plugin", "v0.19.3-c89b"),
        ),
        ("localhost:5000/p", ("localhost:5000/p", "latest")),
        ("localhost:5000/p:1", ("localhost:5000/p", "1")),
        ("busybox", ("busybox", "latest")),
    ],
)
def test_an_image_splits_into_repository_and_tag_for_charts(ref: str, parts: tuple) -> None:
    assert chart.split_image(ref) == parts
