"""The `gpulab_e2e` pytest plugin on an install without the lab's clients (a node's:
fakenvml and the plugin only): pytest still runs its owner's tests, and the suites'
fixtures load only where the kubernetes client is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN = """
import sys
{block}
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "gpulab_e2e", sys.argv[1]])
print("e2e.fixtures" in sys.modules)
sys.exit(code)
"""


def run(tmp_path: Path, block: str) -> tuple[int, str]:
    test = tmp_path / "test_own.py"
    test.write_text("def test_own() -> None:\n    assert 1 + 1 == 2\n")
    res = subprocess.run([sys.executable, "-c", RUN.format(block=block), str(test)],
                         capture_output=True, text=True, cwd=tmp_path, check=False)  # fmt: skip
    return res.returncode, res.stdout + res.stderr


def test_without_the_kubernetes_client_pytest_runs_and_no_suite_fixture_loads(
    tmp_path: Path,
) -> None:
    # As if the client were not installed: find_spec answers None for it.
    code, out = run(tmp_path, "sys.modules['kubernetes'] = None")
    assert code == 0, out
    assert "1 passed" in out and out.strip().endswith("False")


def test_with_it_the_suites_fixtures_load(tmp_path: Path) -> None:
    code, out = run(tmp_path, "")
    assert code == 0, out
    assert out.strip().endswith("True")
