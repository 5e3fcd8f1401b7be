"""The terminal summary: a scenario x subject grid that fits the terminal, and what each
failed cell expected, saw and failed on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from pytest import CollectReport, TestReport

from clusters.labs.dra import DraDriver
from e2e.fixtures import summary_rows
from e2e.verdict import Cell, failures, first_line, grid, summary

REPO = Path(__file__).resolve().parents[2]
NINE = ["gpulab", "nvidia-v0.19.3", "nvidia-v0.17.4", "gpulab-timeslicing",
        "nvidia-timeslicing", "nvidia-cdi", "nvidia-helm", "gpulab-mig", "nvidia-mig"]  # fmt: skip
LONG = "test_a_layout_changed_at_run_time_changes_capacity_after_a_plugin_restart"


def rows() -> dict[str, dict[str, Cell]]:
    props = [("expected", "0/10"), ("seen", "10/10 after 60 s")]
    lost = Cell.of(False, 61.0, props, "AssertionError: waited 60s for seed-worker 9")
    lost.kubernetes = "v1.37.0"
    return {
        "test_gpu_lost": {
            "gpulab": Cell("PASS", 3.04, ["9/10"], ["9/10 in 1.3s"], "v1.37.0"),
            "nvidia": lost,
        },
        "test_capacity": {"gpulab": Cell("PASS", 0.2)},
    }


def test_cells_collect_expected_and_seen_and_keep_a_failure_apart() -> None:
    props = [("expected", "9/10"), ("seq 4: injected (s)", 1.2), ("seen", "10/10 after 60 s")]
    trace = "tests/x.py:3: in test\nE   AssertionError: waited 60s"
    cell = Cell.of(False, 61.0, props, "AssertionError: waited 60s for seed-worker 9", trace=trace)
    assert (cell.outcome, cell.expected, cell.seen) == ("FAIL", ["9/10"], ["10/10 after 60 s"])
    assert cell.failure == "waited 60s for seed-worker 9"
    assert cell.trace.startswith("tests/x.py:3") and cell.short == "FAIL"
    # Without a crash message the trace's first line stands for it.
    assert Cell.of(False, 1.0, [], trace="E   AssertionError: 3 != 8").failure == "3 != 8"
    passed = Cell.of(True, 1.63, props, "ignored when passed")
    assert (passed.failure, passed.trace, passed.short) == ("", "", "PASS 1.6s")


def test_first_line_drops_pytest_prefix_and_exception_class() -> None:
    assert first_line("\nE   AssertionError: 3 != 8\nE   more") == "3 != 8"
    assert first_line("StepError: waited 60s for x; last saw: y") == "waited 60s for x; last saw: y"
    assert first_line("assert 3 == 8") == "assert 3 == 8"
    assert first_line("") == ""


def test_grid_names_the_subjects_in_its_header_when_they_fit() -> None:
    lines = grid(rows(), ["gpulab", "nvidia"], width=80)
    assert lines[0] == "kubernetes v1.37.0"  # one version: said once, not a column
    assert lines[1].split() == ["scenario", "gpulab", "nvidia"]
    assert lines[2].split() == ["gpu_lost", "PASS", "3.0s", "FAIL"]
    assert lines[3].split() == ["capacity", "PASS", "0.2s", "-"]  # `-`: not run for nvidia
    assert len(lines) == 4
    # Columns line up under their headers.
    assert lines[2].index("FAIL") == lines[1].index("nvidia")


def test_a_narrow_terminal_numbers_the_subjects_in_a_legend_and_wraps_scenario_names() -> None:
    cells = {
        LONG: {s: Cell("PASS", 1.6) for s in NINE[:4]},
        "test_gpu_lost": rows()["test_gpu_lost"],
    }
    lines = grid(cells, NINE[:4], width=80)
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "kubernetes v1.37.0"
    assert lines[1] == "[1] gpulab  [2] nvidia-v0.19.3  [3] nvidia-v0.17.4  [4] gpulab-timeslicing"
    assert lines[2].split() == ["scenario", "[1]", "[2]", "[3]", "[4]"]
    assert lines[3].split()[1:] == ["PASS", "1.6s"] * 4
    # The name wraps after underscores, continuations indented; the pieces give it back.
    rest = lines[4:-1]
    assert rest and all(line.startswith("  ") for line in rest)
    assert "".join([lines[3].split()[0], *(line.strip() for line in rest)]) == LONG[5:]
    assert lines[-1].split() == ["gpu_lost", "PASS", "3.0s", "-", "-", "-"]  # nvidia isn't [1-4]


def test_nine_subjects_use_the_legend_where_their_names_would_not_fit() -> None:
    cells = {"test_capacity": {s: Cell("PASS", 1.6) for s in NINE}}
    wide = grid(cells, NINE, width=200)
    assert wide[0].split() == ["scenario", *NINE]
    narrow = grid(cells, NINE, width=120)
    assert narrow[0].startswith("[1] gpulab  [2] nvidia-v0.19.3") and "[9] nvidia-mig" in narrow[1]
    assert narrow[2].split() == ["scenario", *(f"[{i}]" for i in range(1, 10))]
    assert max(len(line) for line in narrow) <= 120


def test_several_kubernetes_versions_get_a_column() -> None:
    cells = rows()
    cells["test_capacity"]["gpulab"].kubernetes = "v1.35.0"
    lines = grid(cells, ["gpulab", "nvidia"], width=100)
    assert lines[0].split() == ["scenario", "kubernetes", "gpulab", "nvidia"]
    assert lines[1].split()[:2] == ["gpu_lost", "v1.37.0"]
    assert lines[2].split()[:2] == ["capacity", "v1.35.0"]


def test_only_failed_cells_get_details() -> None:
    lines = failures(rows(), ["gpulab", "nvidia"], width=80)
    assert lines == [
        "FAIL gpu_lost on nvidia (61.0s, kubernetes v1.37.0)",
        "    expected  0/10",
        "    seen      10/10 after 60 s",
        "    failure   waited 60s for seed-worker 9",
    ]
    text = "\n".join(summary(rows(), ["gpulab", "nvidia"], width=80))
    assert "9/10 in 1.3s" not in text  # a passed cell's expected/seen stay out
    assert summary({"test_capacity": rows()["test_capacity"]}, ["gpulab"])[-1].startswith(
        "capacity"
    )


def report(nodeid: str, outcome: str, when: str = "call", longrepr: str | None = None,
           props: list[tuple[str, object]] | None = None) -> TestReport:  # fmt: skip
    return TestReport(nodeid, ("x.py", 1, "x"), {}, outcome, longrepr, when,  # type: ignore[arg-type]
                      duration=2.5, user_properties=props or [])  # fmt: skip


TRACE = "E   AssertionError: 8 != 10\nmore"


def test_rows_come_from_the_calls_and_the_setups_that_errored() -> None:
    seed = "e2e/test_seed.py::test_"
    props: list[tuple[str, object]] = [("expected", "10/10"), ("kubernetes", "v1.37.0")]
    stats = {
        "passed": [report(f"{seed}capacity[gpulab]", "passed", props=props)],
        "failed": [report(f"{seed}capacity[nvidia]", "failed", longrepr=TRACE)],
        "error": [report(f"{seed}lost[nvidia]", "failed", "setup", "E   StepError: no lab")],
        "skipped": [report(f"{seed}lost[gpulab]", "skipped")],
        "": [report(f"{seed}capacity[gpulab]", "passed", "setup")],  # a setup that passed
    }
    got = summary_rows(stats, ["gpulab", "nvidia"])
    assert list(got) == ["test_capacity", "test_lost"]
    ok, bad = got["test_capacity"]["gpulab"], got["test_capacity"]["nvidia"]
    assert (ok.short, ok.expected, ok.kubernetes) == ("PASS 2.5s", ["10/10"], "v1.37.0")
    assert (bad.failure, bad.nodeid) == ("8 != 10", "e2e/test_seed.py::test_capacity[nvidia]")
    assert bad.trace == TRACE
    assert list(got["test_lost"]) == ["nvidia"] and got["test_lost"]["nvidia"].failure == "no lab"
    dra = summary_rows({"passed": [report("e2e/test_dra.py::test_slices[dra]", "passed")]}, [])
    assert list(dra["test_slices [dra]"]) == [DraDriver.name]
    # A DRA module that did not import is a failed cell, not a crash of the summary.
    broken = CollectReport("e2e/test_dra.py", "failed", "E   ImportError: no kubernetes", [])
    cell = summary_rows({"error": [broken]}, [])["e2e/test_dra.py"][DraDriver.name]
    assert (cell.short, cell.failure) == ("FAIL", "no kubernetes")


def test_a_pytest_run_prints_the_grid_the_failures_and_the_html_report(tmp_path: Path) -> None:
    """Through the gpulab_e2e plugin for real: a suite parametrized over two shipped
    subjects, one cell passing and one failing on its assertion."""
    suite = tmp_path / "e2e" / "test_demo.py"
    suite.parent.mkdir()
    suite.write_text(
        textwrap.dedent("""
        def test_lost(subject, verdict):
            verdict.expect(f"lost_gpu {subject.expects.lost_gpu}")
            verdict.saw("that-device")
            assert subject.expects.lost_gpu == "that-device", "every device went <&>"
    """)
    )
    # This checkout's e2e package, not whichever one the virtualenv installed.
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "e2e",
         "--subject", "gpulab,nvidia",  # --subject: the spelling the issue asked for
         "--junitxml", "build/junit.xml"],
        cwd=tmp_path, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    section = out[out.index("scenario x subject") :].splitlines()
    head = section[1].split()  # `nvidia` is the newest pinned release: nvidia-v0.19.3
    assert head[:2] == ["scenario", "gpulab"] and head[2].startswith("nvidia-v")
    assert section[2].split() == ["lost", "PASS", "0.0s", "FAIL"]
    assert section[4].startswith(f"FAIL lost on {head[2]} (")
    assert section[5].split() == ["expected", "lost_gpu", "every-device"]
    assert section[6].split() == ["seen", "that-device"]
    assert section[7].split()[:2] == ["failure", "every"] and "<&>" in section[7]
    assert f"gpulab e2e report: {Path('build/junit.html')}" in out
    html = (tmp_path / "build" / "junit.html").read_text()
    assert "every device went &lt;&amp;&gt;" in html
    assert (tmp_path / "build" / "junit.xml").read_text().count('name="expected"') == 2
