"""Pods ask for the subject's resource: the shipped specs say nvidia.com/gpu."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

from e2e.pods import Pods


class Recorder:
    """Stands in for CoreV1Api.create_namespaced_pod: keeps what would be sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def create_namespaced_pod(self, namespace: str, doc: dict) -> None:
        self.sent.append(doc)


def limits(doc: dict) -> list[dict]:
    return [c["resources"]["limits"] for c in doc["spec"]["containers"]]


def test_a_subject_with_another_resource_gets_pods_asking_for_it() -> None:
    core = Recorder()
    Pods(core, "ns", "img:1", "example.com/gpu", "TINY_GPU_UUIDS").create("test-gpu2-rdma10")  # type: ignore[arg-type]
    assert limits(core.sent[0]) == [{"example.com/gpu": "2", "example.com/rdma": "10"}]
    assert core.sent[0]["spec"]["containers"][0]["resources"]["requests"]["example.com/gpu"] == "2"


def test_nvidia_gpu_subjects_get_the_specs_as_written() -> None:
    core = Recorder()
    Pods(core, "ns", "img:1").create("test-gpu-8")  # type: ignore[arg-type]
    assert limits(core.sent[0]) == [{"nvidia.com/gpu": "8"}]
    assert core.sent[0]["spec"]["containers"][0]["image"] == "img:1"


def test_the_suites_run_grouped_by_subject() -> None:
    """Each change of subject between two tests is a plugin switch on the labs (half a
    minute); the collected order must change subject once."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "e2e", "--subjects", "gpulab,nvidia"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # The subject's id among the test's parameters (the DRA suite's have none).
    found = (re.search(r"[\[-](gpulab|nvidia)[\]-]", line) for line in out.splitlines())
    order = [m[1] for m in found if m]
    changes = sum(a != b for a, b in itertools.pairwise(order))
    assert len(order) > 20 and changes == 1
