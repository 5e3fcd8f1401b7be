"""A fleet health monitor on fake GPUs: node-problem-detector's kernel monitor reads the Xids
the fake driver writes to each node's kernel log (fakenvml/kernlog.py) and reports them on
that node only (clusters/labs/npd.py): an Event for every Xid, the GPUXidError condition
for one after which the driver asks for a reset or a reboot. On the seed lab, whichever
plugin it runs (the monitor does not talk to it); the faulted GPU is healed afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from kubernetes import client

from clusters import built, steps
from clusters.labs import npd, spec
from clusters.labs.lab import Lab
from e2e.fixtures import lab_fixture, recovering_gpus
from e2e.verdict import Verdict
from fakenvml import kernlog
from fakenvml.node import NodeDir

T = TypeVar("T")
SEED = spec.load("seed")
A, B = (n.name for n in SEED.gpu_nodes[:2])


@lab_fixture(SEED.name, scope="module")
def seed_lab(labs: Callable[..., Lab]) -> Lab:
    return labs(SEED.name)


@pytest.fixture(scope="module")
def monitor(seed_lab: Lab) -> Iterator[float]:
    """node-problem-detector up on both GPU workers; the wall clock time from which it
    reports a new line. Removed afterwards, its condition and Events with it."""
    image = built.require(["npd"], seed_lab.lab.kubernetes).images["npd"]
    seed_lab.host.load([image], [A, B])
    yield npd.deploy(seed_lab.kube, image, [A, B])
    npd.remove(seed_lab.kube, [A, B])


@pytest.fixture
def seed_gpus(seed_lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    yield from recovering_gpus(seed_lab)


def wait_for(what: str, check: Callable[[], T | None], deadline_s: float = 30) -> T:
    """check()'s first value that is not None, through steps.poll (node-problem-detector
    polls its log every 0.5 s and writes to the API at once)."""
    got: list[T] = []

    def done() -> tuple[bool, str]:
        if (value := check()) is not None:
            got.append(value)
        return bool(got), "nothing yet" if not got else "found"

    steps.poll(what, done, deadline_s)
    return got[0]


def events(lab: Lab, node: str, n: int) -> list[client.CoreV1Event] | None:
    """The node's GPUXid Events once there are `n`."""
    found = npd.events(lab.kube, node)
    return found if len(found) >= n else None


def status(lab: Lab, node: str) -> tuple[str, str] | None:
    c = npd.condition(lab.core.read_node(node))
    return None if c is None else (c.status, c.reason)


def test_an_xid_in_one_nodes_kernel_log_is_an_event_and_a_condition_on_that_node_only(
    seed_lab: Lab, monitor: float, seed_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    verdict.expect(f"Xid 13 and 79 on {A}: two GPUXid Events and GPUXidError=True (Xid79) "
                   f"on {A}; nothing on {B}")  # fmt: skip
    time.sleep(max(0.0, monitor - time.time()))
    a = seed_gpus(A)
    pci = kernlog.pci(a.resolve(2).bus_id)

    # An application's fault (Xid 13): an Event, the condition unchanged.
    a.inject_xid(2, 13)
    (first,) = wait_for("an Event for Xid 13", lambda: events(seed_lab, A, 1))
    assert f"(PCI:{pci}): 13," in first.message and first.source.component == npd.SOURCE
    assert status(seed_lab, A) == ("False", npd.CLEAN_REASON)

    # The GPU falls off the bus (Xid 79; the driver asks for a node reboot).
    a.fall_off_bus(2)

    def flipped() -> client.V1NodeCondition | None:
        c = npd.condition(seed_lab.core.read_node(A))
        return c if c is not None and c.status == "True" else None

    cond = wait_for(f"{npd.CONDITION}=True", flipped)
    assert cond.reason == "Xid79" and f"(PCI:{pci}): 79," in cond.message
    both = wait_for("two Events", lambda: events(seed_lab, A, 2))
    assert [e.message.split("): ")[1].split(",")[0] for e in both] == ["13", "79"]

    # The other node's log has neither: its monitor reported nothing.
    assert status(seed_lab, B) == ("False", npd.CLEAN_REASON)
    assert npd.events(seed_lab.kube, B) == []
    verdict.saw(f"{len(both)} Events and {cond.type}=True ({cond.reason}) on {A}; nothing on {B}")
