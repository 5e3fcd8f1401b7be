"""pytest fixtures for the node tier (registered as the `gpulab_standin` pytest11 plugin).

    def test_lists_gpus(kubelet, fake_node, run_plugin):
        node = fake_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 8}]})
        run_plugin(["gpulab-plugin"], env={"FAKENVML_STATE_DIR": str(node.path)})
        kubelet.wait_devices("nvidia.com/gpu", 8)

- kubelet: a started stand-in in a fresh device-plugins dir, stopped afterwards.
- fake_node(spec, name): a fakenvml node state dir written from an inventory dict.
- run_plugin(argv, env, private_mount=False): any plugin command, with KUBELET_SOCKET
  pointing at the stand-in; stopped (SIGTERM, then SIGKILL) after the test.
- nvidia_plugin(version, node): NVIDIA's binary over that node (built on first use).
- subject_plugin(subject, node, env=None, args=()): the program the subject file names
  (`process:`, standin/subjects.py) over that node; `standin.subjects.program(subject)
  .ready(proc)` once it listed its devices.

When a test fails, its report gets the stand-in's records and each plugin's log tail.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from clusters.subjects.subject import Subject
    from fakenvml.node import NodeDir
    from standin.kubelet import Kubelet
    from standin.process import PluginProcess

# The stand-in, gRPC and fakenvml are imported inside the fixtures: pytest loads this
# entry point in every run in the venv, and one that uses none of it should not pay for
# (or fail on) gRPC or a checkout whose gRPC modules are not generated yet.
H100x8 = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 8}]}
_DIAGNOSTICS = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


def _diagnose(request: pytest.FixtureRequest, title: str, text: Callable[[], str]) -> None:
    request.node.stash.setdefault(_DIAGNOSTICS, []).append((title, text))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed and call.when in ("call", "setup"):
        for title, text in item.stash.get(_DIAGNOSTICS, []):
            report.sections.append((title, text()))
    return report


@pytest.fixture
def kubelet(request: pytest.FixtureRequest) -> Iterator[Kubelet]:
    from standin.kubelet import Kubelet

    with Kubelet() as k:
        _diagnose(request, "kubelet stand-in records", lambda: _records(k))
        yield k


def _records(k: Kubelet, last: int = 60) -> str:
    lines = [r.text() for r in k.records[-last:]]
    states = [res.summary() for res in k.resources.values()]
    return "\n".join([*lines, "", *states])


@pytest.fixture
def fake_node(tmp_path: Path) -> Callable[..., NodeDir]:
    """fake_node(spec=8 x H100, name="node-a") -> NodeDir, written under tmp_path."""

    from fakenvml import inventory
    from fakenvml.node import NodeDir

    def make(spec: dict | None = None, name: str = "node-a") -> NodeDir:
        d = NodeDir(tmp_path / "fakenvml" / name)
        d.init(inventory.from_dict(spec or H100x8, name))
        return d

    return make


@pytest.fixture
def run_plugin(
    request: pytest.FixtureRequest, kubelet: Kubelet, tmp_path: Path
) -> Iterator[Callable[..., PluginProcess]]:
    """run_plugin(argv, env=None, private_mount=False, inherit_env=True) -> PluginProcess."""
    from standin.process import PluginProcess, in_private_mount, kubelet_env

    started: list[PluginProcess] = []

    def run(
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        private_mount: bool = False,
        inherit_env: bool = True,
    ) -> PluginProcess:
        full = {**(os.environ if inherit_env else {}), **kubelet_env(kubelet.dir), **(env or {})}
        if private_mount:
            argv = in_private_mount(kubelet.dir, argv)
        log = tmp_path / f"plugin-{len(started)}.log"
        proc = PluginProcess(argv, full, log)
        started.append(proc)
        _diagnose(request, f"plugin {len(started) - 1} log ({argv[-1]})", proc.log_tail)
        proc.start()
        return proc

    yield run
    for proc in reversed(started):
        proc.stop()


@pytest.fixture
def nvidia_plugin(
    kubelet: Kubelet, run_plugin: Callable[..., PluginProcess], tmp_path: Path
) -> Callable[..., PluginProcess]:
    """nvidia_plugin(version, node, env=None) -> PluginProcess of NVIDIA's binary."""
    from standin import nvidia

    def run(version: str, node: NodeDir, env: dict[str, str] | None = None) -> PluginProcess:
        try:
            argv, full = nvidia.command(version, kubelet.dir, node.path, tmp_path, env)
        except RuntimeError as e:  # not built: one line naming `make infra`, no traceback
            pytest.fail(str(e), pytrace=False)
        return run_plugin(argv, full, inherit_env=False)

    return run


@pytest.fixture
def subject_plugin(
    run_plugin: Callable[..., PluginProcess], kubelet: Kubelet, tmp_path: Path
) -> Callable[..., PluginProcess]:
    """subject_plugin(subject, node, env=None, args=()) -> PluginProcess of the program its
    file's `process:` names, registering with the stand-in; not waited for."""
    from standin.subjects import program

    def run(
        subject: Subject, node: NodeDir, env: dict[str, str] | None = None, args: Sequence[str] = ()
    ) -> PluginProcess:
        how = program(subject)
        try:
            argv, full = how.command(subject, kubelet.dir, node.path, tmp_path, env)
        except RuntimeError as e:  # not built: one line naming `make infra`, no traceback
            pytest.fail(str(e), pytrace=False)
        return run_plugin([*argv, *args], full, inherit_env=how.inherit_env)

    return run
