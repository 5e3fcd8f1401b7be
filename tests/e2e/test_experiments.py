"""Experiments without a cluster: every shipped file validates against the schema and its
lab, bad files fail with one line naming the key, and a recorded run renders into a
report whose layers, verdicts and picture are right."""

from __future__ import annotations

import copy
import io
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from clusters.labs import dra, spec
from clusters.labs.lab import Lab
from clusters.subjects import subject as subjects
from clusters.subjects.subject import Logs
from e2e import experiments as ex
from e2e import report
from e2e.recording import (
    ActionRun,
    Fault,
    LogLine,
    MigChange,
    PodInfo,
    Recording,
    Sample,
    evaluate,
    layer_stats,
    mig_lives,
    traces,
)
from e2e.runner import Runner, parse_log
from fakenvml import faults
from gpulab.cli import main

SHIPPED = sorted(ex.EXPERIMENTS.glob("*.yaml"))
# The shipped labs the experiments below are checked against, and GPU nodes of theirs.
HETERO, DRA, DYNMIG = (spec.load(n) for n in ("hetero", "dra", "dra-dynmig"))
H_NODE, H_LAST = HETERO.gpu_nodes[0], HETERO.gpu_nodes[-1]
D_NODE, M_NODE = DRA.gpu_nodes[0], DYNMIG.gpu_nodes[0]
MINIMAL = {
    "name": "mini",
    "lab": "hetero",
    "duration": "10s",
    "timeline": [{"at": "1s", "do": "xid", "node": H_NODE.name, "gpu": 0, "code": 79}],
}


def beyond(node: spec.Node) -> str:
    """check_lab's words for the GPU just past the node's last."""
    n = node.gpu_count
    return f"GPU {n} not in inventory of node {node.name} (0-{n - 1})"


def test_the_three_required_experiments_ship() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"xid-storm", "rolling-failure", "kubelet-restart-during-fault"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_experiment_validates_against_schema_and_lab(path: Path) -> None:
    exp = ex.load(path)
    assert exp.name == path.stem
    ex.check_lab(exp, str(path))
    assert exp.expect, "an experiment without expectations proves nothing"


def _with(**changes: object) -> dict:
    d = copy.deepcopy(MINIMAL)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with(timeline=[{"at": "1s", "do": "explode"}]),
         "timeline[0].do: expected one of 'xid', 'ecc', "),
        (_with(timeline=[{"at": "1s", "do": "xid", "node": "n", "gpu": 0}]),
         "timeline[0].xid.code: required key missing"),
        (_with(timeline=[{"at": "1s", "do": "lost", "node": "n", "gpu": 0, "cnt": 2}]),
         "timeline[0].lost.cnt: unknown key (expected one of: at, node, gpu, do)"),
        (_with(duration="soon"), "duration: 'soon': expected a duration such as 500ms, 2s"),
        (_with(timeline=[{"at": "20s", "do": "restart_kubelet", "node": "n"}]),
         "timeline[0] at 20s is after duration 10s"),
        (_with(expect=[{"check": "changes", "node": "n"}]),
         "expect[0].changes: give `equals:`, `min:` or `max:`"),
        (_with(expect=[{"check": "pod", "name": "p", "phase": "Running", "during": [1]}]),
         "expect[0].pod.during: [1]: expected [from, to]"),
        (_with(timeline=[{"at": 0, "do": "create_pod", "name": "p", "spec": "s", "pod": {}}]),
         "timeline[0].create_pod: give one of `spec:` (a file under e2e/specs) or `pod:`, not"),
        (_with(expect=[{"check": "taints", "node": "n"}]),
         "expect[0].taints.equals: required key missing"),
        (_with(expect=[{"check": "changes", "node": "n", "of": "taints", "equals": 1}]),
         "expect[0].changes.of: expected 'allocatable', 'capacity', 'tainted' or "
         "'mig_devices', found 'taints'"),
        (_with(expect=[{"check": "capacity", "node": "n", "equals": 1, "at": 2, "during": [1, 3]}]),
         "expect[0].capacity: give `at:` or `during:`, not both"),
        (_with(expect=[{"check": "capacity", "node": "n", "equals": 1, "during": [3, 1]}]),
         "expect[0].capacity: during: [3.0, 1.0] ends before it starts"),
        (_with(timeline=[{"at": "-1s", "do": "lost", "node": "n", "gpu": 0}]),
         "timeline[0].lost.at: '-1s': a duration cannot be negative"),
        (_with(timeline=[{"at": 1, "do": "ecc", "node": "n", "gpu": 0, "double": False,
                          "xid": False}]),
         "timeline[0].ecc: xid: false only with double: true (a single-bit error has no Xid)"),
        (_with(settle="30s", expect=[{"check": "changes", "node": "n", "equals": 1},
                                     {"check": "capacity", "node": "n", "equals": 1, "at": 2}]),
         "settle: no expectation at the end reads the samples, so nothing to wait for"),
        (_with(timeline=[{"at": 0, "do": "create_pod", "name": "p", "spec": "experiments/gpu-1"},
                         {"at": 1, "do": "delete_pod", "name": "p", "once_running": "p"}]),
         "once_running: give `settle:`, the most it may wait"),
        (_with(expect=[{"check": "capacity", "node": "n", "equals": 1,
                        "during": ["created", "3s"]}]),
         "expect[0].capacity: during: [created, ...] opens at a pod's creation: `check: pod` "
         "only"),
    ],
)  # fmt: skip
def test_bad_experiment_is_one_line_naming_the_key(data: dict, message: str) -> None:
    with pytest.raises(ex.ExperimentError) as err:
        ex.from_dict(data, "bad.yaml")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"bad.yaml: {message}")


@pytest.mark.parametrize(
    ("timeline", "expect", "message"),
    [
        ([{"at": 1, "do": "xid", "node": "hetero-worker9", "gpu": 0, "code": 79}], [],
         "node 'hetero-worker9' has no fake GPUs in lab hetero"),
        ([{"at": 1, "do": "xid", "node": H_LAST.name, "gpu": H_LAST.gpu_count, "code": 79}], [],
         beyond(H_LAST)),
        ([{"at": 1, "do": "create_pod", "name": "p", "spec": "nope"}], [],
         "no pod spec e2e/specs/nope.yaml"),
        ([{"at": 1, "do": "delete_pod", "name": "p"}], [], "pod 'p' is not created"),
        (MINIMAL["timeline"], [{"check": "pod", "name": "ghost", "phase": "Running"}],
         "pod 'ghost' is not created by the timeline"),
    ],
)  # fmt: skip
def test_experiment_naming_what_the_lab_lacks_is_refused(
    timeline: list, expect: list, message: str
) -> None:
    exp = ex.from_dict(_with(timeline=timeline, expect=expect))
    with pytest.raises(ex.ExperimentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ex.check_lab(exp, "bad.yaml")


XID = {"at": 1, "do": "xid", "node": D_NODE.name, "gpu": 1, "code": 79}


@pytest.mark.parametrize(
    ("lab", "timeline", "expect", "message"),
    [
        ("dra", [XID], [{"check": "allocatable", "node": D_NODE.name, "equals": 4}],
         f"expect[0] (allocatable): lab dra runs NVIDIA's DRA driver {dra.version()}: no device "
         "plugin"),
        ("dra", [XID], [{"check": "plugin_log", "node": D_NODE.name, "event": "xid", "min": 1}],
         "expect[0] (plugin_log): lab dra runs NVIDIA's DRA driver"),
        ("dra", [XID], [{"check": "devices_healthy"}], "expect[0] (devices_healthy): lab dra runs"),
        ("dra", [XID, {"at": 2, "do": "stop_plugin", "node": D_NODE.name}], [],
         "timeline[1] (stop_plugin): lab dra runs NVIDIA's DRA driver"),
        ("dra", [XID], [{"check": "changes", "node": D_NODE.name, "equals": 1}],
         f"expect[0] (changes): lab dra runs NVIDIA's DRA driver {dra.version()}: count changes "
         "`of: tainted`"),
        ("dra", [{"at": 0, "do": "create_pod", "name": "p", "gpus": 0}], [],
         "timeline[0] (create_pod): `gpus: 0` on a DRA lab"),
        ("dra", [XID], [{"check": "taints", "node": D_NODE.name, "gpu": D_NODE.gpu_count,
                         "equals": 1}],
         f"expect[0] (taints): {beyond(D_NODE)}"),
        ("dra", [XID], [{"check": "taints", "node": DRA.control_plane.name, "equals": 0}],
         f"node '{DRA.control_plane.name}' has no fake GPUs in lab dra"),
        ("hetero", MINIMAL["timeline"], [{"check": "taints", "node": H_NODE.name, "equals": 0}],
         "expect[0] (taints): lab hetero runs a device plugin: no device taints"),
        ("hetero", MINIMAL["timeline"],
         [{"check": "changes", "node": H_NODE.name, "of": "tainted", "equals": 0}],
         "expect[0] (changes): lab hetero runs a device plugin: no device taints to count"),
        ("hetero", [{"at": 0, "do": "create_pod", "name": "p", "selector": "true"}], [],
         "timeline[0] (create_pod): lab hetero runs a device plugin: `selector:` needs"),
        ("mig", [{"at": 0, "do": "create_pod", "name": "p", "mig": "1g.10gb"}], [],
         "timeline[0] (create_pod): lab mig runs a device plugin: `mig:` needs a `dra:` lab"),
        ("dra-dynmig", [{"at": 0, "do": "create_pod", "name": "p", "mig": "1g.5gb"}], [],
         "timeline[0] (create_pod): no GPU of lab dra-dynmig has MIG profile '1g.5gb' "
         "(1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"),
        ("dra-dynmig", [{"at": 0, "do": "create_pod", "name": "p", "mig": "1g.10gb"}],
         [{"check": "mig_devices", "node": M_NODE.name, "gpu": M_NODE.gpu_count, "equals": 0}],
         f"expect[0] (mig_devices): {beyond(M_NODE)}"),
    ],
)  # fmt: skip
def test_a_lab_refuses_what_its_kind_of_driver_cannot_show(
    lab: str, timeline: list, expect: list, message: str
) -> None:
    """A DRA lab has no extended resource and no plugin per node; a device-plugin lab no
    ResourceSlices, so no taints and no claims to select with."""
    exp = ex.from_dict(_with(lab=lab, timeline=timeline, expect=expect))
    with pytest.raises(ex.ExperimentError) as err:
        ex.check_lab(exp, "bad.yaml")
    assert str(err.value).startswith("bad.yaml: ") and message in str(err.value)


def test_a_taints_check_matches_a_key_whole_or_by_its_last_part() -> None:
    t = ex.Taints(check="taints", node="n", key="xid", equals=1)
    assert t.matches("gpu.nvidia.com/xid=79:NoSchedule")
    assert not t.matches("gpu.nvidia.com/gpu-lost:NoSchedule")
    full = ex.Taints(check="taints", node="n", key="gpu.nvidia.com/gpu-lost", equals=1)
    assert full.matches("gpu.nvidia.com/gpu-lost:NoSchedule")
    assert not full.matches("example.com/gpu-lost:NoSchedule")
    assert ex.Taints(check="taints", node="n", equals=0).matches("anything:None")


def test_a_delete_once_another_pod_runs_names_a_pod_of_the_timeline() -> None:
    exp = ex.from_dict(_with(settle="30s", timeline=[
        {"at": 0, "do": "create_pod", "name": "p", "spec": "experiments/gpu-1"},
        {"at": 1, "do": "delete_pod", "name": "p", "once_running": "q"}],
        expect=[{"check": "pod", "name": "p", "phase": "Absent"}]))  # fmt: skip
    with pytest.raises(ex.ExperimentError, match="once_running: pod 'q' is not created by"):
        ex.check_lab(exp, "bad.yaml")


def test_unknown_experiment_names_the_shipped_ones() -> None:
    with pytest.raises(ex.ExperimentError, match=r"shipped: .*xid-storm"):
        ex.load("no-such-experiment")


def test_times_accept_units_and_plain_seconds() -> None:
    assert [ex.seconds(v) for v in ("1.5s", "250ms", "2m", 3, 0.5)] == [1.5, 0.25, 120, 3, 0.5]
    with pytest.raises(ValueError):
        ex.seconds(-1)


def test_fault_actions_are_spelled_as_in_the_fault_table() -> None:
    tags = {c.model_fields["do"].annotation.__args__[0] for c in ex.FAULTS}
    assert tags == set(faults.NAMES)


def test_ecc_takes_double_as_the_cli_and_reads_the_older_double_bit_key() -> None:
    ecc = {"at": 1, "do": "ecc", "node": H_NODE.name, "gpu": 0}
    new = ex.from_dict(_with(timeline=[{**ecc, "double": False}])).timeline[0]
    old = ex.from_dict(_with(timeline=[{**ecc, "double_bit": False}])).timeline[0]
    assert isinstance(new, ex.Ecc) and old == new and not new.double
    assert "double_bit" not in new.model_dump() and new.model_dump()["double"] is False
    assert ex.from_dict(_with(timeline=[ecc])).timeline[0].double  # type: ignore[union-attr]
    assert new.describe() == f"single-bit ECC on {H_NODE.name} GPU 0"


def test_ecc_sends_the_driver_s_xid_48_unless_xid_is_false() -> None:
    ecc = {"at": 1, "do": "ecc", "node": H_NODE.name, "gpu": 0}
    (default,) = ex.from_dict(_with(timeline=[ecc])).timeline
    (alone,) = ex.from_dict(_with(timeline=[{**ecc, "xid": False}])).timeline
    assert default.xid and not alone.xid  # type: ignore[union-attr]
    assert alone.describe() == f"double-bit ECC (no Xid 48) on {H_NODE.name} GPU 0"


# -- plugin log lines


def test_parse_log_reads_the_lines_a_subject_states_with_containerd_timestamps() -> None:
    """gpulab's plugin logs NVIDIA's words, so its subject's lines read NVIDIA's too."""
    t0 = 1_700_000_000 * 10**9
    text = "\n".join([
        "2023-11-14T22:13:21.000500000Z 2023-11-14 22:13:21,000 I XidCriticalError: Xid=79 "
        "on Device=GPU-a; marking device as unhealthy.",
        "2023-11-14T22:13:21.001Z 2023-11-14 22:13:21,001 I 'nvidia.com/gpu' device marked "
        "unhealthy: GPU-a (Xid 79)",
        "2023-11-14T22:13:22.5Z I1114 22:13:22.500000 1 server.go:279] 'nvidia.com/gpu' "
        "device marked unhealthy: GPU-b::2",
        "2023-11-14T22:13:23Z I1114 22:13:23 1 server.go:1] Registered device plugin for "
        "'nvidia.com/gpu' with Kubelet",
        "2023-11-14T22:13:24Z Registered device plugin for 'example.com/rdma' with Kubelet",
        "2023-11-14T22:13:25Z 'nvidia.com/gpu' device marked healthy: GPU-a",
        "garbage line without a stamp",
    ])  # fmt: skip
    lines = parse_log(text, "n1", t0, subjects.load("gpulab").logs)
    got = [(round(x.t, 4), x.event, x.device, x.healthy, x.xid) for x in lines]
    assert got == [
        (1.0005, "xid", "GPU-a", None, 79),
        (1.001, "update", "GPU-a", False, None),
        (2.5, "update", "GPU-b::2", False, None),
        (3.0, "registered", "", None, None),
        (5.0, "update", "GPU-a", True, None),
    ]


# What each plugin logs, as it logs it: its registration from a recorded run of both
# (tests/fakenvml/data/h100), the rest in the words of its source (plugin/health.py and
# main.py; NVIDIA's health.go, server.go, main.go).
RECORDED = Path(__file__).parents[1] / "fakenvml" / "data" / "h100" / "h100-plugins.txt"


def registered_line(section: str) -> str:
    block = RECORDED.read_text().split(f"== {section}\n", 1)[1].split("\n== ", 1)[0]
    return next(ln for ln in block.splitlines() if "Registered device plugin" in ln)


SAID = {
    "gpulab-plugin": [
        "2026-11-23 05:41:03,001 I XidCriticalError: Xid=79 on Device=GPU-a (gi=-1, ci=-1); "
        "marking device as unhealthy.",
        "2026-11-23 05:41:03,002 I 'nvidia.com/gpu' device marked unhealthy: GPU-a (Xid 79)",
        "2026-11-23 05:41:04,000 I 'nvidia.com/gpu' device marked healthy: GPU-a",
        registered_line("ours"),
        "2026-11-23 05:41:05,000 I inotify: /var/lib/kubelet/device-plugins/kubelet.sock "
        "created, re-registering.",
    ],
    "nvidia-device-plugin": [
        "I1123 05:41:03.001000     536 health.go:158] XidCriticalError: Xid=79 on "
        "Device=GPU-a; marking device as unhealthy.",
        "I1123 05:41:03.002000     536 server.go:279] 'nvidia.com/gpu' device marked "
        "unhealthy: GPU-a",
        "I1123 05:41:04.000000     536 server.go:279] 'nvidia.com/gpu' device marked healthy: "
        "GPU-a",  # never logged by it: not stated, so not read
        registered_line("nvidia v0.19.3"),
        "I1123 05:41:05.000000     536 main.go:180] inotify: /var/lib/kubelet/device-plugins/"
        "kubelet.sock created, restarting.",
    ],
}
READ = {
    "gpulab-plugin": [
        ("xid", "GPU-a", None, 79), ("update", "GPU-a", False, None),
        ("update", "GPU-a", True, None), ("registered", "", None, None),
        ("restart", "", None, None),
    ],
    "nvidia-device-plugin": [
        ("xid", "GPU-a", None, 79), ("update", "GPU-a", False, None),
        ("registered", "", None, None), ("restart", "", None, None),
    ],
}  # fmt: skip


@pytest.mark.parametrize("subject", subjects.shipped(), ids=lambda s: s.name)
def test_a_shipped_subjects_lines_read_its_plugins_log(subject: subjects.Subject) -> None:
    program = subject.process  # which plugin runs: the words it logs
    text = "\n".join(f"2026-11-23T05:41:0{k}Z {line}" for k, line in enumerate(SAID[program]))
    got = parse_log(text, "n1", 0, subject.logs, "nvidia.com/gpu")
    assert [(x.event, x.device, x.healthy, x.xid) for x in got] == READ[program]


def test_a_registration_counts_for_the_subjects_resource_only() -> None:
    logs = subjects.load("nvidia-mig").logs
    text = "\n".join([
        "2026-11-23T05:41:01Z Registered device plugin for 'nvidia.com/mig-1g.10gb' with Kubelet",
        "2026-11-23T05:41:02Z Registered device plugin for 'nvidia.com/mig-2g.20gb' with Kubelet",
    ])  # fmt: skip
    got = parse_log(text, "n1", 0, logs, "nvidia.com/mig-1g.10gb")
    assert [x.text.split("'")[1] for x in got] == ["nvidia.com/mig-1g.10gb"]


def test_the_dra_driver_states_its_xid_line_and_nothing_else() -> None:
    text = (
        "2026-11-23T05:41:01Z I1123 05:41:01.000000 1 device_health.go:201] Sending "
        "XID=79 health event for device GPU-d1\n"
        "2026-11-23T05:41:02Z Registered device plugin for 'nvidia.com/gpu' with Kubelet"
    )
    got = parse_log(text, "n1", 0, dra.DraDriver.logs)
    assert [(x.event, x.device, x.xid) for x in got] == [("xid", "GPU-d1", 79)]
    assert dra.DraDriver.logs.unstated == ["unhealthy", "healthy", "registered", "restart"]


def test_a_subject_that_states_no_lines_reads_none() -> None:
    text = "\n".join(f"2026-11-23T05:41:0{k}Z {line}" for k, line in
                     enumerate(SAID["gpulab-plugin"]))  # fmt: skip
    assert parse_log(text, "n1", 0, Logs()) == []


# -- a recorded run, rendered


UUIDS = {"lab-a": ["GPU-a0", "GPU-a1", "GPU-a2", "GPU-a3"], "lab-b": ["GPU-b0", "GPU-b1"]}


def sample_recording(plugin_storms: bool = False) -> Recording:
    """A storm of 3 Xid 79 on lab-a GPU 1 at 2.0 s (the plugin updates 10 ms later, the API
    500 ms after that), a recovery at 6 s, and two pods: one Running on lab-b, one placed
    on lab-a after the fault."""
    exp = ex.from_dict({
        "name": "sample", "lab": "lab", "duration": "8s", "sample_interval": "100ms",
        "timeline": [
            {"at": 0, "do": "create_pod", "spec": "experiments/gpu-1", "name": "p1",
             "node": "lab-b"},
            {"at": 2, "do": "xid", "node": "lab-a", "gpu": 1, "code": 79, "count": 3,
             "over": "20ms"},
            {"at": 3, "do": "create_pod", "spec": "experiments/gpu-1", "name": "p2", "gpus": 2},
            {"at": 6, "do": "recover", "node": "lab-a", "gpu": 1},
        ],
        "expect": [
            {"check": "allocatable", "node": "lab-a", "equals": 3, "during": ["3s", "6s"]},
            {"check": "allocatable", "node": "lab-a", "equals": 4},
            {"check": "capacity", "node": "lab-a", "equals": 4, "during": [0, "end"]},
            {"check": "changes", "node": "lab-a", "equals": 2},
            {"check": "plugin_log", "node": "lab-a", "event": "update", "max": 2},
            {"check": "pod", "name": "p1", "phase": "Running", "node": "lab-b",
             "during": ["1s", "end"]},
            {"check": "devices_healthy"},
        ],
    })  # fmt: skip
    rec = Recording(
        exp.model_dump(mode="json"), "gpulab", "2026-01-01T00:00:00+00:00", 0,
        {n: {"gpus": len(u), "product": "X", "uuids": u} for n, u in UUIDS.items()},
    )  # fmt: skip
    for k, t in enumerate((2.0, 2.01, 2.02)):
        rec.faults.append(Fault(10 + 2 * k, t, "lab-a", 1, "GPU-a1", "xid", 79, 1))
        rec.log.append(LogLine(t + 0.002, "lab-a", "xid", "GPU-a1", xid=79))
        if k == 0 or plugin_storms:
            rec.log.append(LogLine(t + 0.01, "lab-a", "update", "GPU-a1", healthy=False))
    rec.faults.append(Fault(16, 6.0, "lab-a", 1, "GPU-a1", "recover", 0, 3))
    rec.log.append(LogLine(6.005, "lab-a", "update", "GPU-a1", healthy=True))
    for i in range(81):
        t = i / 10
        alloc = 3 if 2.51 <= t < 6.3 else 4
        pods = {"p1": ["Running" if t >= 0.5 else "Pending", "lab-b"]}
        if t >= 3:
            pods["p2"] = ["Running" if t >= 3.5 else "Pending", "lab-a" if t >= 3.2 else ""]
        rec.samples.append(Sample(t, {"lab-a": [4, alloc, str(i // 20)], "lab-b": [2, 2, "1"]},
                                  pods))  # fmt: skip
    rec.pods = [PodInfo("p1", 0.0, "lab-b", "Running", "", ["GPU-b0"]),
                PodInfo("p2", 3.0, "lab-a", "Running", "", ["GPU-a0", "GPU-a2"])]  # fmt: skip
    return rec


def test_layers_of_a_burst_are_attributed_to_its_first_xid() -> None:
    trs = traces(sample_recording())
    first, *rest, rec = trs
    assert (first.fault.seq, first.seen, first.update, first.api) == (10, 2.002, 2.01, 2.6)
    assert first.to_plugin == pytest.approx(0.010)
    assert first.to_api == pytest.approx(0.59)
    assert all(t.seen is not None and t.update is None and t.api is None for t in rest)
    assert (rec.fault.kind, rec.update, rec.api, rec.api_value) == ("recover", 6.005, 6.3, (3, 4))


def test_a_storming_plugin_has_one_update_per_xid_but_one_api_change() -> None:
    trs = traces(sample_recording(plugin_storms=True))
    assert [t.update is not None for t in trs[:3]] == [True, True, True]
    assert [t.api is not None for t in trs[:3]] == [True, False, False]
    outcomes = evaluate(sample_recording(plugin_storms=True))
    storm = next(o for o in outcomes if "`update` lines" in o.text)
    assert (storm.passed, storm.observed) == (False, "4")


def test_every_expectation_of_the_sample_passes() -> None:
    outcomes = evaluate(sample_recording())
    assert [o.text for o in outcomes if not o.passed] == []
    changes = next(o for o in outcomes if "changes" in o.text)
    assert changes.observed == "2 (4 → 3 at 2.60s → 4 at 6.30s)"


def test_a_failed_change_count_gives_its_times_the_longest_sample_gap_and_the_faults() -> None:
    rec = sample_recording()
    del rec.samples[30:40]  # 3.0-3.9 s unsampled: a gap a change could fall in
    [changes] = evaluate(rec, [ex.Changes(check="changes", node="lab-a", equals=3)])
    assert not changes.passed
    assert changes.observed == (
        "2 (4 → 3 at 2.60s → 4 at 6.30s); longest sample gap 1.10s from 2.90s; "
        "faults: Xid 79 on GPU 1 at 2.00s, Xid 79 on GPU 1 at 2.01s, Xid 79 on GPU 1 at 2.02s, "
        "recover on GPU 1 at 6.00s"
    )


def test_a_settle_waits_for_the_end_state_read_from_samples_only() -> None:
    exp = sample_recording().spec
    assert [e.describe() for e in exp.settles_on()] == ["allocatable of lab-a = 4 at end"]


class GrowingSamples:
    """A sampler whose samples arrive over time: allocatable 3, then 4 from `at` on."""

    def __init__(self, at: float) -> None:
        self.samples: list[Sample] = []
        self.at, self.t0 = at, time.monotonic()
        self.stop = threading.Event()
        # The first sample at once: a loaded machine may start the thread past `at`, and
        # a run with no sample before it would show no change to judge.
        self._sample()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            self._sample()

    def _sample(self) -> None:
        t = time.monotonic() - self.t0
        alloc, phase = (4, "Running") if t >= self.at else (3, "Pending")
        self.samples.append(Sample(t, {"lab-a": [4, alloc, "1"]}, {"p": [phase, "lab-a"]}))


def settle(at: float, settle_s: float, until_running: bool = False) -> tuple[float, Recording]:
    """A runner's settle over GrowingSamples(at), past a duration of 0 s (or, with
    `until_running`, its wait for pod p to run): how long it took."""
    data = {"name": "s", "lab": "lab", "duration": 0, "settle": settle_s,
            "sample_interval": "50ms", "timeline": [{"at": 0, "do": "restart_plugin"}],
            "expect": [{"check": "allocatable", "node": "lab-a", "equals": 4},
                       {"check": "changes", "node": "lab-a", "equals": 0}]}  # fmt: skip
    exp = ex.from_dict(data)
    runner = Runner.__new__(Runner)  # the settle reads the experiment, the clock and say()
    runner.exp, runner.console = exp, Console(file=io.StringIO())
    runner._stop, runner.t0_ns = threading.Event(), time.time_ns()
    rec = Recording(exp.model_dump(mode="json"), "gpulab", "", runner.t0_ns, {})
    runner.sampler = sampler = GrowingSamples(at)  # type: ignore[assignment]
    runner._wait_running("p") if until_running else runner._settle(rec)
    sampler.stop.set()
    # From the samples' own t=0: under CI load the lines above took 0.09 s after it, and a
    # clock started there read an end on the state at 0.3 s as 0.21 s.
    return time.monotonic() - sampler.t0, rec


def test_a_settle_ends_the_run_at_the_first_sample_where_the_end_state_holds() -> None:
    took, rec = settle(at=0.3, settle_s=20)
    assert 0.3 <= took < 10  # it ended on the state, not on the bound
    assert rec.samples[-1].nodes["lab-a"][1] == 4
    first = next(s.t for s in rec.samples if s.nodes["lab-a"][1] == 4)
    assert rec.samples[-1].t - first < 1.0  # within a few intervals of the first such
    outcomes = evaluate(rec)
    # The end state holds; the whole run's count is judged after, never waited for.
    assert [o.passed for o in outcomes] == [True, False]


def test_a_settle_that_never_holds_ends_at_its_bound_and_the_check_fails() -> None:
    took, rec = settle(at=1e9, settle_s=0.4)
    assert took >= 0.4
    assert not evaluate(rec)[0].passed


def test_a_step_once_a_pod_runs_waits_for_it_and_at_most_the_settle() -> None:
    assert 0.3 <= settle(at=0.3, settle_s=20, until_running=True)[0] < 10
    assert settle(at=1e9, settle_s=0.4, until_running=True)[0] >= 0.4


def test_a_window_opened_at_creation_waits_for_the_api_to_make_the_pod() -> None:
    """p2 is asked for at 3 s and the API makes it at 4.25 s (a loaded API server), Pending
    until 4.6 s: a window from a time before that saw it Absent; one from `created` starts
    at the first sample after it (the one at 4.2 s read the pod list before it existed),
    and still fails on a wrong phase inside it."""
    rec = sample_recording()
    for s in rec.samples:
        if s.t >= 3:
            s.pods.pop("p2")
            if s.t >= 4.25:
                s.pods["p2"] = ["Pending" if s.t < 4.6 else "Running", "lab-a"]
    rec.pods[1].created = 4.25

    def pod(phase: str, start: float | str) -> ex.PodPhase:
        return ex.PodPhase(check="pod", name="p2", phase=phase, during=(start, "4.5s"))

    got = evaluate(
        rec, [pod("Pending", "created"), pod("Pending", "3.6s"), pod("Running", "created")]
    )
    assert [(o.passed, o.text, o.observed) for o in got] == [
        (True, "pod p2 Pending during [created, 4.5s]", "Pending on lab-a"),
        (False, "pod p2 Pending during [3.6s, 4.5s]", "Absent at 3.60s"),
        (False, "pod p2 Running during [created, 4.5s]", "Pending on lab-a at 4.30s"),
    ]


def test_a_pod_list_read_across_a_windows_end_is_left_out() -> None:
    """p2 deleted at 5 s: the sample stamped 4.9 s (its taints read first) listed the pods
    from 4.97 to 5.02 s and saw it Terminating (CI, the dynmig experiment). Read across the
    window's end it may show either side, so "Running during [.., 5s]" holds; a list read
    wholly inside the window still fails it."""
    rec = sample_recording()
    for s in rec.samples:
        s.pods_at = [s.t + 0.01, s.t + 0.03]
        if s.t >= 4.85:
            s.pods["p2"] = ["Terminating", "lab-a"]
    (late,) = [s for s in rec.samples if 4.85 <= s.t < 4.95]
    late.pods_at = [4.97, 5.02]
    running = ex.PodPhase(check="pod", name="p2", phase="Running", during=("4s", "5s"))
    assert evaluate(rec, [running])[0].passed
    late.pods_at = [4.96, 4.99]
    assert evaluate(rec, [running])[0].observed == "Terminating on lab-a at 4.90s"


def test_a_pod_given_a_faulty_gpu_fails_devices_healthy() -> None:
    rec = sample_recording()
    rec.pods[1].devices = ["GPU-a1", "GPU-a2"]  # placed at 3 s, GPU 1 faulty since 2.01 s
    out = evaluate(rec)[-1]
    assert not out.passed
    assert "p2 got lab-a GPU 1, Unhealthy since 2.01s" in out.observed


def test_report_renders_markdown_csv_and_png(tmp_path: Path) -> None:
    outcomes = report.write(sample_recording(), tmp_path)
    assert all(o.passed for o in outcomes)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# sample · gpulab plugin · ✅ PASS (7/7 expectations)")
    assert "![timeline](timeline.png)" in md
    # The burst is one row carrying the first Xid's layers; the recovery its own row.
    burst = (
        "| 2.000-2.020 | 10-14 | a | 1 | 3x Xid 79 in 20 ms | 3 lines | 1 update (first 2.010) |"
    )
    assert f"{burst} 2.600 (4→3) | 10 ms | 590 ms | 600 ms |" in md
    assert "| injected → plugin update | 2 | 5 ms |" in md
    assert "| p2 | 3.000 |" in md and "a: 0, 2" in md
    csv_rows = (tmp_path / "faults.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 4
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert Recording.load(tmp_path / "recording.json") == sample_recording()


def test_a_report_says_not_stated_where_the_subject_states_no_line(tmp_path: Path) -> None:
    """A plugin whose file states no Xid or update line: its cells say so, never blank; a
    check of such lines fails saying why; an Xid's update is still given to it."""
    rec = sample_recording()
    rec.unstated_logs = ["xid", "unhealthy", "healthy", "restart"]
    rec.log = [x for x in rec.log if x.event == "update"]  # what it logs, unread: kept here
    outcomes = report.write(rec, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| 3x Xid 79 in 20 ms | not stated | not stated | 2.600 (4→3) |" in md
    assert "| a | 4 | not stated | not stated | 0 |" in md
    assert "- Not stated in its subject file (`logs:`): xid, unhealthy, healthy, restart" in md
    (check,) = [o for o in outcomes if "plugin on lab-a" in o.text]
    assert not check.passed and check.observed.startswith("not stated")
    assert "not stated" not in (report.write(sample_recording(), tmp_path / "all") and
                                (tmp_path / "all" / "report.md").read_text())  # fmt: skip
    assert Recording.load(tmp_path / "recording.json").unstated_logs == rec.unstated_logs


def dra_recording() -> Recording:
    """A DRA lab: Xid 79 on lab-a GPU 1 at 2.0 s, the driver's line 5 ms later and the
    device's taint in the 2.2 s sample; Xid 13 (ignored: effect None) on GPU 2 at 3.0 s; a
    recovery at 5 s that lifts nothing, and the plugin's restart clearing both at 7 s."""
    exp = ex.from_dict({
        "name": "dra", "lab": "dra", "duration": "8s", "sample_interval": "100ms",
        "timeline": [
            {"at": 2, "do": "xid", "node": "dra-worker", "gpu": 1, "code": 79},
            {"at": 3, "do": "xid", "node": "dra-worker", "gpu": 2, "code": 13},
            {"at": 5, "do": "recover", "node": "dra-worker", "gpu": 1},
            {"at": 6, "do": "restart_plugin"},
        ],
        "expect": [
            {"check": "taints", "node": "dra-worker", "gpu": 1, "key": "xid", "equals": 1,
             "during": ["2.5s", "6.5s"]},
            {"check": "taints", "node": "dra-worker", "key": "gpu-lost", "equals": 0,
             "during": [0, "end"]},
            {"check": "taints", "node": "dra-worker", "equals": 2, "at": "4s"},
            {"check": "taints", "node": "dra-worker", "equals": 0},
            {"check": "changes", "node": "dra-worker", "of": "tainted", "equals": 3},
        ],
    })  # fmt: skip
    uuids = [f"GPU-d{i}" for i in range(4)]
    devices = {f"gpu-{i}": i for i in range(4)}
    rec = Recording(exp.model_dump(mode="json"), "NVIDIA's DRA driver v0.4.1",
                    "2026-01-01T00:00:00+00:00", 0,
                    {"dra-worker": {"gpus": 4, "product": "H100", "uuids": uuids,
                                    "devices": devices}})  # fmt: skip
    rec.faults += [Fault(3, 2.0, "dra-worker", 1, "GPU-d1", "xid", 79, 0),
                   Fault(5, 3.0, "dra-worker", 2, "GPU-d2", "xid", 13, 1),
                   Fault(6, 5.0, "dra-worker", 1, "GPU-d1", "recover", 0, 2)]  # fmt: skip
    rec.log += [LogLine(2.005, "dra-worker", "xid", "GPU-d1", xid=79),
                LogLine(3.004, "dra-worker", "xid", "GPU-d2", xid=13)]  # fmt: skip
    for i in range(81):
        t = i / 10
        taints: dict[str, list[str]] = {}
        if 2.2 <= t < 7.0:
            taints["gpu-1"] = ["gpu.nvidia.com/xid=79:NoSchedule"]
        if 3.1 <= t < 7.0:
            taints["gpu-2"] = ["gpu.nvidia.com/xid=13:None"]
        rec.samples.append(Sample(t, {"dra-worker": [0, 0, "1"]}, {},
                                  {"dra-worker": taints} if taints else {}))  # fmt: skip
    rec.actions.append(ActionRun(3, "restart_plugin", "restart the plugin's pods", 6, 6, 6.9))
    rec.unstated_logs = dra.DraDriver.logs.unstated  # as the runner records it
    return rec


def test_a_dra_recordings_layers_are_the_drivers_line_and_the_devices_taint() -> None:
    xid79, xid13, recover = traces(dra_recording())
    assert (xid79.seen, xid79.api, xid79.taint) == (
        2.005, 2.2, "gpu.nvidia.com/xid=79:NoSchedule")  # fmt: skip
    assert xid79.total == pytest.approx(0.2) and xid79.update is None
    assert (xid13.api, xid13.taint, xid13.api_value) == (3.1, "gpu.nvidia.com/xid=13:None", (1, 2))
    # v0.4.1 lifts nothing on recovery: the taint goes with the restart, 2 s later.
    assert (recover.api, recover.taint) == (7.0, "none")
    stats = layer_stats(traces(dra_recording()), by_taints=True)
    assert list(stats) == ["injected → driver's Xid line", "injected → device taint in API"]
    assert stats["injected → device taint in API"][0] == 3


def test_every_expectation_of_the_dra_sample_passes_and_a_wrong_one_fails() -> None:
    assert [o.text for o in evaluate(dra_recording()) if not o.passed] == []
    rec = dra_recording()
    rec.samples[50].taints = {}  # at 5.0 s the taints are gone for one sample
    failed = [o for o in evaluate(rec) if not o.passed]
    assert [o.text for o in failed] == [
        "tainted GPU 1 of dra-worker (xid) = 1 during [2.5s, 6.5s]",
        "tainted devices of dra-worker changes = 3 times",
    ]
    assert failed[0].observed == "0, 1 (first 0 at 5.00s)"


def test_a_dra_report_shows_taints_not_allocatable(tmp_path: Path) -> None:
    outcomes = report.write(dra_recording(), tmp_path)
    assert all(o.passed for o in outcomes)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# dra · NVIDIA's DRA driver v0.4.1 · ✅ PASS (5/5 expectations)")
    assert ("| 2.000 | 3 | worker | 1 | Xid 79 | 2.005 | "
            "2.200 (0→1) `gpu.nvidia.com/xid=79:NoSchedule` | 200 ms |") in md  # fmt: skip
    assert "| injected → device taint in API | 3 |" in md
    assert "| worker | 3 | 2 | 3 (0 → 1 → 2 → 0) |" in md
    assert "| tainted before |" in md and "allocatable" not in md.split("## Faults")[1]
    assert "not stated" not in md  # the driver's one line is all its report reads
    assert Recording.load(tmp_path / "recording.json") == dra_recording()


def test_a_failed_expectation_makes_the_report_say_fail_and_the_cli_exit_1(
    tmp_path: Path,
) -> None:
    rec = sample_recording()
    rec.samples[-1].nodes["lab-a"][1] = 2  # allocatable 2 at the end, 4 expected
    rec.save(tmp_path / "recording.json")
    assert main(["experiment", "report", str(tmp_path)]) == 1
    md = (tmp_path / "report.md").read_text()
    assert "❌ FAIL (5/7 expectations)" in md
    assert "| ❌ | allocatable of lab-a = 4 at end | 2 |" in md


def test_cli_validate_passes_shipped_files_and_refuses_bad_ones(tmp_path: Path) -> None:
    assert main(["experiment", "validate", *map(str, SHIPPED)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nduration: 5s\ntimeline: []\n")
    assert main(["experiment", "validate", str(bad)]) == 2


def test_e2e_summary_splits_scenario_params_from_the_plugin() -> None:
    from e2e.fixtures import summary_key

    plugins = ["gpulab", "nvidia"]
    assert summary_key("e2e/test_seed.py::test_x[nvidia]", plugins) == ("test_x", "nvidia")
    assert summary_key("e2e/test_hetero.py::test_p[Tesla-T4-hetero-worker3-gpulab]", plugins) == (
        "test_p [Tesla-T4-hetero-worker3]", "gpulab",
    )  # fmt: skip
    assert summary_key("tests/x.py::test_y[gpulab]", plugins) is None
    # The DRA suites have no subject: their column is the driver, every parameter a scenario's.
    assert summary_key("e2e/test_dra.py::test_sel[memory-80G]", plugins) == (
        "test_sel [memory-80G]",
        "nvidia-dra-driver",
    )
    assert summary_key("e2e/test_dra.py::test_one", plugins) == ("test_one", "nvidia-dra-driver")
    assert summary_key("e2e/test_experiment_run.py::test_dra_taints_x", plugins) == (
        "test_dra_taints_x",
        "nvidia-dra-driver",
    )


def test_a_recording_that_spelled_ecc_dbe_reads_as_ecc_double(tmp_path: Path) -> None:
    rec = sample_recording()
    rec.faults.append(Fault(20, 7.0, "lab-a", 3, "GPU-a3", "ecc-double", 1, -1))
    rec.save(tmp_path / "recording.json")
    text = (tmp_path / "recording.json").read_text()
    (tmp_path / "recording.json").write_text(text.replace('"ecc-double"', '"ecc_dbe"'))
    again = Recording.load(tmp_path / "recording.json")
    assert again == rec
    assert again.faults[-1].label() == "ECC double-bit"


def test_a_report_is_named_by_experiment_and_subject_on_a_dra_lab_by_experiment_alone() -> None:
    """What serves the lab names the report directory: a subject adds its name, NVIDIA's
    DRA driver (one per lab, no subject) nothing."""
    nvidia = Lab("seed", subject="nvidia")
    assert nvidia.serving.report_suffix == f"-{nvidia.subject.name}"
    assert Lab("dra").serving.report_suffix == ""
    assert Lab("dra").serving.recorded.startswith("NVIDIA's DRA driver v")


def mig_recording() -> Recording:
    """The dynmig experiment as a recording: a 4g.40gb claim's device (gpu-0's placement 0)
    made 0.6 s after its pod was created; a second claim for the same profile waits and,
    after the first pod is deleted at 5 s, gets the same placement again, made at 6.2 s;
    the first pod's device is gone at 5.4 s."""
    node = "dra-dynmig-control-plane"
    exp = ex.from_dict({
        "name": "dynmig", "lab": "dra-dynmig", "duration": "8s", "sample_interval": "100ms",
        "timeline": [
            {"at": 0, "do": "create_pod", "name": "a", "mig": "4g.40gb"},
            {"at": 1, "do": "create_pod", "name": "c", "mig": "4g.40gb"},
            {"at": 5, "do": "delete_pod", "name": "a"},
        ],
        "expect": [
            {"check": "mig_devices", "node": node, "equals": 1, "during": ["1s", "5s"]},
            {"check": "mig_devices", "node": node, "gpu": 1, "equals": 0, "during": [0, "end"]},
            {"check": "changes", "node": node, "of": "mig_devices", "equals": 3},
            {"check": "pod", "name": "c", "phase": "Running", "at": "end"},
        ],
    })  # fmt: skip
    dev = "gpu-0-mig-4g40gb-5-0"
    rec = Recording(exp.model_dump(mode="json"), "NVIDIA's DRA driver v0.4.1",
                    "2026-01-01T00:00:00+00:00", 0,
                    {node: {"gpus": 2, "product": "H100", "uuids": ["GPU-a", "GPU-b"],
                            "devices": {"gpu-0": 0, "gpu-1": 1, dev: 0}}},
                    signal="taints")  # fmt: skip
    for i in range(81):
        t = i / 10
        held = 0.6 <= t < 5.4 or t >= 6.2
        a = "Running" if 0.9 <= t < 5.0 else "Pending" if t < 0.9 else "Terminating"
        pods = {"c": ["Running" if t >= 6.5 else "Pending", node if t >= 6.0 else ""]}
        if t < 5.5:
            pods["a"] = [a, node]
        rec.samples.append(Sample(t, {node: [0, 0, "1"]}, pods, {},
                                  {node: {dev: 0} if held else {}}))  # fmt: skip
    rec.pods = [PodInfo("a", 0.01, claimed=[dev], deleted=5.0),
                PodInfo("c", 1.01, node, "Running", claimed=[dev])]  # fmt: skip
    # The journal's times: a's device made and destroyed, the placement made again for c.
    rec.mig_changes = [MigChange(t, node, dev, 0, made)
                       for t, made in ((0.55, True), (5.38, False), (6.15, True))]  # fmt: skip
    return rec


def test_a_claims_mig_device_is_timed_from_its_pod_to_made_and_from_deletion_to_gone() -> None:
    """The same placement held by two claims in turn: the second's device counts as made
    when the journal made it again after its pod was created, not while the first still
    held it; the times are the journal's (the samples around them saw it 50 ms later)."""
    a, c = mig_lives(mig_recording())
    assert (a.pod, a.made, a.running, a.deleted, a.gone) == ("a", 0.55, 0.9, 5.0, 5.38)
    assert (c.pod, c.made, c.running, c.deleted, c.gone) == ("c", 6.15, 6.5, None, None)
    assert a.node == c.node == "dra-dynmig-control-plane"


def test_a_second_claim_created_before_the_first_ones_device_was_made_gets_its_own() -> None:
    """CI under load: the API server created c before the driver made a's device. The
    making a's claim caused is a's; c's is the one after a's device was gone."""
    rec = mig_recording()
    rec.pods[1].created = 0.3
    a, c = mig_lives(rec)
    assert (a.made, a.gone) == (0.55, 5.38)
    assert (c.created, c.made) == (0.3, 6.15)


def test_mig_device_checks_count_the_sampled_state_and_a_wrong_one_fails() -> None:
    assert [o.text for o in evaluate(mig_recording()) if not o.passed] == []
    rec = mig_recording()
    rec.samples[30].mig = {"dra-dynmig-control-plane": {}}  # gone for one sample at 3.0 s
    failed = [(o.text, o.observed) for o in evaluate(rec) if not o.passed]
    assert failed == [
        ("MIG devices on dra-dynmig-control-plane = 1 during [1s, 5s]", "0, 1 (first 0 at 3.00s)"),
        ("MIG devices of dra-dynmig-control-plane changes = 3 times",
         "5 (0 → 1 at 0.60s → 0 at 3.00s → 1 at 3.10s → 0 at 5.40s → 1 at 6.20s); "
         "longest sample gap 0.10s from 7.80s; faults: none"),
    ]  # fmt: skip


def test_a_mig_report_has_a_row_per_claimed_device(tmp_path: Path) -> None:
    outcomes = report.write(mig_recording(), tmp_path)
    assert all(o.passed for o in outcomes)
    md = (tmp_path / "report.md").read_text()
    assert "## MIG devices per claim" in md
    assert ("| a | `gpu-0-mig-4g40gb-5-0` (control-plane) | 0.010 | 0.550 (+540 ms) | "
            "0.900 (+890 ms) | 5.000 | 5.380 (+380 ms) |") in md  # fmt: skip
    assert ("| c | `gpu-0-mig-4g40gb-5-0` (control-plane) | 1.010 | 6.150 (+5.14 s) | "
            "6.500 (+5.49 s) | — | — |") in md  # fmt: skip
    assert Recording.load(tmp_path / "recording.json") == mig_recording()
    # A recording without MIG has no such section.
    report.write(dra_recording(), tmp_path / "dra")
    assert "MIG devices per claim" not in (tmp_path / "dra" / "report.md").read_text()


def test_only_an_experiment_that_names_mig_samples_it() -> None:
    assert ex.load("dynmig").uses_mig
    assert not any(ex.load(p).uses_mig for p in SHIPPED if p.stem != "dynmig")
