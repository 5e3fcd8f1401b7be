"""What ships works from a wheel: built from a copy of the sources, installed into a fresh
venv, run from a directory outside the checkout with a clean environment.

The venv borrows the dependencies of the environment running the tests (a .pth line, so
none is downloaded), never gpulab itself: a path named in a .pth file is not a site
directory, so the editable install's finder there is never run, and the first test proves
every gpulab package imports from the wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusters.labs import spec
from tests.e2e.test_experiments import sample_recording

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fakenvml", "plugin", "clusters", "e2e", "standin", "gpulab")
# What a GPU node runs (the base requirements) and what only a lab runner needs (`lab`).
NODE = {"nvidia-ml-py", "PyYAML", "pydantic", "rich", "grpcio", "protobuf", "prometheus-client",
        "inotify_simple"}  # fmt: skip
LAB = {"kubernetes", "docker", "testcontainers", "matplotlib", "pytest", "pytest-timeout"}
# Not the product: never in the wheel. The generated gRPC code is left out of the copy
# so the wheel must generate it.
NOT_COPIED = (".git", ".venv", "build", "out", "__pycache__", "*.egg-info", ".*_cache",
              "api_pb2*")  # fmt: skip


@dataclass
class Installed:
    venv: Path
    site: Path
    wheel: Path
    cwd: Path  # outside the checkout
    env: dict[str, str]

    @property
    def dist_info(self) -> Path:
        (d,) = self.site.glob("gpulab-*.dist-info")
        return d

    def run(self, *argv: str, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        exe = argv[0] if "/" in argv[0] else str(self.venv / "bin" / argv[0])
        return subprocess.run([exe, *argv[1:]], cwd=self.cwd, env={**self.env, **(env or {})},
                              text=True, capture_output=True, timeout=timeout,
                              check=False)  # fmt: skip


def _site_files(site: Path) -> set[str]:
    return {str(p.relative_to(site)) for p in site.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*NOT_COPIED))
    py = sys.executable
    # No build isolation: setuptools and grpcio-tools (dev extra) are already here.
    subprocess.run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(tmp / "dist"), str(src)], check=True)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("gpulab-*.whl")
    venv = tmp / "venv"
    subprocess.run([py, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([py, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True)  # fmt: skip
    site = Path(subprocess.check_output(
        [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())  # fmt: skip
    deps = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site / "_gpulab_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    home, cwd = tmp / "home", tmp / "work"
    home.mkdir()
    cwd.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "GPULAB_CACHE": str(tmp / "cache"),  # as root the default would be /var/cache/gpulab
        "LANG": "C.UTF-8",
    }  # no PYTHONPATH, FAKENVML_*: nothing may lead back to the checkout
    yield Installed(venv, site, wheel, cwd, env)


def test_every_package_imports_from_the_wheel_and_only_the_product_ships(
    installed: Installed,
) -> None:
    code = "import sys, " + ", ".join(PACKAGES) + "; " + "; ".join(
        f"print({p}.__file__)" for p in PACKAGES
    ) + "; print(*sys.path, sep='\\n', file=sys.stderr)"  # fmt: skip
    res = installed.run("python", "-c", code)
    assert res.returncode == 0, res.stderr
    for pkg, file in zip(PACKAGES, res.stdout.split(), strict=True):
        assert Path(file) == installed.site / pkg / "__init__.py"
    assert str(REPO) not in res.stderr.split("\n")
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert {n.split("/")[0] for n in names} == {*PACKAGES, installed.dist_info.name}
    for shipped in ("clusters/infra/scripts/kind.sh", "clusters/infra/images/build.sh",
                    "clusters/infra/nodeimage/files/usr/local/bin/entrypoint",
                    "plugin/api/v1beta1/api_pb2_grpc.py", "fakenvml/src/core.c",
                    "e2e/experiments/xid-storm.yaml", "clusters/versions.env",
                    "standin/pytest_plugin.py", "gpulab/cli.py"):  # fmt: skip
        assert shipped in names


def test_the_wheel_says_what_a_node_needs_and_what_a_lab_runner_needs(
    installed: Installed,
) -> None:
    requires = [line.removeprefix("Requires-Dist: ") for line in
                (installed.dist_info / "METADATA").read_text().splitlines()
                if line.startswith("Requires-Dist: ")]  # fmt: skip
    name = lambda r: re.split(r"[=<>!~;\[ ]", r)[0]  # noqa: E731
    assert {name(r) for r in requires if "extra ==" not in r} == NODE
    assert {name(r) for r in requires if 'extra == "lab"' in r} == LAB
    scripts = (installed.dist_info / "entry_points.txt").read_text()
    assert "gpulab = gpulab.cli:main" in scripts and "gpulab-kubelet-standin" not in scripts


def test_experiments_tool_validates_a_shipped_experiment_by_name(installed: Installed) -> None:
    res = installed.run("gpulab", "experiment", "validate", "xid-storm")
    assert res.returncode == 0, res.stderr
    assert "✓ xid-storm: xid-storm, " in res.stderr and "on lab hetero" in res.stderr
    res = installed.run("gpulab", "experiment", "validate", "no-such-experiment")
    assert res.returncode == 2
    assert "no experiment 'no-such-experiment' (shipped: " in res.stderr
    res = installed.run("gpulab", "experiment", "run", "--help")
    assert res.returncode == 0 and "--subject" in res.stdout


def test_report_renders_markdown_and_png_from_a_recording(installed: Installed) -> None:
    out = installed.cwd / "report"
    out.mkdir()
    sample_recording().save(out / "recording.json")
    res = installed.run("gpulab", "experiment", "report", "report")
    assert res.returncode == 0, res.stderr
    assert "PASS" in res.stderr
    assert (out / "report.md").read_text().startswith("# ")
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fakenvml_builds_its_library_into_the_cache_and_serves_smi(installed: Installed) -> None:
    state = ["--state-dir", str(installed.cwd / "node")]
    res = installed.run("fakenvml", "smi", "-L", *state)
    assert res.returncode == 2  # no state yet: one line
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("fakenvml: error:")
    res = installed.run("fakenvml", "init", "dgx-h100", *state)
    assert res.returncode == 0, res.stderr
    assert "8 GPU(s) (NVIDIA H100 80GB HBM3)" in res.stdout
    res = installed.run("fakenvml", "smi", "-L", *state)
    assert res.returncode == 2 and "run `fakenvml build`" in res.stderr  # not built yet
    res = installed.run("fakenvml", "build")
    assert res.returncode == 0, res.stderr
    cache = Path(installed.env["GPULAB_CACHE"]) / "fakenvml"
    (lib,) = cache.glob("*/release/libnvidia-ml.so.1")
    assert str(lib) in res.stdout
    res = installed.run("fakenvml", "smi", "-L", *state)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 8 and lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")


def test_plugin_entry_points_start_and_find_the_generated_api(installed: Installed) -> None:
    for exe in (["gpulab-plugin"], ["gpulab", "standin"]):
        res = installed.run(*exe, "--help")
        assert res.returncode == 0 and f"usage: {' '.join(exe)}" in res.stdout, res.stderr
    res = installed.run("python", "-c", "from plugin.api.v1beta1 import load; print(load()[1])")
    assert res.returncode == 0 and str(installed.site / "plugin/api") in res.stdout, res.stderr


def test_infra_lists_its_shipped_scripts(installed: Installed) -> None:
    res = installed.run("gpulab", "infra", "--list")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    for group, script in (("engine", "scripts/docker.sh"), ("kind", "scripts/kind.sh"),
                          ("helm", "scripts/helm.sh"),
                          ("nvidia-plugins", "scripts/nvidia-plugin.sh"),
                          ("node-image", "nodeimage/build.sh"),
                          ("lab-images", "images/build.sh"),
                          ("kueue", "images/build.sh")):  # fmt: skip
        assert f"{group:<15} {installed.site / 'clusters/infra' / script}" in lines
    assert lines[-1].startswith(f"cache: {installed.env['GPULAB_CACHE']}")
    res = installed.run("gpulab", "infra", "--help")
    assert res.returncode == 0 and "node-image" in res.stdout and "export DIR" in res.stdout
    res = installed.run("gpulab", "infra", "--list", "no-such-group")
    assert res.returncode == 2 and "unknown group(s) no-such-group" in res.stderr


def test_the_e2e_suites_load_as_a_pytest_plugin(installed: Installed) -> None:
    res = installed.run("gpulab", "test", "--collect-only", "-q")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    assert "\ntest_seed.py::" in res.stdout and "\ntest_faults.py::" in res.stdout
    assert re.search(r"^\d+/\d+ tests collected", res.stdout, re.M), res.stdout[-500:]


def test_the_gpulab_image_is_made_of_the_installed_files(installed: Installed) -> None:
    code = ("import json; from clusters import built; from clusters.infra import infra; "
            "print(json.dumps({'key': built.tree_key(), **infra.image_env('k')}))")  # fmt: skip
    res = installed.run("python", "-c", code)
    assert res.returncode == 0, res.stderr
    env = json.loads(res.stdout)
    assert re.fullmatch(r"[0-9a-f]{16}", env["key"])
    assert env["GPULAB_SITE"] == str(installed.site) and "GPULAB_SOURCE" not in env
    assert env["GPULAB_NODE_PACKAGES"].split() == ["fakenvml", "plugin"]
    reqs = env["GPULAB_NODE_REQS"].split("\n")
    assert "pydantic==2.14.3" in reqs
    assert {r.split("=")[0] for r in reqs} == NODE


def test_the_lab_commands_run_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    # Before `fakenvml build` (a cache of its own): the MIG labs' inventories are checked
    # by the library, so the list says to build it, in one line.
    res = installed.run("gpulab", "lab", "list", env={"GPULAB_CACHE": str(tmp_path)})
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("gpulab lab list: error: ") and "fakenvml build" in res.stderr
    assert installed.run("fakenvml", "build").returncode == 0  # cached: the earlier test's
    res = installed.run("gpulab", "lab", "list")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].split() == ["LAB", "NODES", "GPUS", "FLEET", "SERVES",
                                                  "CLUSTER"]  # fmt: skip
    assert "which labs run is unknown: kind is not built (run `gpulab infra`)" in res.stderr
    labs = installed.cwd / "labs"  # never this machine's labs
    node = spec.load("seed").gpu_nodes[0].name
    res = installed.run("gpulab", "inject", "seed", node, "xid", "0", "79",
                        env={"GPULAB_LABS": str(labs)})  # fmt: skip
    assert res.returncode == 2
    assert res.stderr == (
        f"gpulab inject: error: no fake GPUs of {node} in {labs}/seed/{node}: "
        "lab seed is not up on this machine (gpulab lab up seed)\n"
    )


def test_nothing_was_written_beside_the_installed_code(installed: Installed) -> None:
    # Runs last (file order): every command above has run by now.
    record = (installed.dist_info / "RECORD").read_text()
    recorded = {line.split(",")[0] for line in record.splitlines()}
    extra = _site_files(installed.site) - recorded - {"_gpulab_test_deps.pth"}
    assert not extra
