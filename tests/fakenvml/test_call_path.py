"""The call path makes no system call while nothing was injected, and still sees a fault
at the very next call: strace counts what a C caller (bench/callloop.c) does between the
getppid() markers that separate its phases."""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from pathlib import Path

import pytest

from fakenvml import library
from fakenvml.journal import GEN_FILE
from fakenvml.node import NodeDir
from tests.fakenvml.conftest import subprocess_env

CALLLOOP = Path(__file__).resolve().parents[2] / "bench" / "callloop.c"
NVML_ERROR_GPU_IS_LOST = 15
CALLS = 2000


@pytest.fixture(scope="module")
def callloop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("callloop") / "callloop"
    subprocess.run(["gcc", "-O2", "-o", exe, CALLLOOP, "-ldl"], check=True)
    return exe


def _phases(callloop: Path, state: NodeDir, between: object) -> tuple[str, list[list[str]]]:
    """Runs the phases under strace; `between()` runs while the caller waits. Returns the
    caller's output and the system calls of each phase (loop, wait, first call, loop)."""
    trace = state.path.parent / "strace.txt"
    argv = ["strace", "-f", "-qq", "-o", trace, callloop, library.path(), "8", str(CALLS)]
    proc = subprocess.Popen(
        [*argv, "--phases"],
        env=subprocess_env(state.path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_marker(trace, 2)
        between()  # type: ignore[operator]
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    calls = [re.sub(r"^\d+\s+", "", line).split("(")[0] for line in trace.read_text().splitlines()]
    marks = [i for i, c in enumerate(calls) if c == "getppid"]
    assert len(marks) == 5, calls[-40:]
    return out, [calls[a + 1 : b] for a, b in itertools.pairwise(marks)]


def _wait_for_marker(trace: Path, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if trace.exists() and trace.read_text().count("getppid(") >= count:
            return
        time.sleep(0.02)
    raise AssertionError("the caller never reached its wait")


def test_no_system_call_per_call_and_a_fault_seen_at_the_next(
    callloop: Path, state: NodeDir
) -> None:
    out, (loop, _wait, first, after) = _phases(callloop, state, lambda: state.lose(0))
    assert loop == [], f"{CALLS} calls made system calls: {sorted(set(loop))}"
    assert f"first={NVML_ERROR_GPU_IS_LOST}" in out, out  # the lost GPU, at the next call
    assert "before=0" in out
    assert "fstat" in first or "newfstatat" in first, first  # reading the new record
    assert after == [], f"calls after the fault made system calls: {sorted(set(after))}"


def test_without_journal_gen_the_library_checks_the_journal_per_call(
    callloop: Path, state: NodeDir
) -> None:
    """A state dir from before journal.gen: still correct, one fstat per call."""
    (state.path / GEN_FILE).unlink()
    out, (loop, _wait, _first, _after) = _phases(callloop, state, lambda: state.lose(0))
    assert f"first={NVML_ERROR_GPU_IS_LOST}" in out, out
    assert len(loop) >= CALLS, len(loop)


def test_a_garbage_journal_gen_is_not_trusted(callloop: Path, state: NodeDir) -> None:
    (state.path / GEN_FILE).write_bytes(b"\xff" * 64)
    out, _ = _phases(callloop, state, lambda: state.lose(0))
    assert f"first={NVML_ERROR_GPU_IS_LOST}" in out, out
