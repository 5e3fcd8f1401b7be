"""How e2e/dra_suite.py reads bats' JUnit and retries what failed for no known cause, with
bats and the lab's clean stood in for (the suite itself runs in e2e/test_dra_suite.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from e2e import dra_suite
from e2e.dra_suite import Row

SETUP_FAILURE = """<?xml version="1.0"?>
<testsuites><testsuite name="setup_suite" tests="1" failures="1">
<testcase classname="setup_suite" name="setup_file failed" time="0"><failure type="failure">
(from function `iupgrade_wait' in file tests/bats/helpers.sh, line 89,
 from function `setup_file' in test file tests/bats/test_gpu_dynmig.bats, line 19)
  `iupgrade_wait "${TEST_CHART_REPO}" "${TEST_CHART_VERSION}" _iargs' failed
</failure></testcase></testsuite></testsuites>"""
FILES = ["tests/bats/test_gpu_basic.bats", "tests/bats/test_gpu_dynmig.bats"]


def test_a_failed_setup_file_is_the_row_of_the_file_its_message_names(tmp_path: Path) -> None:
    """bats reports it under `setup_suite`; the row names the file, so a retry finds it."""
    (tmp_path / "report.xml").write_text(SETUP_FAILURE)
    (row,) = dra_suite.rows_of(tmp_path, FILES)
    assert (row.file, row.test, row.result) == ("test_gpu_dynmig.bats", "setup_file failed",
                                                "failed")  # fmt: skip
    assert row.why.startswith("`iupgrade_wait") and not row.explained


MIG_FAILURE = """<?xml version="1.0"?>
<testsuites><testsuite name="test_gpu_mig.bats" tests="1" failures="1">
<testcase classname="test_gpu_mig.bats" name="StaticMIG: allocate (1 cnt)" time="2">
<failure type="failure">(from function `{where}' in file tests/bats/helpers.sh, line 379,
 in test file tests/bats/test_gpu_mig.bats, line 58)
  `{where} "$node"' failed with status 2
</failure></testcase></testsuite></testsuites>"""


@pytest.mark.parametrize(("where", "explained"), [
    ("mig_create_1g0_on_node", True),  # where the evidence says it fails
    ("iupgrade_wait", False),  # the same test failing elsewhere: news, not the known cause
])  # fmt: skip
def test_a_known_failure_is_explained_only_where_the_evidence_says(
    tmp_path: Path, where: str, explained: bool
) -> None:
    (tmp_path / "report.xml").write_text(MIG_FAILURE.format(where=where))
    (row,) = dra_suite.rows_of(tmp_path, ["tests/bats/test_gpu_mig.bats"])
    assert row.result == "failed" and row.explained == explained
    assert (row.why == dra_suite.NO_1G_PROFILE.why) == explained


SKIP = 'if [ "${MOCK_NVML:-}" = "true" ]; then skip "requires IMEX daemon"; fi'


@pytest.mark.parametrize(("text", "all_skip"), [
    (f'@test "a" {{\n  {SKIP}\n  run x\n}}\n@test "b" {{\n  # why\n\n  {SKIP}\n}}\n', True),
    (f'@test "a" {{\n  {SKIP}\n}}\n@test "b" {{\n  kubectl apply -f x\n  {SKIP}\n}}\n', False),
    ("setup_file() {\n  true\n}\n", False),  # no test at all
])  # fmt: skip
def test_a_file_counts_as_all_skipped_only_when_every_test_starts_with_the_skip(
    text: str, all_skip: bool
) -> None:
    assert dra_suite.all_skip(text) == all_skip


def test_a_failed_test_runs_again_alone_and_a_failed_setup_file_runs_its_whole_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[list[str], list[str]]] = []

    def bats(image: str, work: Path, report: Path, lab: object, version: str,
             files: list[str], extra: list[str], console: Console) -> list[Row]:  # fmt: skip
        calls.append((files, extra))
        if files == [FILES[1]]:
            return [Row("test_gpu_dynmig.bats", "DynMIG: 1 pod, 1 MIG", "passed", 3.0)]
        return [Row("test_gpu_basic.bats", "GPUs: 1 pod(s), 1 full GPU", "passed", 2.0)]

    monkeypatch.setattr(dra_suite, "bats", bats)
    monkeypatch.setattr(dra_suite, "clean", lambda lab: None)
    rows = [
        Row("test_gpu_basic.bats", "GPUs: 1 pod(s), 1 full GPU", "failed", 1.0, "empty log"),
        Row("test_gpu_basic.bats", "GPUs: 2 pod(s), 1 full GPU each", "passed", 4.0),
        Row("test_gpu_dynmig.bats", "setup_file failed", "failed", 0.0, "iupgrade_wait"),
    ]
    got = dra_suite.retry_unexplained(rows, "img", Path("w"), Path("o"), object(), "0.4.1",
                                      FILES, Console(quiet=True))  # fmt: skip
    assert calls == [([FILES[0]], ["--filter", "^GPUs:\\ 1\\ pod\\(s\\),\\ 1\\ full\\ GPU$"]),
                     ([FILES[1]], [])]  # fmt: skip
    # Each retried row where its first run's stood: the docs' table keeps the suite's order.
    assert [(r.file, r.test, r.result) for r in got] == [
        ("test_gpu_basic.bats", "GPUs: 1 pod(s), 1 full GPU", "passed"),
        ("test_gpu_basic.bats", "GPUs: 2 pod(s), 1 full GPU each", "passed"),
        ("test_gpu_dynmig.bats", "DynMIG: 1 pod, 1 MIG", "passed"),
    ]
    assert (got[0].why, got[0].retried) == ("", "empty log")
    assert (got[2].why, got[2].retried) == ("", "iupgrade_wait")
    assert dra_suite.run_why(got[0]) == "retried; first: empty log"


def test_a_retry_that_ends_in_a_known_failure_is_that_failure_in_the_docs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI, 2026-12-04: the static-MIG test's first run failed on the suite's own race (a
    ResourceSlice read before the reinstalled driver published one), its second on the
    profile pattern the docs explain. Explained; the docs' row is the known cause, the
    run's report says both."""
    test = "StaticMIG: mutual exclusivity with physical GPU"
    known = dra_suite.EXPLAINED[("test_gpu_mig.bats", test)].why
    monkeypatch.setattr(dra_suite, "bats", lambda *a, **k: [
        Row("test_gpu_mig.bats", test, "failed", 5.0, known)])  # fmt: skip
    monkeypatch.setattr(dra_suite, "clean", lambda lab: None)
    first = Row("test_gpu_mig.bats", test, "failed", 4.0, "`kubectl get resourceslices` failed")
    assert not first.explained
    [got] = dra_suite.retry_unexplained([first], "img", Path("w"), Path("o"), object(),
                                        "0.4.1", ["tests/bats/test_gpu_mig.bats"],
                                        Console(quiet=True))  # fmt: skip
    assert got.explained and got.why == known and got.seconds == 9.0
    assert known in dra_suite.per_test([got]) and "retried" not in dra_suite.per_test([got])
    assert dra_suite.run_why(got) == f"retried; first: {first.why}; then: {known}"
