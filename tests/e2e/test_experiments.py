"""Experiments without a cluster: every shipped file validates against the schema and its
lab, bad files fail with one line naming the key, and a recorded run renders into a
report whose layers, verdicts and picture are right."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from e2e import experiments as ex
from e2e import report
from e2e.cli import main
from e2e.recording import Fault, LogLine, PodInfo, Recording, Sample, evaluate, traces
from e2e.runner import faulted, parse_log
from fakenvml.journal import ECC, Kind, Record

SHIPPED = sorted(ex.EXPERIMENTS.glob("*.yaml"))
MINIMAL = {
    "name": "mini",
    "lab": "hetero",
    "duration": "10s",
    "timeline": [{"at": "1s", "do": "xid", "node": "hetero-worker", "gpu": 0, "code": 79}],
}


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
        (_with(timeline=[{"at": 0, "do": "create_pod", "name": "p"}]),
         "timeline[0].create_pod: give exactly one of `spec:`"),
        (_with(expect=[{"check": "capacity", "node": "n", "equals": 1, "at": 2, "during": [1, 3]}]),
         "expect[0].capacity: give `at:` or `during:`, not both"),
        (_with(expect=[{"check": "capacity", "node": "n", "equals": 1, "during": [3, 1]}]),
         "expect[0].capacity: during: [3.0, 1.0] ends before it starts"),
        (_with(timeline=[{"at": "-1s", "do": "lost", "node": "n", "gpu": 0}]),
         "timeline[0].lost.at: '-1s': a duration cannot be negative"),
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
        ([{"at": 1, "do": "xid", "node": "hetero-worker3", "gpu": 2, "code": 79}], [],
         "GPU 2 not in inventory of node hetero-worker3 (0-1)"),
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


def test_unknown_experiment_names_the_shipped_ones() -> None:
    with pytest.raises(ex.ExperimentError, match=r"shipped: .*xid-storm"):
        ex.load("no-such-experiment")


def test_times_accept_units_and_plain_seconds() -> None:
    assert [ex.seconds(v) for v in ("1.5s", "250ms", "2m", 3, 0.5)] == [1.5, 0.25, 120, 3, 0.5]
    with pytest.raises(ValueError):
        ex.seconds(-1)


def test_fault_actions_are_spelled_as_in_the_fault_table() -> None:
    tags = {c.model_fields["do"].annotation.__args__[0] for c in ex.FAULTS}
    assert tags == {Kind.XID.spelling, ECC, Kind.LOST.spelling, Kind.RECOVER.spelling}


def test_ecc_takes_double_as_the_cli_and_reads_the_older_double_bit_key() -> None:
    ecc = {"at": 1, "do": "ecc", "node": "hetero-worker", "gpu": 0}
    new = ex.from_dict(_with(timeline=[{**ecc, "double": False}])).timeline[0]
    old = ex.from_dict(_with(timeline=[{**ecc, "double_bit": False}])).timeline[0]
    assert isinstance(new, ex.Ecc) and old == new and not new.double
    assert "double_bit" not in new.model_dump() and new.model_dump()["double"] is False
    assert ex.from_dict(_with(timeline=[ecc])).timeline[0].double  # type: ignore[union-attr]
    assert new.describe() == "single-bit ECC on hetero-worker GPU 0"


# -- plugin log lines


def test_parse_log_reads_both_plugins_lines_with_containerd_timestamps() -> None:
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
    lines = parse_log(text, "n1", t0)
    got = [(round(x.t, 4), x.event, x.device, x.healthy, x.xid) for x in lines]
    assert got == [
        (1.0005, "xid", "GPU-a", None, 79),
        (1.001, "update", "GPU-a", False, None),
        (2.5, "update", "GPU-b::2", False, None),
        (3.0, "registered", "", None, None),
        (5.0, "update", "GPU-a", True, None),
    ]


def test_faulted_gpus_are_those_not_recovered_since() -> None:
    def r(seq: int, kind: Kind, gpu: int, data: int = 0) -> Record:
        return Record(seq, 0, 0, kind, gpu, data)

    records = [
        r(1, Kind.XID, 0, 79), r(2, Kind.RECOVERY_ACTION, 0, 2), r(3, Kind.LOST, 1),
        r(4, Kind.RECOVER, 0), r(5, Kind.RECOVERY_ACTION, 0, 0), r(6, Kind.ECC_DOUBLE, 3),
    ]  # fmt: skip
    assert faulted(records) == [1, 3]


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
    assert changes.observed == "2 (4 → 3 → 4)"


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


def test_a_recording_that_spelled_ecc_dbe_reads_as_ecc_double(tmp_path: Path) -> None:
    rec = sample_recording()
    rec.faults.append(Fault(20, 7.0, "lab-a", 3, "GPU-a3", "ecc-double", 1, -1))
    rec.save(tmp_path / "recording.json")
    text = (tmp_path / "recording.json").read_text()
    (tmp_path / "recording.json").write_text(text.replace('"ecc-double"', '"ecc_dbe"'))
    again = Recording.load(tmp_path / "recording.json")
    assert again == rec
    assert again.faults[-1].label() == "ECC double-bit"
