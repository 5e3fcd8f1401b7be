"""The node tier runs a subject as its file's `process:` says, never by the file's name or
the subject's (standin/subjects.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from clusters.subjects import subject
from clusters.subjects.subject import Process, Subject
from fakenvml.node import NodeDir
from standin import Kubelet, nvidia
from standin.process import PluginProcess
from standin.subjects import PROGRAMS, node_subjects, program


def renamed(name: str, like: str, **changes: object) -> Subject:
    """A shipped subject under another name and file name, with `changes` to its file."""
    s = subject.load(like)
    spec = s.spec.model_copy(update={"name": name, **changes})
    return Subject(spec, s.source.with_name(f"{name}.yaml"), s.version)


def test_every_process_a_subject_may_name_has_a_program() -> None:
    assert set(PROGRAMS) == set(get_args(Process))


def test_the_program_follows_the_subject_files_process_not_its_name() -> None:
    assert program(renamed("nvidia-lookalike", "gpulab")) is PROGRAMS["gpulab-plugin"]
    gpulab_named = renamed("gpulab", "nvidia", process="gpulab-plugin")
    assert program(gpulab_named) is PROGRAMS["gpulab-plugin"]
    mine = renamed("mine", "gpulab", process="nvidia-device-plugin")
    assert program(mine) is PROGRAMS["nvidia-device-plugin"]


def test_nvidias_program_runs_the_binary_of_the_subjects_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nvidia, "binary", lambda v: Path(f"/built/{v}/nvidia-device-plugin"))
    s = renamed("mine", "nvidia-v0.17.4")
    argv, env = program(s).command(s, tmp_path / "kubelet", tmp_path / "node", tmp_path, None)
    assert argv[-1] == "/built/v0.17.4/nvidia-device-plugin"
    assert env["DEVICE_LIST_STRATEGY"] == "envvar"


def test_a_subject_that_names_no_process_is_not_run_in_the_node_tier() -> None:
    every = [*subject.shipped(), *subject.examples()]
    served = [s.name for s in subject.shipped() if s.spec.cluster_only is None]
    assert [s.name for s in node_subjects(every)] == served
    with pytest.raises(subject.Unstated, match="process is not stated"):
        program(subject.examples()[0])


def test_a_cluster_only_subject_is_left_out_of_the_node_and_container_tiers_in_one_line() -> None:
    mps = subject.load("nvidia-mps")
    why = mps.spec.cluster_only
    assert why and mps.spec.process is not None  # it says how, and why not here
    assert node_subjects([mps]) == [] and subject.tier_subjects([mps]) == []
    lines = subject.cluster_only([mps, subject.load("nvidia")])
    assert lines == [f"{mps.name}: cluster tier only: {why}"]


def test_a_renamed_gpulab_subject_runs_gpulabs_plugin(
    kubelet: Kubelet,
    fake_node: Callable[..., NodeDir],
    subject_plugin: Callable[..., PluginProcess],
) -> None:
    s = renamed("someone-elses", "gpulab")
    node = fake_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]})
    proc = subject_plugin(s, node)
    kubelet.wait_devices("nvidia.com/gpu", 2, timeout=30)
    program(s).ready(proc)
    assert s.serves_on(kubelet.resource("nvidia.com/gpu").endpoint)
