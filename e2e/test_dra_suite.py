"""NVIDIA's DRA driver's own test suite on gpulab (e2e/dra_suite.py): every file of its
`tests-mock-nvml` target (GPU and compute-domain files) and its two MIG files (which the
target leaves out for MIG hardware), run unchanged from the driver's module against the
stock lab's fake GPUs. Every test the suite runs here passes, or the suite itself skips it
(its reason in the table), or fails with its cause written (dra_suite.EXPLAINED); any other
failure fails its file's test here with the suite's message. The table is printed and
written to build/dra-suite/ (report.md, report.json, bats.log)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from rich.console import Console

from clusters.labs.lab import Lab
from e2e import dra_suite
from e2e.dra_suite import Row
from e2e.fixtures import lab_job
from fakenvml import docblock

# The target's files gpulab runs, in its order, then the module's MIG files; the first test
# fails when the driver's Makefile says otherwise (a new file must get its row here or in
# dra_suite.NOT_RUN, never be dropped).
FILES = (
    "tests/bats/test_gpu_basic.bats",
    "tests/bats/test_gpu_cuda_workloads.bats",
    "tests/bats/test_gpu_sharing.bats",
    "tests/bats/test_gpu_robustness.bats",
    "tests/bats/test_gpu_extres.bats",
    "tests/bats/test_gpu_stress.bats",
    "tests/bats/test_cd_leader_election.bats",
    "tests/bats/test_gpu_mig.bats",  # beyond the target: MIG the fake GPUs have
    "tests/bats/test_gpu_dynmig.bats",
)
OUT = Path("build/dra-suite")
# The whole suite runs beside other labs' suites (dra_suite_rows, a lab job) and the first
# test's setup waits for what is left of it, which pytest-timeout bounds as one test: the
# project's 300 s default is a single test's. A deadline per file instead: on the 2-core
# machine of 2026-12-02 (builds and tiers ~1.9x slower than the one before) eight files
# took 300 s and the cold CI run killed the ninth; 120 s a file keeps a hung file bounded
# without ending a suite that is only slow.
pytestmark = pytest.mark.timeout(120 * len(FILES))


@lab_job(dra_suite.LAB, first_phase=True)
def dra_suite_rows(lab: Lab) -> list[Row]:
    """The whole suite, run by the lab pool as soon as its lab is up, beside other labs'
    suites (e2e/fixtures.py lab_job)."""
    console = Console(stderr=True, soft_wrap=True)
    rows = dra_suite.run(lab, OUT, console, files=list(FILES))
    console.print(dra_suite.table(rows))
    return rows


def test_the_suites_files_are_the_ones_gpulab_runs() -> None:
    files = dra_suite.candidates(dra_suite.module_dir())
    assert tuple(dra_suite.runnable(files)) == FILES
    assert {Path(f).name for f in files} - {Path(f).name for f in FILES} == set(dra_suite.NOT_RUN)
    # A file is left out for skipping every test only while the pinned module says so.
    src = dra_suite.module_dir()
    for f in files:
        if dra_suite.NOT_RUN.get(Path(f).name) == dra_suite.ALL_SKIP:
            assert dra_suite.all_skip((src / f).read_text()), f
    assert not any(dra_suite.all_skip((src / f).read_text()) for f in FILES)


@pytest.mark.parametrize("file", FILES, ids=[Path(f).stem for f in FILES])
def test_the_drivers_own_suite_passes_on_fake_gpus(dra_suite_rows: list[Row], file: str) -> None:
    rows = [r for r in dra_suite_rows if r.file == Path(file).name]
    assert rows, f"{file}: the suite reported no test of it (build/dra-suite/bats.log)"
    failed = [f"{r.test}: {r.why}" for r in rows if not r.explained]
    assert not failed, "\n".join(failed)
    # What ran is what the suite says it skips on a mock NVML, and nothing more.
    assert all(r.why for r in rows if r.result == "skipped")
    # A retried test is said where CI's output keeps it (build/dra-suite goes with the CI
    # machine): its first cause is the next thing to mend.
    for r in rows:
        if r.retried:
            warnings.warn(f"{Path(file).stem}: {r.test!r} {r.result} on its retry; first "
                          f"run: {r.retried}", stacklevel=1)  # fmt: skip


@pytest.mark.parametrize("doc", list(dra_suite.TABLES))
def test_the_readme_and_the_docs_show_this_run(dra_suite_rows: list[Row], doc: str) -> None:
    """Their tables are this run's (`python -m e2e.dra_suite build/dra-suite/report.json`
    writes them)."""
    text = (Path(__file__).resolve().parent.parent / doc).read_text()
    assert docblock.between(text, dra_suite.BLOCK) == dra_suite.TABLES[doc](dra_suite_rows)
