"""Time-slicing on the `seed` lab, for subjects that advertise each GPU `replicas` times
(`expects.replicas` > 1; NVIDIA's `sharing.timeSlicing`, our plugin's `replicas:`):
capacity, a pod asking for more than the node's GPUs, and what one faulted GPU takes out.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e import checkpoint
from e2e.pods import Pods
from e2e.timing import fault_seen
from e2e.verdict import Verdict
from fakenvml.node import NodeDir

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE, GPUS = SEED.gpu_nodes[0].name, SEED.gpu_nodes[0].gpu_count
pytestmark = pytest.mark.needs("time_sliced")


def test_a_pod_asking_for_more_than_the_gpus_shares_them(
    subject: Subject, lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    """GPUS + 2 replicas on a node of GPUS GPUs: the pod runs; every id kubelet handed it
    is a replica (<uuid>::<k>, or as the subject's `id` says) of a GPU of that node, and the
    container got exactly those GPUs."""
    want = GPUS + 2
    verdict.expect(f"Running with {want} replicas of that node's GPUs")
    pods.create(pods.gpu_pod("shares", want, NODE))
    pod = pods.wait_running("shares")
    ids = checkpoint.allocations(lab, NODE)[(pod.metadata.uid, "main", pods.resource)]
    behind = set(pods.gpus_of(NODE, ids))
    got = pods.devices("shares")
    verdict.saw(f"Running: {len(set(ids))} ids on {len(behind)} GPUs; the container lists "
                f"{len(got)} ({len(set(got))} distinct)")  # fmt: skip
    assert len(set(ids)) == want
    assert all(subject.spec.device_ids.replica_of(i) is not None for i in ids), ids
    assert behind <= {g.uuid for g in lab.fake_gpus(NODE).node().gpus}
    assert set(got) == behind


def test_an_xid_takes_out_the_replicas_the_subject_says(
    subject: Subject, lab: Lab, fake_gpus: Callable[[str], NodeDir], verdict: Verdict
) -> None:
    """`xid_marks: every-replica` (ours: health is per GPU) takes all of the GPU's replicas
    out of allocatable; `one-replica` (NVIDIA's) only one of them. A recovering subject is
    back at full allocatable after `fakenvml recover`."""
    e = subject.expects
    full = GPUS * e.replicas
    down = full - e.out_per_faulted_gpu
    verdict.expect(f"{e.xid_marks}: {down}/{full}" + (f", recover {full}/{full}"
                                                       if e.recovers else ""))  # fmt: skip
    node = fake_gpus(NODE)
    fault_seen(verdict, lab, NODE, node.inject_xid(3, 79), down, full)
    if e.recovers:
        fault_seen(verdict, lab, NODE, node.recover(3), full, full)
