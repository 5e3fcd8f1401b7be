"""A subject in the node tier: its plugin run as a process, as its file's `process:` says.

    run = program(subject)
    argv, env = run.command(subject, kubelet.dir, node.path, workdir, {"MIG_STRATEGY": "mixed"})
    ...
    run.ready(proc)

The node tier runs programs, not images, so it knows how to start each program a subject
may name (clusters.subjects.subject.Process): gpulab's plugin from this checkout, NVIDIA's binary
of the subject's version. Which one runs comes from the subject file, never its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from clusters.subjects.subject import Process, Subject, tier_subjects
from standin import gpulab, nvidia
from standin.process import PluginProcess

Command = Callable[
    [Subject, Path, Path, Path, dict[str, str] | None], tuple[list[str], dict[str, str]]
]


@dataclass(frozen=True)
class Program:
    """How the node tier starts one plugin program and tells it is ready."""

    # (subject, kubelet dir, fakenvml node dir, workdir, extra env) -> argv, environment;
    # RuntimeError where the program is not built (`make infra`).
    command: Command
    inherit_env: bool  # the test process's environment under its own (a venv's PATH)
    # After it listed its devices: its health loop waits on NVML events (a fault injected
    # from then on reaches it).
    ready: Callable[[PluginProcess], None]
    # Told to hand containers their GPUs' device nodes from a fake driver root: its extra
    # arguments and environment.
    device_specs: Callable[[Path], tuple[list[str], dict[str, str]]]


def _nvidia_ready(proc: PluginProcess) -> None:
    proc.wait_event_wait()


PROGRAMS: dict[str, Program] = {
    "gpulab-plugin": Program(
        command=lambda s, kubelet, node, work, env: gpulab.command(kubelet, node, work, env),
        inherit_env=True,
        ready=gpulab.ready,
        device_specs=lambda root: (["--dev-root", str(root / "dev")], {}),
    ),
    "nvidia-device-plugin": Program(
        command=lambda s, kubelet, node, work, env: nvidia.command(
            s.version, kubelet, node, work, env
        ),
        inherit_env=False,
        ready=_nvidia_ready,
        device_specs=lambda root: ([], {"PASS_DEVICE_SPECS": "true", "NVIDIA_DEV_ROOT": str(root)}),
    ),
}
assert set(PROGRAMS) == set(get_args(Process)), "a process a subject may name has no Program"


def program(subject: Subject) -> Program:
    """What runs `subject` in the node tier (Unstated when its file gives no `process:`)."""
    return PROGRAMS[subject.process]


def node_subjects(subjects: list[Subject]) -> list[Subject]:
    """The subjects the node tier runs: those whose file says how (`process:`) and that
    serve outside a cluster."""
    return [s for s in tier_subjects(subjects) if s.spec.process is not None]
