"""The cluster tier's own check: the seed lab comes up from locally built images on a real
kind cluster, and both workers report their 10 fake GPUs with each plugin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clusters.lab import Lab
from clusters.steps import poll

WORKERS = ("seed-worker", "seed-worker2")


@pytest.fixture(scope="module")
def seed() -> Iterator[Lab]:
    lab = Lab("seed", plugin="gpulab")
    lab.up()
    yield lab
    lab.down()


@pytest.mark.parametrize("plugin", ["gpulab", "nvidia"])
def test_both_workers_report_10_gpus_capacity_and_allocatable(seed: Lab, plugin: str) -> None:
    seed.use_plugin(plugin)
    for worker in WORKERS:
        assert seed.capacity(worker) == (10, 10)
    # The control plane has no fake GPUs and must not advertise any.
    assert seed.capacity("seed-control-plane") == (0, 0)


def test_host_side_injection_reaches_the_node(seed: Lab) -> None:
    seed.use_plugin("gpulab")
    seed.fake_gpus("seed-worker2").inject_xid(7, 79)

    def check() -> tuple[bool, str]:
        cap = seed.capacity("seed-worker2")
        return cap == (10, 9), f"capacity/allocatable {cap}"

    poll("seed-worker2 allocatable 9 after Xid 79", check, 30)
    assert seed.capacity("seed-worker") == (10, 10)
