"""Failures real plugins met in the field, on the `seed` lab, for each plugin program.

- An Xid on a GPU that is already lost: a third-party plugin took its node to 0
  allocatable (it names the event's GPU by asking NVML for the UUID, which a lost GPU no
  longer answers). Only the lost GPU may go.
- A storm of NVML event-wait errors: a plugin either marks every device (NVIDIA's, by
  design: "Error waiting for event ... Marking all devices as unhealthy") or waits again
  (`event_wait_errors: ignored`) and still hears the next Xid; it never crashes.
- A GPU that falls off the bus while a pod holds it: the pod keeps running (the kubelet
  does not evict for device health), and the plugin still allocates healthy GPUs (the
  scheduler still counts the holder's request: N-2 fit beside it).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e.pods import Pods
from e2e.timing import fault_seen
from e2e.verdict import Verdict
from fakenvml.node import NodeDir

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE, N = SEED.gpu_nodes[0].name, SEED.gpu_nodes[0].gpu_count
WAIT_ERRORS = 5  # failed waits in a row (ours backs off 1 s after each)
pytestmark = [pytest.mark.needs("replicas=1"), pytest.mark.varies_with("plugin")]


def test_an_xid_on_a_gpu_already_lost_takes_out_that_gpu_only(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    every = subject.expects.lost_gpu == "every-device"
    # GPU 4 lost, then its Xid; a sentinel Xid on GPU 6 shows the plugin read past both.
    want = 0 if every else N - 2
    verdict.expect(f"lost GPU 4 + its Xid 79 + sentinel on 6: {want}/{N}")
    node = fake_gpus(NODE)
    node.lose(4)
    node.inject_xid(4, 79)
    rec = node.inject_xid(6, 79)
    fault_seen(verdict, lab, NODE, rec, want, N)
    if not every:  # nothing else goes later either (a late mark would show here)
        cap, alloc = lab.capacity(NODE)
        assert (cap, alloc) == (N, N - 2), f"{alloc}/{cap}"


def test_a_storm_of_event_wait_errors(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    every = subject.expects.event_wait_errors == "every-device"
    want = 0 if every else N - 1
    verdict.expect(f"{WAIT_ERRORS} failed waits, then an Xid on 6: {want}/{N}, no crash")
    restarts = {p.metadata.name: _restarts(p) for p in lab.plugin_pods(NODE)}
    node = fake_gpus(NODE)
    node.fail("nvmlEventSetWait", "UNKNOWN", count=WAIT_ERRORS)
    try:
        rec = node.inject_xid(6, 79)
        fault_seen(verdict, lab, NODE, rec, want, N)
        after = {p.metadata.name: _restarts(p) for p in lab.plugin_pods(NODE)}
        verdict.saw(f"plugin restarts {sum(after.values()) - sum(restarts.values())}")
        assert after == restarts  # the same pod, not restarted
    finally:
        node.clear_knobs()
        if every:  # NVIDIA's never re-adds a device it marked: only a restart heals it
            lab.restart_plugin()


def test_a_gpu_that_falls_off_the_bus_while_a_pod_holds_it(
    subject: Subject, lab: Lab, pods: Pods, fake_gpus: Callable[[str], NodeDir],
    verdict: Verdict,
) -> None:  # fmt: skip
    every = subject.expects.lost_gpu == "every-device"
    want = 0 if every else N - 1
    # The scheduler still counts the holder's request against allocatable: N-2 fit.
    rest = N - 2
    verdict.expect(f"{want}/{N}; holder Running; " + ("rest Pending" if every else
                   f"a pod for {rest} more runs on healthy GPUs"))  # fmt: skip
    pods.create(pods.gpu_pod("holder", 1, NODE))
    pods.wait_running("holder")
    node = fake_gpus(NODE)
    held = next(g for g in node.node().gpus if g.uuid in pods.devices("holder"))
    rec = node.fall_off_bus(held.index)
    fault_seen(verdict, lab, NODE, rec, want, N)
    pods.create(pods.gpu_pod("rest", rest, NODE))
    if every:
        pods.wait_failed_scheduling("rest", f"Insufficient {pods.resource}")
    else:
        pods.wait_running("rest")
        got = set(pods.devices("rest"))
        assert held.uuid not in got and len(got) == rest
    phase = pods.get("holder").status.phase
    verdict.saw(f"holder {phase}; rest {pods.get('rest').status.phase}")
    assert phase == "Running"


def _restarts(pod: object) -> int:
    return sum(c.restart_count for c in pod.status.container_statuses or [])  # type: ignore[attr-defined]
