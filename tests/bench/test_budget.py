"""`python -m bench.budget`: `time` records a tier, `report` holds the tiers to their budgets.

The commands run as separate processes (the real exit status, inherited output, what `make
test` sees); the JUnit reading and the slowest list are also checked in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import budget

REPO = Path(__file__).resolve().parents[2]


def bench_budget(
    tmp_path: Path, *argv: str, python: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess[str]:
    """Runs `python -m bench.budget ARGV` from tmp_path with this checkout's bench/."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPULAB_BUDGET_DIR": str(tmp_path / "budget")}
    return subprocess.run(
        [*python, "-m", "bench.budget", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def record(
    tmp_path: Path,
    tier: str,
    seconds: float,
    exit_code: int = 0,
    junit: Path | None = None,
    started: float = 0.0,
) -> None:
    """Writes TIER.json as `time` does; started=0 accepts any JUnit file's age."""
    data = {
        "tier": tier,
        "seconds": seconds,
        "exit_code": exit_code,
        "junit": str(junit) if junit else None,
        "command": ["true"],
        "started": started,
    }
    (tmp_path / "budget").mkdir(exist_ok=True)
    (tmp_path / "budget" / f"{tier}.json").write_text(json.dumps(data))


def junit(path: Path, *cases: str) -> Path:
    """pytest's xunit1 JUnit XML around <testcase> elements."""
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )
    return path


def case(name: str, seconds: float, outcome: str = "", module: str = "tests.x.test_a") -> str:
    file = module.replace(".", "/") + ".py"
    body = {
        "": "",
        "failed": '<failure message="assert 1 == 2">boom</failure>',
        "error": '<error message="error at setup">oops</error>',
        "skipped": '<skipped type="pytest.skip" message="needs docker">skip</skipped>',
    }[outcome]
    attrs = f'classname="{module}" name="{name}" file="{file}" line="1" time="{seconds}"'
    return f"<testcase {attrs}>{body}</testcase>"


def test_time_records_the_exit_code_and_seconds_and_exits_with_the_code(tmp_path: Path) -> None:
    child = "import sys, time; print('streamed', flush=True); time.sleep(0.3); sys.exit(3)"
    run = bench_budget(tmp_path, "time", "unit", "--junit", "j/unit.xml", "--",
                       sys.executable, "-c", child)  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "streamed" in run.stdout  # the command's output is its own, not captured
    rec = json.loads((tmp_path / "budget" / "unit.json").read_text())
    assert rec["exit_code"] == 3
    assert 0.3 <= rec["seconds"] < 30
    assert rec["junit"] == str(tmp_path / "j" / "unit.xml")
    assert list((tmp_path / "budget").iterdir()) == [tmp_path / "budget" / "unit.json"]


def test_time_dies_of_the_signal_that_killed_the_command_after_recording_it(
    tmp_path: Path,
) -> None:
    # So that bash, running `make test`, stops at Ctrl-C instead of starting the next tier.
    child = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    run = bench_budget(tmp_path, "time", "fuzz", "--", sys.executable, "-c", child)
    assert run.returncode == -signal.SIGTERM
    assert json.loads((tmp_path / "budget" / "fuzz.json").read_text())["exit_code"] == 143


def test_time_records_a_command_that_cannot_start_as_127(tmp_path: Path) -> None:
    run = bench_budget(tmp_path, "time", "lint", "--", "/nonexistent/lint")
    assert run.returncode == 127
    assert "cannot run '/nonexistent/lint'" in run.stderr
    assert json.loads((tmp_path / "budget" / "lint.json").read_text())["exit_code"] == 127


def test_time_refuses_an_unknown_tier_without_running_the_command(tmp_path: Path) -> None:
    run = bench_budget(tmp_path, "time", "smoke", "--", "touch", str(tmp_path / "ran"))
    assert run.returncode == 2
    assert "invalid choice: 'smoke'" in run.stderr
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "budget").exists()


def test_report_counts_junit_and_warns_of_a_tier_over_budget_yet_exits_0(tmp_path: Path) -> None:
    unit = junit(tmp_path / "unit.xml", case("test_ok", 1.0), case("test_ok[h100]", 2.0),
                 case("test_bad", 0.5, "failed"), case("test_skip", 0.0, "skipped"),
                 case("test_setup", 0.1, "error"))  # fmt: skip
    record(tmp_path, "unit", budget.BUDGETS["unit"] + 80, exit_code=1, junit=unit)
    record(tmp_path, "lint", 12.0)
    run = bench_budget(tmp_path, "report")
    assert run.returncode == 0, run.stderr
    assert "over by 1m20s" in run.stdout
    assert "⚠ over budget: unit (+1m20s)" in run.stdout
    assert "tests/x/test_a.py::test_ok[h100]" in run.stdout  # not read as rich markup
    report = json.loads((tmp_path / "budget.json").read_text())
    tiers = {t["tier"]: t for t in report["tiers"]}
    assert tiers["unit"]["tests"] == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}
    assert tiers["unit"]["over_by"] == 80
    assert tiers["unit"]["notes"] == ["failed (exit 1)"]
    assert tiers["lint"]["over_by"] == 0 and tiers["lint"]["tests"] is None
    assert tiers["e2e"]["notes"] == ["not run"]
    assert [t["tier"] for t in report["tiers"]] == list(budget.BUDGETS)
    assert report["totals"]["failed_tiers"] == ["unit"]
    assert report["totals"]["seconds"] == budget.BUDGETS["unit"] + 80 + 12
    assert report["budgets"]["e2e"] == budget.BUDGETS["e2e"] and report["total_budget"] == 1800
    assert report["nproc"] >= 1
    md = (tmp_path / "budget.md").read_text().splitlines()
    assert "| unit | 8:20 | 2/1/1 +1 errors | 7:00 | over by 1m20s | — | failed (exit 1) |" in md
    assert "| lint | 0:12 | — | 1:00 | ✓ | — |  |" in md
    assert any("50:00" in line for line in md)  # the cold goal's footnote


def test_report_warns_when_the_total_is_over_although_every_tier_is_within(
    tmp_path: Path,
) -> None:
    for tier, seconds in budget.BUDGETS.items():
        record(tmp_path, tier, seconds)
    run = bench_budget(tmp_path, "report")
    report = json.loads((tmp_path / "budget.json").read_text())
    assert all(t["over_by"] == 0 for t in report["tiers"])
    over = sum(budget.BUDGETS.values()) - budget.TOTAL_BUDGET
    assert report["totals"]["over_by"] == over > 0
    assert f"⚠ over budget: total (+{budget.span(over)})" in run.stdout


def test_tiers_that_ran_beside_each_other_count_once_in_the_total(tmp_path: Path) -> None:
    """`make test` runs asan and fuzz beside unit: the total is the clock's, each tier keeps
    its own time and says what it ran beside."""
    t0 = 1.8e9
    record(tmp_path, "lint", 10, started=t0 - 20)  # ended 10 s before unit began
    record(tmp_path, "unit", 300, started=t0)
    record(tmp_path, "asan", 100, started=t0 + 1)
    record(tmp_path, "fuzz", 250, started=t0 + 101)  # past unit's end by 51 s
    record(tmp_path, "e2e", 900)  # no start recorded: its own time is added
    bench_budget(tmp_path, "report")
    report = json.loads((tmp_path / "budget.json").read_text())
    assert report["totals"]["seconds"] == 10 + 351 + 900
    notes = {t["tier"]: t["notes"] for t in report["tiers"]}
    assert notes["asan"] == notes["fuzz"] == ["beside unit"]
    assert notes["unit"] == notes["lint"] == []
    assert {t["tier"]: t["seconds"] for t in report["tiers"]}["fuzz"] == 250


def test_time_and_report_need_no_venv(tmp_path: Path) -> None:
    # `make infra`, the first tier, creates the venv; -S: no site-packages, so no rich.
    bare = (sys.executable, "-S")
    assert bench_budget(tmp_path, "time", "infra", "--", "true", python=bare).returncode == 0
    run = bench_budget(tmp_path, "report", python=bare)
    assert run.returncode == 0, run.stderr
    # markdown instead (its cpu cell is whatever the machine did meanwhile)
    lines = run.stdout.splitlines()
    assert any(line.startswith("| infra | 0:00 | — | 1:00 | ✓ | ") for line in lines)


def test_slowest_are_the_ten_slowest_across_tiers_slowest_first(tmp_path: Path) -> None:
    unit = junit(tmp_path / "unit.xml", *(case(f"test_u{i}", i) for i in range(8)))
    cases = [case(f"test_e{i}", 10 + i, module="e2e.test_pods") for i in range(3)]
    cases.append(case("test_fast", 0.01, module="e2e.test_pods"))
    e2e = junit(tmp_path / "e2e.xml", *cases)
    record(tmp_path, "unit", 30, junit=unit)
    record(tmp_path, "e2e", 60, junit=e2e)
    slowest = budget.collect(tmp_path / "budget").slowest
    assert [(t.tier, t.test, t.seconds) for t in slowest[:4]] == [
        ("e2e", "e2e/test_pods.py::test_e2", 12.0),
        ("e2e", "e2e/test_pods.py::test_e1", 11.0),
        ("e2e", "e2e/test_pods.py::test_e0", 10.0),
        ("unit", "tests/x/test_a.py::test_u7", 7.0),
    ]
    assert len(slowest) == budget.SLOWEST
    assert [t.seconds for t in slowest] == sorted((t.seconds for t in slowest), reverse=True)
    assert slowest[-1].test == "tests/x/test_a.py::test_u1"


def test_node_ids_keep_the_class_and_survive_xunit2(tmp_path: Path) -> None:
    path = tmp_path / "j.xml"
    path.write_text(
        "<testsuite>"
        '<testcase classname="tests.fakenvml.test_api.TestInit" name="test_twice[h100]" '
        'file="tests/fakenvml/test_api.py" time="1.5"/>'
        '<testcase classname="tests.fakenvml.test_api" name="test_xunit2" time="0.2"/>'
        "</testsuite>"
    )
    counts, times = budget.read_junit(path, "unit", not_before=None)
    assert counts == budget.Counts(passed=2)
    assert [t.test for t in times] == [
        "tests/fakenvml/test_api.py::TestInit::test_twice[h100]",
        "tests.fakenvml.test_api::test_xunit2",
    ]


@pytest.mark.parametrize(
    ("setup", "note"),
    [
        (lambda p: (p / "budget" / "unit.json").write_text("{not json"), "record unreadable: "),
        (
            lambda p: (p / "budget" / "unit.json").write_text('{"seconds": "1"}'),
            "record unreadable: ",
        ),
        (lambda p: record(p, "unit", 5, junit=p / "absent.xml"), "JUnit missing: "),
        (
            lambda p: record(p, "unit", 5, junit=junit(p / "u.xml", "<testcase")),
            "JUnit unreadable: ",
        ),
        (
            lambda p: record(p, "unit", 5, junit=junit(p / "u.xml"), started=2e9),
            "JUnit older than this run",
        ),
    ],
    ids=["malformed-record", "record-wrong-type", "junit-missing", "junit-malformed", "stale"],
)
def test_bad_input_is_one_line_in_the_table_never_a_traceback(
    tmp_path: Path, setup: Callable[[Path], object], note: str
) -> None:
    (tmp_path / "budget").mkdir()
    setup(tmp_path)
    record(tmp_path, "lint", 3.0)
    run = bench_budget(tmp_path, "report")
    assert run.returncode == 0
    assert "Traceback" not in run.stdout + run.stderr
    assert run.stderr == ""
    unit = json.loads((tmp_path / "budget.json").read_text())["tiers"][2]
    assert unit["tier"] == "unit"
    assert len(unit["notes"]) == 1 and unit["notes"][0].startswith(note), unit["notes"]
    assert "\n" not in unit["notes"][0]
    assert unit["tests"] is None
    md = (tmp_path / "budget.md").read_text()
    assert "| unit |" in md and note in md
    assert "| lint | 0:03 |" in md  # the other tiers are still reported


def test_reset_forgets_the_recorded_tiers_and_nothing_else(tmp_path: Path) -> None:
    record(tmp_path, "unit", 5)
    record(tmp_path, "lint", 5)
    (tmp_path / "budget" / "notes.txt").write_text("mine")
    assert bench_budget(tmp_path, "report", "--reset").returncode == 0
    assert json.loads((tmp_path / "budget.json").read_text())["totals"]["seconds"] == 10
    assert sorted(p.name for p in (tmp_path / "budget").iterdir()) == ["notes.txt"]
    record(tmp_path, "asan", 5)
    assert bench_budget(tmp_path, "reset").returncode == 0
    assert sorted(p.name for p in (tmp_path / "budget").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    ("seconds", "clock", "over"),
    [
        (0, "0:00", 0),
        (59.6, "1:00", 0),
        (60.4, "1:00", 0),
        (140, "2:20", 80),
        (4500, "75:00", 4440),
    ],
)
def test_times_print_as_minutes_and_seconds(seconds: float, clock: str, over: int) -> None:
    assert budget.clock(seconds) == clock
    assert budget.over_by(seconds, 60) == over
    assert budget.span(80) == "1m20s" and budget.span(45) == "45s" and budget.span(120) == "2m00s"


STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def test_cpu_share_is_busy_and_steal_between_two_readings_of_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(user=100, system=50, idle=800, iowait=40, steal=10))
    a = budget.cpu_times(stat)
    stat.write_text(STAT.format(user=160, system=70, idle=880, iowait=60, steal=30))
    b = budget.cpu_times(stat)
    # 200 jiffies passed: 80 ran (user+system), 20 the host stole, iowait counts as idle.
    assert budget.share(a, b) == (0.4, 0.1)
    assert budget.share(b, a) is None  # no time between them
    stat.write_text("cpu  1 2 three\n")
    assert budget.cpu_times(stat) is None
    assert budget.cpu_times(tmp_path / "absent") is None


def test_time_records_the_machines_cpu_and_report_shows_it(tmp_path: Path) -> None:
    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.5: pass"
    assert bench_budget(tmp_path, "time", "unit", "--", sys.executable, "-c", busy).returncode == 0
    cpu = json.loads((tmp_path / "budget" / "unit.json").read_text())["cpu"]
    # One core of nproc spun for the whole run (others may have run too).
    assert 0.9 / budget.nproc() <= cpu["busy"] <= 1 and 0 <= cpu["steal"] <= 1, cpu
    assert cpu["every_s"] == budget.CPU_SAMPLE_S
    out = bench_budget(tmp_path, "report")
    report = json.loads((tmp_path / "budget.json").read_text())
    tiers = {t["tier"]: t for t in report["tiers"]}
    assert tiers["unit"]["cpu"] == {"busy": cpu["busy"], "steal": cpu["steal"]}
    assert tiers["lint"]["cpu"] is None  # not run
    assert f"{cpu['busy']:.0%}" in (tmp_path / "budget.md").read_text(), out.stdout


def test_a_record_without_a_readable_cpu_has_an_empty_cpu_cell(tmp_path: Path) -> None:
    record(tmp_path, "unit", 10)  # an older record: no "cpu"
    path = tmp_path / "budget" / "lint.json"
    record(tmp_path, "lint", 5)
    path.write_text(json.dumps({**json.loads(path.read_text()), "cpu": {"busy": "a lot"}}))
    assert bench_budget(tmp_path, "report").returncode == 0
    tiers = {t["tier"]: t for t in json.loads((tmp_path / "budget.json").read_text())["tiers"]}
    assert tiers["unit"]["cpu"] is None and tiers["lint"]["cpu"] is None
