"""Subjects: the plugin under test in one file, validated like lab specs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest
import yaml
from pydantic import BaseModel

from clusters.built import InfraMissing
from clusters.charts import chart
from clusters.labs import spec
from clusters.subjects import subject
from clusters.subjects.subject import SubjectError
from e2e.fixtures import summary_key
from fakenvml import inventory
from fakenvml.mig import MigDevice, mig_uuid
from fakenvml.model import Gpu

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
        "nvidia-mps-v0.17.4",
        "nvidia-mps-v0.19.3",
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
    # MPS: the same replicas as MPS clients, not time slices; the daemon's DaemonSet after
    # the plugin's (the first is the plugin's), found by the labels the subject names.
    mps = found["nvidia-mps-v0.19.3"]
    assert mps.expects.replicas == 4 and not mps.expects.time_sliced
    assert mps.needs_met(("mps",)) and not ts.needs_met(("mps",))
    config = next(d for d in mps.manifest if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(config)["sharing"]["mps"]["resources"][0]["replicas"] == 4
    plugin, daemon = [d for d in mps.manifest if d["kind"] == "DaemonSet"]
    assert mps.daemonset is plugin and mps.expects.mps
    labels = daemon["spec"]["template"]["metadata"]["labels"]
    assert mps.expects.mps.daemon.labels.items() <= labels.items()
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
        "nvidia-mps-v0.20.0", "nvidia-timeslicing-v0.20.0", "nvidia-v0.20.0",
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
    assert not s.needs_met(("extra_resources",))  # a default: it serves no more
    assert not s.needs_met(("lost_gpu=every-device",))
    assert s.needs_met(("replicas=1",)) and not s.needs_met(("time_sliced",))


@pytest.mark.parametrize(
    ("said", "codes"),
    [("nvidia-default", [13, 31, 43, 45, 68, 109]), ("none", []), ([45, 31, 43], [31, 43, 45])],
)
def test_ignored_xids_are_nvidias_none_or_the_plugins_own_list(
    tmp_path: Path, said: object, codes: list[int]
) -> None:
    s = subject.load(write(tmp_path, {**MINE, "expects": {"ignored_xids": said}}))
    assert sorted(s.expects.ignored_xid_codes) == codes
    assert hash(s)  # subjects are dict keys in the suites: a list must not make it unhashable


@pytest.mark.parametrize("said", ["some", [], ["x"], [0], 13, [True]])
def test_a_wrong_ignored_xids_is_one_line(tmp_path: Path, said: object) -> None:
    with pytest.raises(subject.SubjectError) as e:
        subject.load(write(tmp_path, {**MINE, "expects": {"ignored_xids": said}}))
    assert str(e.value).endswith(
        f"expects.ignored_xids: expected nvidia-default, none or a list of Xid codes such as "
        f"[31, 43, 45], found {said!r}")  # fmt: skip


@pytest.mark.parametrize(
    ("said", "switch", "codes"),
    [(True, ("DP_DISABLE_HEALTHCHECKS", ("all", "xids"), True, "DP_ENABLE_HEALTHCHECKS"), True),
     ({"disable": "HC_OFF", "off_values": ["all"], "codes": False, "enable": None},
      ("HC_OFF", ("all",), False, None), False),
     (False, None, False)],
)  # fmt: skip
def test_a_health_check_switch_is_nvidias_none_or_the_plugins_own(
    tmp_path: Path, said: object, switch: tuple | None, codes: bool
) -> None:
    """`true` is NVIDIA's switch spelt out; a mapping names a plugin's own variable and the
    values it takes; `health_codes` (a needs trait) says whether the codes scenario applies."""
    s = subject.load(write(tmp_path, {**MINE, "expects": {"healthcheck_env": said}}))
    got = s.expects.healthcheck_env
    shown = (got.disable, got.off_values, got.codes, got.enable) if got else None
    assert shown == switch
    assert s.expects.health_codes is codes and s.needs_met(("health_codes",)) is codes
    assert hash(s)


@pytest.mark.parametrize(
    ("said", "message"),
    [("yes", "expects.healthcheck_env: expected true (NVIDIA's switch), false or a mapping of "
              "disable, off_values, codes, enable; found 'yes'"),
     ({"off_values": ["all,79"]}, "expects.healthcheck_env.off_values: 'all,79': a word "
                                  "without commas (a comma list is codes)"),
     ({"off_values": []}, "expects.healthcheck_env.off_values: expected a list of values such "
                          "as [all, xids], found []"),
     ({"disable": "DP-OFF"}, "expects.healthcheck_env.disable: 'DP-OFF' is not an env var name"),
     ({"of": ["all"]}, "expects.healthcheck_env.of: unknown key (expected one of: disable, "
                       "off_values, codes, enable)")],
)  # fmt: skip
def test_a_wrong_health_check_switch_is_one_line(
    tmp_path: Path, said: object, message: str
) -> None:
    """One line naming the key as the file spells it (never pydantic's union member)."""
    with pytest.raises(subject.SubjectError) as e:
        subject.load(write(tmp_path, {**MINE, "expects": {"healthcheck_env": said}}))
    assert "\n" not in str(e.value) and str(e.value).endswith(message)


def test_only_what_a_tier_reads_is_required(tmp_path: Path) -> None:
    """A subject of its name, image, manifest and device ids loads: each tier asks for the
    rest where it reads it."""
    bare = {k: MINE[k] for k in ("name", "image", "daemonset", "device_ids")}
    s = subject.load(write(tmp_path, bare))
    assert s.spec.socket is None and s.spec.ready_log is None
    assert s.expects.replicas == 1 and s.expects.mig == "none" and not s.expects.extra_resources
    assert s.expects.out_per_faulted_gpu == 1  # one GPU, one device: xid_marks not read


@pytest.mark.parametrize(
    ("read", "line"),
    [
        (lambda s: s.expects.lost_gpu,
         "expects.lost_gpu is not stated, and this scenario reads it: state one of "
         "that-device | every-device | ignored"),
        (lambda s: s.expects.recovers,
         "expects.recovers is not stated, and this scenario reads it: state one of true | false"),
        (lambda s: s.ready_log,
         "ready_log is not stated, and the container tier reads it: state a regex of a line"),
        (lambda s: s.serves_on("x.sock"),
         "socket is not stated, and the container tier reads it: state its socket's name"),
    ],
    ids=["lost_gpu", "recovers", "ready_log", "socket"],
)  # fmt: skip
def test_reading_what_the_file_does_not_state_is_one_line_naming_file_key_and_values(
    tmp_path: Path, read: Callable[[subject.Subject], object], line: str
) -> None:
    path = write(tmp_path, {**MINE, "socket": None, "ready_log": None, "expects": {}})
    with pytest.raises(subject.Unstated) as e:
        read(subject.load(path))
    assert str(e.value).startswith(f"{path}: {line}")
    assert "\n" not in str(e.value)


def test_a_need_the_file_does_not_state_keeps_the_scenario_which_then_fails(
    tmp_path: Path,
) -> None:
    """Neither deselected (a scenario silently gone) nor met by a guess: kept, and
    `require` (the e2e plugin calls it at setup) fails it in one line."""
    s = subject.load(write(tmp_path, {**MINE, "expects": {"recovers": False}}))
    assert s.needs_met(("healthcheck_env",)) and s.needs_met(("lost_gpu=ignored",))
    assert not s.needs_met(("recovers", "healthcheck_env"))  # a stated need still decides
    assert s.unstated(("healthcheck_env", "recovers", "replicas=1")) == ["healthcheck_env"]
    s.require(("recovers", "replicas=1"))
    with pytest.raises(subject.Unstated, match=r"expects\.healthcheck_env is not stated"):
        s.require(("recovers", "healthcheck_env"))
    assert s.trait("healthcheck_env") == "None"  # varies_with groups unstated ones together


@pytest.mark.parametrize(
    ("socket", "endpoint", "match"),
    [
        ("nvidia-gpu.sock", "nvidia-gpu.sock", True),
        ("nvidia-gpu.sock", "nvidia-gpu.sock.1", False),
        ("nvidiaGPU-*.sock", "nvidiaGPU-1764230400.sock", True),
        ("nvidiaGPU-*.sock", "nvidia-gpu.sock", False),
        ("tiny-[0-9]?.sock", "tiny-42.sock", True),
    ],
)
def test_socket_is_a_name_or_a_glob(tmp_path: Path, socket: str, endpoint: str,
                                    match: bool) -> None:  # fmt: skip
    s = subject.load(write(tmp_path, {**MINE, "socket": socket}))
    assert s.serves_on(endpoint) is match


@pytest.mark.parametrize(
    "change, message",
    [
        ({"image": {"ref": "a", "infra": "b"}}, "image: give exactly one of infra, ref, build"),
        ({"image": {}}, "image: give exactly one of infra, ref, build"),
        ({"expects": {"recovers": "yes"}}, "expects.recovers: expected true or false, found 'yes'"),
        (
            {"expects": {**MINE["expects"], "lost_gpu": "some"}},
            "expects.lost_gpu: expected 'that-device', 'every-device' or 'ignored', found 'some'",
        ),
        ({"device_ids": None}, "device_ids: required key missing"),
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
        ({"device_ids": {}}, "device_ids: give exactly one of env, cdi, device_specs"),
        (
            {"device_ids": {"env": "X", "cdi": "a/gpu"}},
            "device_ids: give exactly one of env, cdi, device_specs",
        ),
        (
            {"device_ids": {"env": "X", "device_specs": "/dev/nvidia{minor}"}},
            "device_ids: give exactly one of env, cdi, device_specs",
        ),
        (
            {"device_ids": {"env": "X", "id": "gpu-slot"}},
            "device_ids: id: 'gpu-slot' names no GPU: give one of {uuid}, {minor}, {index}, "
            "or `opaque` for ids that name none (with device_specs)",
        ),
        (
            {"device_ids": {"env": "X", "id": "opaque"}},
            "device_ids: id: opaque needs device_specs, or env with env_id: the device nodes "
            "Allocate hands, or the env's own form, say which GPU a container got",
        ),
        (
            {"device_ids": {"cdi": "a/gpu", "env_id": "{index}"}},
            "device_ids: env_id: only with env",
        ),
        (
            {"device_ids": {"env": "X", "id": "opaque", "env_id": "gpu"}},
            "device_ids: env_id: 'gpu' names no GPU",
        ),
        ({"companions": ["absent.yaml"]}, "companions: no file"),
        ({"companions": [{"path": "absent"}]}, "companions[0]: no chart (Chart.yaml) in"),
        (
            {"companions": [{"go_module": "m@v1"}]},
            "companions[0]: dir: goes with go_module (the chart's directory in the module)",
        ),
        ({"companions": [3]}, "companions[0]: expected a mapping, found 3"),
        ({"scheduler": {"name": "s", "webhook": "yes"}}, "scheduler.webhook: expected"),
        (
            {"scheduler": {"name": "s", "choice": {"annotation": "a", "id": "{gpu}"}}},
            "scheduler.choice.id: '{gpu}': unknown placeholder {gpu}",
        ),
        ({"scheduler": {"choice": {"annotation": "a"}}}, "scheduler.name: required key missing"),
        (
            {"expects": {"node_health": {"annotation": "a", "unhealthy": "bad"}}},
            "expects.node_health.unhealthy: 'bad': name the GPU with exactly one of {index}",
        ),
        (
            {"expects": {"node_health": {"annotation": "a", "unhealthy": "({index}"}}},
            "expects.node_health.unhealthy: '({index}' is no regex",
        ),
        ({"expects": {"memory_unit_mib": 0}}, "expects.memory_unit_mib:"),
        (
            {"device_ids": {"cdi": "a/gpu", "id": "opaque"}},
            "device_ids: id: opaque needs device_specs",
        ),
        (
            {"device_ids": {"env": "X", "id": "nvidia{gpu}"}},
            "device_ids: id: 'nvidia{gpu}': unknown placeholder {gpu} (expected {uuid}, "
            "{minor}, {index}, {replica})",
        ),
        (
            {"device_ids": {"env": "X", "id": "{uuid}-{minor}"}},
            "device_ids: id: '{uuid}-{minor}': each placeholder once, and one GPU placeholder",
        ),
        (
            {"device_ids": {"env": "X", "id": "nvidia{minor}{replica}"}},
            "device_ids: id: 'nvidia{minor}{replica}': placeholders must be separated by text",
        ),
        (
            {"device_ids": {"device_specs": "/dev/nvidia{uuid}"}},
            "device_ids: device_specs: '/dev/nvidia{uuid}': unknown placeholder {uuid} "
            "(expected {minor}, {index})",
        ),
        (
            {"device_ids": {"device_specs": "/dev/nvidia0"}},
            "device_ids: device_specs: expected a device node in /dev named by the GPU, e.g. "
            "/dev/nvidia{minor}, found '/dev/nvidia0'",
        ),
        (
            {"device_ids": {"device_specs": "/dev/gpus/card{index}"}},
            "device_ids: device_specs: expected a device node in /dev named by the GPU",
        ),
        (
            {"logs": {"xid": "Xid=(?P<xid>[0-9]+"}},
            "logs.xid: 'Xid=(?P<xid>[0-9]+' is not a regex: missing ), unterminated subpattern",
        ),
        (
            {"logs": {"xid": "Xid=(?P<xid>[0-9]+)"}},
            "logs.xid: 'Xid=(?P<xid>[0-9]+)' has no group (?P<dev>...): the experiments read "
            "it from the line",
        ),
        (
            {"logs": {"unhealthy": "marked unhealthy"}},
            "logs.unhealthy: 'marked unhealthy' has no group (?P<dev>...)",
        ),
        ({"logs": {"restart": "restart["}}, "logs.restart: 'restart[' is not a regex"),
        ({"logs": {"xids": "Xid"}}, "logs.xids: unknown key (expected one of: xid, unhealthy"),
        ({"logs": "nope.yaml"}, "logs: no file "),
        ({"logs": ["x"]}, "logs: expected a mapping"),
        (
            {"process": "docker"},
            "process: expected 'gpulab-plugin' or 'nvidia-device-plugin', found 'docker'",
        ),
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


def test_a_bad_line_in_a_shared_logs_file_names_both_files_and_the_key(tmp_path: Path) -> None:
    (tmp_path / "logs.yaml").write_text("xid: 'Xid=(?P<xid>[0-9]+) on (?P<dev>'\n")
    path = write(tmp_path, {**MINE, "logs": "logs.yaml"})
    with pytest.raises(SubjectError) as e:
        subject.load(path)
    assert str(e.value).startswith(f"{path}: logs: {tmp_path / 'logs.yaml'}: xid: 'Xid=")
    assert "is not a regex" in str(e.value) and "\n" not in str(e.value)


def test_a_logs_file_is_read_relative_to_the_subject_file(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "logs.yaml").write_text("xid: 'Xid (?P<xid>[0-9]+) on (?P<dev>\\S+)'\n")
    s = subject.load(write(tmp_path, {**MINE, "logs": "shared/logs.yaml"}))
    assert s.logs.xid == r"Xid (?P<xid>[0-9]+) on (?P<dev>\S+)"
    assert s.logs.unstated == ["unhealthy", "healthy", "registered", "restart"]


def test_the_subjects_of_one_plugin_name_one_logs_file() -> None:
    """No line written twice: every subject that runs gpulab's plugin (or NVIDIA's) names
    its plugin's file; NVIDIA's states no Healthy line (it never marks one Healthy)."""
    files: dict[str, set[str]] = {}
    for p in sorted(subject.SUBJECTS_DIR.glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        files.setdefault(data["process"], set()).add(data["logs"])
    assert files == {"gpulab-plugin": {"logs/gpulab.yaml"},
                     "nvidia-device-plugin": {"logs/nvidia.yaml"}}  # fmt: skip
    found = {s.name: s for s in subject.shipped()}
    assert found["gpulab"].logs.unstated == []
    assert found["nvidia-v0.17.4"].logs.unstated == ["healthy"]
    assert found["nvidia-v0.17.4"].logs == found["nvidia-cdi-v0.19.3"].logs


def test_examples_state_their_plugins_log_lines_in_one_file_and_no_process() -> None:
    """Every tiny-gpu-plugin example names its one logs file (the container tier checks
    its lines against the plugin's log); no process: the node tier runs only the processes
    it knows."""
    one = (subject.EXAMPLES_DIR / "tiny-gpu-plugin" / "logs.yaml").resolve()
    for s in [s for s in subject.examples() if s.name.startswith("tiny-gpu-plugin")]:
        named = yaml.safe_load(s.source.read_text())["logs"]
        assert (s.source.parent / named).resolve() == one, s.name
        assert s.logs.unstated == ["unhealthy", "healthy", "restart"]
        said = r"subject\.yaml: process is not stated, and the node tier reads it: state one of "
        with pytest.raises(subject.Unstated, match=said + r"gpulab-plugin \| nvidia-device-plugin"):
            s.process  # noqa: B018


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
    _share, tiny, devices, opaque = subject.examples()
    assert tiny.name == "tiny-gpu-plugin"
    assert tiny.spec.resource == "example.com/gpu"
    assert tiny.spec.device_ids.env == "TINY_GPU_UUIDS"
    assert tiny.spec.image.build == "." and tiny.path(tiny.spec.image.prepare or "").is_file()
    # Its devices mode: another subject of the same build directory (one image).
    assert devices.name == "tiny-gpu-plugin-devices" and devices.plugin == tiny.plugin
    assert devices.spec.device_ids.device_specs == "/dev/nvidia{minor}"
    assert devices.spec.device_ids.env is None
    # Its opaque mode: the devices mode's DaemonSet with its mode changed, ids naming no GPU.
    assert opaque.plugin == tiny.plugin and opaque.spec.env == {"TINY_GPU_MODE": "opaque"}
    assert opaque.spec.device_ids.opaque and opaque.gpu_of("gpu-7f3a19c2", []) is None


def test_the_sharing_example_names_its_scheduler_and_reads_the_env_its_own_way() -> None:
    """gpu-mem-share: units of memory by ids that name no GPU, the GPU's index in the env,
    its scheduler and extender as companions; the broken variant is the same image."""
    share = subject.examples()[0]
    assert share.name == "gpu-mem-share" and share.expects.shares_memory
    files = [c for c in share.spec.companions if isinstance(c, str)]
    charts = [c for c in share.spec.companions if isinstance(c, subject.Chart)]
    assert files == ["scheduler.yaml"] and [c.path for c in charts] == ["webhook"]
    assert share.charts == charts and share.scheduler_webhook
    assert share.spec.scheduler is not None and share.spec.scheduler.choice is not None
    ids = share.spec.device_ids
    assert ids.opaque and ids.env == "NVIDIA_VISIBLE_DEVICES"
    three = gpus(3)
    gpu = three[2]
    assert ids.env_form.gpu_of("2", three) == gpu.uuid
    assert share.spec.scheduler.choice.form.gpu_of("2", three) == gpu.uuid
    health = share.expects.node_health
    assert health.unhealthy_of(gpu).search("0:79:Healthy,2:79:Unhealthy")
    assert not health.unhealthy_of(gpu).search("2:79:Healthy,12:79:Unhealthy")
    docs = share.companion_docs({"KUBE_SCHEDULER_IMAGE": "k/s:1", "SUBJECT_IMAGE": "me:1"})
    images = [c["image"] for d, _ in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]]  # fmt: skip
    assert images == ["k/s:1", "me:1", "me:1"]  # scheduler, extender; the webhook (its chart)
    # The chart's objects go to its release namespace; the webhook trusts the CA the chart
    # made, which signed the certificate its server is given.
    by_kind = {d["kind"]: (d, ns) for d, ns in docs}
    hook, _ = by_kind["MutatingWebhookConfiguration"]
    assert by_kind["Secret"][1] == "kube-system" and hook["webhooks"][0]["clientConfig"]["caBundle"]
    assert "c.resources.limits)" in hook["webhooks"][0]["matchConditions"][0]["expression"]
    assert share.companion_docs({}) == share.companion_docs({})  # rendered once: one CA
    broken = subject.load(subject.EXAMPLES_DIR / "gpu-mem-share" / "broken.yaml")
    assert broken.plugin == share.plugin and broken.spec.env == {"GPU_SHARE_IGNORE_SCHEDULER": "1"}
    assert subject.cluster_only([share]) == [f"gpu-mem-share: cluster tier only: "
                                             f"{share.spec.cluster_only}"]  # fmt: skip


THIRD_PARTY = Path(__file__).resolve().parents[2] / "docs/third-party"


def test_a_third_party_subject_runs_the_image_its_user_built() -> None:
    """docs/third-party/*/subject.yaml: valid subjects whose DaemonSet runs an image from the
    local engine (`ref`), never one gpulab would build from another project's source."""
    found = [s for p in sorted(THIRD_PARTY.glob("*/subject.yaml")) for s in subject.from_file(p)]
    assert [s.name for s in found] == ["gke-nvidia-gpu"]
    for s in found:
        assert s.spec.image.ref and s.spec.image.build is None, s.source
        (container,) = s.daemonset["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "${SUBJECT_IMAGE}"
        assert container["imagePullPolicy"] in ("IfNotPresent", "Never")


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


# -- device ids: how a plugin's id names a GPU (DeviceIds.gpu_of)


def gpus(count: int = 3, minors: tuple[int, ...] = ()) -> list[Gpu]:
    """`count` H100s, with the device minors given (a node whose /dev/nvidia<minor> do not
    follow the index), or the profile's (minor = index)."""
    node = inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": count}]}, "n")
    return [replace(g, minor=m) for g, m in zip(node.gpus, minors, strict=True)] if minors \
        else node.gpus  # fmt: skip


def ids(**given: str) -> subject.DeviceIds:
    return subject.DeviceIds.model_validate({"env": "X", **given})


def test_uuid_ids_name_their_gpu_with_or_without_a_replica_suffix() -> None:
    g = gpus()
    form = ids()
    assert form.id == "{uuid}"
    assert form.gpu_of(g[1].uuid, g) == g[1].uuid
    assert form.gpu_of(f"{g[1].uuid}::3", g) == g[1].uuid  # NVIDIA's time-slicing id
    assert form.replica_of(f"{g[1].uuid}::3") == 3 and form.replica_of(g[1].uuid) is None
    assert form.gpu_of("GPU-00000000-0000-0000-0000-000000000000", g) is None  # another node's
    assert form.gpu_of("nvidia1", g) is None


def test_mig_uuids_name_their_mig_device() -> None:
    g = gpus(1)
    slices = [MigDevice(0, 0, g[0].uuid, 1, 0, "1g.10gb", 9856, 16, mig_uuid(g[0].uuid, 1, 0))]
    assert ids().gpu_of(slices[0].uuid, g, slices) == slices[0].uuid
    assert ids().gpu_of(slices[0].uuid, g) is None  # not one of the GPUs given


def test_minor_ids_name_the_gpu_of_that_device_node_not_that_index() -> None:
    """GKE's plugin: `nvidia<minor>`; a GPU's device node is /dev/nvidia<minor>, which need
    not follow NVML's index (a minor of -1 in an inventory means: the index)."""
    g = gpus(3, minors=(4, 0, -1))
    form = ids(id="nvidia{minor}")
    assert [form.gpu_of(f"nvidia{m}", g) for m in (4, 0, 2)] == [g[0].uuid, g[1].uuid, g[2].uuid]
    assert form.gpu_of("nvidia1", g) is None
    assert form.gpu_of(g[0].uuid, g) is None
    assert ids(id="gpu{index}").gpu_of("gpu0", g) == g[0].uuid


def test_a_replica_placeholder_reads_time_sliced_ids_of_another_shape() -> None:
    """GKE's time-sharing ids are nvidia<minor>/vgpu<k>."""
    g = gpus()
    form = ids(id="nvidia{minor}/vgpu{replica}")
    assert form.gpu_of("nvidia2/vgpu5", g) == g[2].uuid and form.replica_of("nvidia2/vgpu5") == 5
    assert form.gpu_of("nvidia2", g) is None  # the pattern says every id has a replica


def test_device_specs_name_gpus_by_their_device_nodes() -> None:
    g = gpus(2, minors=(7, 3))
    specs = subject.DeviceIds.model_validate(
        {"device_specs": "/dev/nvidia{minor}", "id": "nvidia{minor}"}
    )
    assert specs.nodes is not None
    assert specs.nodes.gpu_of("/dev/nvidia3", g) == g[1].uuid
    assert specs.nodes.gpu_of("/dev/nvidiactl", g) is None
    assert specs.nodes.gpu_of("/dev/nvidia3::1", g) is None  # no replicas in a path
    cdi = subject.DeviceIds.model_validate({"cdi": "k8s.device-plugin.nvidia.com/gpu"})
    assert cdi.nodes is not None and cdi.nodes.gpu_of("/dev/nvidia7", g) == g[0].uuid
    assert ids().nodes is None  # an env var names the GPUs itself


def test_a_subject_with_nvidia_minor_ids_maps_them_and_is_its_own_trait(tmp_path: Path) -> None:
    data = {**MINE, "device_ids": {"device_specs": "/dev/nvidia{minor}", "id": "nvidia{minor}"}}
    s = subject.load(write(tmp_path, data))
    g = gpus()
    assert s.gpu_of("nvidia1", g) == g[1].uuid
    assert s.trait("device_ids") == "device_specs /dev/nvidia{minor}, id nvidia{minor}"
    assert s.trait("device_ids") != subject.load("gpulab").trait("device_ids")


# -- the guide


GUIDE = Path(__file__).resolve().parents[2] / "docs/subjects.md"


def keys_of(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every key a subject file may hold, dotted (`device_ids.id`), nested models too."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        for sub in (field.annotation, *get_args(field.annotation)):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out |= keys_of(sub, f"{prefix}{name}.")
    return out


def test_the_guide_documents_every_key_of_the_model_and_no_other() -> None:
    """docs/subjects.md's "Every key" table cannot drift from clusters/subjects/subject.py."""
    section = GUIDE.read_text().split("## Every key", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \|", section, re.MULTILINE)
    assert len(rows) == len(set(rows)), "a key has two rows"
    assert set(rows) == keys_of(subject.SubjectSpec)


def test_the_guides_examples_are_valid_subjects(tmp_path: Path) -> None:
    """Its smallest subject loads; its device_ids lines validate."""
    text = GUIDE.read_text()
    smallest = text.split("## The smallest subject", 1)[1].split("```yaml\n", 1)[1]
    data = yaml.safe_load(smallest.split("```", 1)[0])
    assert data["daemonset"] == "daemonset.yaml"
    assert subject.load(write(tmp_path, {**data, "daemonset": "ds.yaml"})).name == "my-plugin"
    for line in re.findall(r"^device_ids: (\{.*\})", text, re.MULTILINE):
        subject.DeviceIds.model_validate(yaml.safe_load(line))


def test_subjects_that_build_one_directory_share_one_image_tag() -> None:
    by_name = {s.name: s for s in subject.examples()}
    tiny, devices = by_name["tiny-gpu-plugin"], by_name["tiny-gpu-plugin-devices"]
    opaque = by_name["tiny-gpu-plugin-opaque"]
    assert devices.path(devices.spec.image.build or "") == tiny.path(".")
    args = {"GPULAB_BASE_IMAGE": "gpulab/base:1", "GPULAB_IMAGE": "gpulab/gpulab:1"}
    tag = tiny.build_tag(args)
    assert tag.startswith("gpulab-subject/tiny-gpu-plugin:")
    assert devices.build_tag(args) == opaque.build_tag(args) == tag
    # An image it may start FROM changed: built again.
    assert tiny.build_tag({**args, "GPULAB_IMAGE": "gpulab/gpulab:2"}) != tag
