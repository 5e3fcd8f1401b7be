"""The summary table: each scenario x subject cell with what was expected and what was seen."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from e2e.verdict import Cell, first_line, table


def test_cells_collect_expected_and_seen_and_a_failure_adds_its_assertion() -> None:
    props = [("expected", "9/10"), ("seq 4: injected (s)", 1.2), ("seen", "10/10 after 60 s")]
    cell = Cell.of(False, 61.0, props, "AssertionError: waited 60s for seed-worker 9")
    assert (cell.outcome, cell.expected) == ("FAIL", ["9/10"])
    assert cell.seen == ["10/10 after 60 s", "waited 60s for seed-worker 9"]
    assert Cell.of(True, 1.0, props, "ignored when passed").seen == ["10/10 after 60 s"]


def test_first_line_drops_pytest_prefix_and_exception_class() -> None:
    assert first_line("\nE   AssertionError: 3 != 8\nE   more") == "3 != 8"
    assert first_line("StepError: waited 60s for x; last saw: y") == "waited 60s for x; last saw: y"
    assert first_line("assert 3 == 8") == "assert 3 == 8"
    assert first_line("") == ""


def test_table_has_a_result_row_and_expected_seen_rows_wrapped_per_scenario() -> None:
    rows = {
        "test_gpu_lost": {
            "gpulab": Cell("PASS", 3.04, ["9/10"], ["9/10 in 1.3s"], "v1.37.0"),
            "nvidia": Cell("FAIL", 60.0, ["0/10"], ["waited 60s for seed-worker " + "x" * 20]),
        },
        "test_capacity": {"gpulab": Cell("PASS", 0.2)},
    }
    rows["test_gpu_lost"]["nvidia"].kubernetes = "v1.37.0"
    lines = table(rows, ["gpulab", "nvidia"], width=82)
    assert lines[0].split() == ["scenario", "kubernetes", "gpulab", "nvidia"]
    assert lines[1].split() == ["gpu_lost", "v1.37.0", "PASS", "3.0s", "FAIL", "60.0s"]
    assert lines[2].split() == ["expected", "9/10", "0/10"]
    assert lines[3].split() == ["seen", "9/10", "in", "1.3s", "waited", "60s", "for", "seed-worker"]
    # Long text wraps inside its column (nothing cut), under the subject it belongs to.
    assert lines[4].split() == ["x" * 20]
    assert lines[4].index("x") == lines[3].index("waited")
    # No expected/seen rows for a scenario that recorded neither; a missing cell is "-".
    # A scenario that ran on no lab has no version.
    assert lines[5].split() == ["capacity", "-", "PASS", "0.2s", "-"]
    assert len(lines) == 6 and max(len(line) for line in lines) <= 82


def test_a_pytest_run_prints_expected_and_seen_per_subject(tmp_path: Path) -> None:
    """Through the gpulab_e2e plugin for real: a suite parametrized over two shipped
    subjects, one cell passing and one failing on its assertion."""
    suite = tmp_path / "e2e" / "test_demo.py"
    suite.parent.mkdir()
    suite.write_text(
        textwrap.dedent("""
        def test_lost(subject, verdict):
            verdict.expect(f"lost_gpu {subject.expects.lost_gpu}")
            verdict.saw("that-device")
            assert subject.expects.lost_gpu == "that-device", "every device went"
    """)
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "e2e",
         "--subject", "gpulab,nvidia"],  # --subject: the spelling the issue asked for
        cwd=tmp_path, capture_output=True, text=True,
    ).stdout  # fmt: skip
    section = out[out.index("scenario x subject") :].splitlines()
    head = section[1].split()  # `nvidia` is the newest pinned release: nvidia-v0.19.3
    assert head[:3] == ["scenario", "kubernetes", "gpulab"] and head[3].startswith("nvidia-v")
    row = section[2].split()
    assert row[:2] == ["lost", "-"] and row[3::2] == ["0.0s", "0.0s"]
    assert row[2::2][:2] == ["PASS", "FAIL"]
    assert section[3].split() == ["expected", "lost_gpu", "that-device", "lost_gpu", "every-device"]
    assert "every device went" in section[4] and section[4].split()[1] == "that-device"
