"""Subjects deployed from a Helm chart, rendered by the helm `make infra` builds: NVIDIA's
own chart as the nvidia-helm subjects use it, and a user's chart directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusters import built, kube, versions
from clusters.subjects import subject
from clusters.subjects.subject import Subject, SubjectError
from tests.clusters.test_subject import MINE, write

NVIDIA_HELM = [s for s in subject.shipped() if s.spec.chart and s.spec.chart.go_module]
IMAGES = {"SUBJECT_IMAGE": "gpulab/nvidia-device-plugin:v0.19.3-c89bbc14fcc3",
          "GPULAB_IMAGE": "gpulab/gpulab:1"}  # fmt: skip


@pytest.fixture(autouse=True)
def helm_built() -> None:
    """The tests use the helm `make infra` built; never build it here."""
    try:
        built.helm()
    except built.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


def test_nvidia_helm_is_every_pinned_release_through_its_own_chart() -> None:
    assert [s.name for s in NVIDIA_HELM] == [f"nvidia-helm-{v}" for v in
                                             versions.nvidia_plugin_versions()]  # fmt: skip
    assert subject.load("nvidia-helm").name == NVIDIA_HELM[0].name


@pytest.mark.parametrize("s", NVIDIA_HELM, ids=lambda s: s.name)
def test_nvidia_chart_renders_a_daemonset_that_runs_on_the_lab(s: Subject) -> None:
    assert (s.chart_dir() / "Chart.yaml").is_file()
    chart = yaml.safe_load((s.chart_dir() / "Chart.yaml").read_text())
    assert f"v{chart['appVersion']}" == s.version  # the chart of the subject's release
    docs = s.render(IMAGES)
    assert (s.daemonset_name, s.namespace) == ("nvdp-nvidia-device-plugin", "nvidia-device-plugin")
    # The plugin's DaemonSet is the first; the chart's MPS control daemon comes second and
    # asks for nodes labelled nvidia.com/mps.capable, which no lab node is.
    ds, mps = [d for d in docs if d["kind"] == "DaemonSet"]
    assert mps["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    pod = ds["spec"]["template"]["spec"]
    if "serviceAccountName" in pod:  # v0.19.3's; the chart brings it
        accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
        assert pod["serviceAccountName"] in accounts
    (main,) = pod["containers"]  # no config map: no config-manager sidecar
    assert main["image"] == IMAGES["SUBJECT_IMAGE"]  # the locally built image, in two halves
    assert main["imagePullPolicy"] == "IfNotPresent"
    # On the lab's plugin nodes, without the NFD labels the chart's default affinity asks for.
    assert pod["nodeSelector"] == {"gpulab.dev/plugin": "true"} and "affinity" not in pod
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert {k: env[k] for k in ("DEVICE_LIST_STRATEGY", "PASS_DEVICE_SPECS", "MIG_STRATEGY",
                                "FAIL_ON_INIT_ERROR", "DEVICE_DISCOVERY_STRATEGY",
                                "NVIDIA_DRIVER_ROOT")} == {
        "DEVICE_LIST_STRATEGY": "envvar", "PASS_DEVICE_SPECS": "false", "MIG_STRATEGY": "none",
        "FAIL_ON_INIT_ERROR": "true", "DEVICE_DISCOVERY_STRATEGY": "nvml",
        "NVIDIA_DRIVER_ROOT": "/run/fakenvml/driver"}  # fmt: skip
    # The chart passes no FAKENVML_STATE_DIR and mounts no state dir: the library finds the
    # state through the driver root, the one fakenvml path the chart mounts.
    assert "FAKENVML_STATE_DIR" not in env
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/driver-root"]["readOnly"] is True
    assert volumes[mounts["/driver-root"]["name"]]["hostPath"]["path"] == "/run/fakenvml/driver"
    assert "/var/lib/fakenvml" not in mounts
    assert s.selector == kube.selector(ds["spec"]["selector"]["matchLabels"])
    assert s.expects == subject.load(f"nvidia-{s.version}").expects  # the same binary


CHART = """\
apiVersion: v2
name: my-plugin
version: 0.1.0
"""
TEMPLATE = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: {{ .Release.Name }}-ds}
spec:
  selector: {matchLabels: {app: {{ .Release.Name }}}}
  template:
    metadata: {labels: {app: {{ .Release.Name }}}}
    spec:
      containers:
        - name: plugin
          image: {{ .Values.image }}
          env: [{name: MODE, value: {{ .Values.mode | quote }}}]
"""


def chart_subject(tmp_path: Path, template: str, values: dict | None = None) -> Subject:
    (tmp_path / "chart/templates").mkdir(parents=True)
    (tmp_path / "chart/Chart.yaml").write_text(CHART)
    (tmp_path / "chart/templates/ds.yaml").write_text(template)
    spec = {"path": "chart", "release": "mine", "namespace": "gpu",
            "values": values or {"image": "${SUBJECT_IMAGE}", "mode": "fast"}}  # fmt: skip
    return subject.load(write(tmp_path, {**MINE, "daemonset": None, "chart": spec}))


def test_a_users_chart_renders_with_its_values_release_and_namespace(tmp_path: Path) -> None:
    s = chart_subject(tmp_path, TEMPLATE)
    # No namespace in the manifest: the release namespace, where the lab applies it too.
    assert (s.daemonset_name, s.namespace, s.selector) == ("mine-ds", "gpu", "app=mine")
    (ds,) = s.render(IMAGES)
    main = ds["spec"]["template"]["spec"]["containers"][0]
    assert main["image"] == IMAGES["SUBJECT_IMAGE"]
    assert main["env"] == [{"name": "MODE", "value": "fast"}]


def test_a_chart_that_fails_to_render_is_one_line(tmp_path: Path) -> None:
    s = chart_subject(tmp_path, '{{ fail "no GPUs\\nanywhere" }}\n')
    with pytest.raises(SubjectError) as e:
        s.manifest  # noqa: B018
    assert str(e.value).startswith(f"{s.source}: chart: helm template {s.chart_dir()}: ")
    assert "no GPUs anywhere" in str(e.value) and "\n" not in str(e.value)


def test_a_chart_without_a_daemonset_is_refused(tmp_path: Path) -> None:
    s = chart_subject(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(SubjectError, match=r"chart: chart .*/chart has no DaemonSet"):
        s.daemonset_name  # noqa: B018
