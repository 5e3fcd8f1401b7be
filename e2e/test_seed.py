"""The seeds' scenario, end to end on the `seed` lab, for each plugin under test.

Two GPU workers (clusters/labs/seed.yaml); the plugin runs on the first only. test-gpu-8 runs there
with 8 distinct GPUs of that node; test-gpu-3 stays Pending (Insufficient nvidia.com/gpu)
until the plugin starts on the second worker, then runs there. kubelet's checkpoint lists
exactly what each container got (the plugin's ids, each compared as the GPU it names).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e import checkpoint
from e2e.pods import Pods
from e2e.verdict import Verdict

SEED = spec.load("seed")  # the --lab default, whose two GPU workers these scenarios need
A, B = (n.name for n in SEED.gpu_nodes[:2])
GPUS = {n.name: n.gpu_count for n in SEED.gpu_nodes}
CONTROL_PLANE = SEED.control_plane.name


@pytest.fixture
def plugin_on_a_only(lab: Lab) -> Iterator[None]:
    lab.set_plugin_on(B, False)
    yield
    lab.set_plugin_on(B, True)
    lab.wait_capacity()


def uuids_of(lab: Lab, node: str) -> set[str]:
    return {g.uuid for g in lab.fake_gpus(node).node().gpus}


@pytest.mark.smoke
def test_both_workers_report_capacity_equal_allocatable(
    subject: Subject, lab: Lab, verdict: Verdict
) -> None:
    # Time-slicing advertises each GPU `replicas` times.
    n = {node: GPUS[node] * subject.expects.replicas for node in (A, B)}
    verdict.expect(", ".join(f"{c}/{c}" for c in n.values()) + " on both workers")
    seen = {node: lab.capacity(node) for node in (A, B)}
    verdict.saw(", ".join(f"{a}/{c}" for c, a in seen.values()))
    assert seen == {node: (c, c) for node, c in n.items()}


@pytest.mark.needs("replicas=1")  # the seeds' scenario counts whole GPUs
@pytest.mark.smoke
def test_gpu8_runs_gpu3_pends_then_runs_when_the_plugin_starts_on_b(
    lab: Lab, pods: Pods, plugin_on_a_only: None, verdict: Verdict
) -> None:
    verdict.expect("gpu-8 on A (8 GPUs); gpu-3 Pending, then on B")
    # B's plugin is gone: kubelet drops allocatable to 0 at once (capacity stays 5 min).
    lab.wait_allocatable(B, 0)
    pods.create("test-gpu-8")
    pod8 = pods.wait_running("test-gpu-8")
    assert pod8.spec.node_name == A
    visible = pods.devices("test-gpu-8")
    assert len(visible) == len(set(visible)) == 8
    assert set(visible) <= uuids_of(lab, A)
    verdict.saw(f"gpu-8 on {pod8.spec.node_name} ({len(set(visible))} GPUs)")

    pods.create("test-gpu-3")
    message = pods.wait_failed_scheduling("test-gpu-3", f"Insufficient {pods.resource}")
    verdict.saw("gpu-3 Pending")
    assert message.startswith(f"0/{len(SEED.nodes)} nodes are available")
    assert pods.get("test-gpu-3").status.phase == "Pending"

    lab.set_plugin_on(B, True)
    pod3 = pods.wait_running("test-gpu-3", deadline_s=120)
    visible3 = pods.devices("test-gpu-3")
    verdict.saw(f"then on {pod3.spec.node_name} ({len(set(visible3))} GPUs)")
    assert pod3.spec.node_name == B
    assert len(set(visible3)) == 3 and set(visible3) <= uuids_of(lab, B)

    # kubelet's checkpoint on each node lists exactly the allocated IDs per container.
    got_a = checkpoint.allocations(lab, A)[(pod8.metadata.uid, "main", pods.resource)]
    assert sorted(pods.gpus_of(A, got_a)) == sorted(visible)
    got_b = checkpoint.allocations(lab, B)[(pod3.metadata.uid, "main", pods.resource)]
    assert sorted(pods.gpus_of(B, got_b)) == sorted(visible3)


@pytest.mark.needs("extra_resources")  # a second resource from the same plugin
def test_gpu2_rdma10_gets_both_env_entries_and_checkpoint_entries(
    lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    verdict.expect("2 GPUs + 10 rdma in env and checkpoint")
    pods.create("test-gpu2-rdma10")
    pod = pods.wait_running("test-gpu2-rdma10")
    node = pod.spec.node_name
    gpus = pods.devices("test-gpu2-rdma10")
    rdma = pods.env("test-gpu2-rdma10")["EXAMPLE_COM_RDMA"].split(",")
    verdict.saw(f"{len(set(gpus))} GPUs + {len(set(rdma))} rdma in env")
    assert len(set(gpus)) == 2 and set(gpus) <= uuids_of(lab, node)
    assert sorted(rdma) == sorted(f"rdma-{i}" for i in range(10))
    got = checkpoint.allocations(lab, node)
    held = got[(pod.metadata.uid, "main", pods.resource)]
    assert sorted(pods.gpus_of(node, held)) == sorted(gpus)
    assert got[(pod.metadata.uid, "main", "example.com/rdma")] == sorted(rdma)


@pytest.mark.varies_with()  # the lab's nodes (the fake-gpus chart), whichever plugin serves
def test_each_gpu_node_has_its_gpus_device_nodes_in_its_own_dev(lab: Lab, verdict: Verdict) -> None:
    """As after a driver install: /dev/nvidia<minor> (c 195:<minor>) per GPU, nvidiactl,
    nvidia-uvm in the node's /dev, where stock deployments and device-spec plugins look;
    the node's /dev is its container's own, so the host's stays untouched."""
    verdict.expect("c 195:<minor> per GPU + nvidiactl + nvidia-uvm on both workers")
    seen = {}
    for node in (A, B):
        minors = sorted(
            g.minor if g.minor >= 0 else g.index for g in lab.fake_gpus(node).node().gpus
        )
        # stat: %t/%T are the major/minor in hex
        out = lab.node_exec(node, "sh", "-c", "stat -c '%n %F %t:%T' /dev/nvidia*")
        found = {line.split()[0]: line.split()[-1] for line in out.splitlines()
                 if "character special" in line}  # fmt: skip
        want = {f"/dev/nvidia{m}": f"c3:{m:x}" for m in minors}
        seen[node] = len([k for k in want if found.get(k) == want[k]])
        assert {k: found.get(k) for k in want} == want
        assert found.get("/dev/nvidiactl") == "c3:ff" and "/dev/nvidia-uvm" in found
    if not Path("/proc/driver/nvidia").exists():  # a GPU host has its own
        assert not any(p.name.startswith("nvidia") for p in Path("/dev").iterdir())
    verdict.saw(
        ", ".join(f"{n}: {c} GPU device nodes" for n, c in seen.items()) + "; host /dev clean"
    )


@pytest.mark.varies_with()  # NFD reads the node, whichever plugin serves
def test_nfd_finds_the_fake_gpus_on_each_gpu_nodes_pci_bus(lab: Lab, verdict: Verdict) -> None:
    """The fake GPUs are on the node's PCI bus where NFD reads it (vendor 0x10de), so NFD
    sets feature.node.kubernetes.io/pci-10de.present, which NVIDIA's chart's default
    affinity needs; the control plane has no fake GPUs and gets no such label."""
    label = "feature.node.kubernetes.io/pci-10de.present"
    verdict.expect(f"{label}=true on both workers, not on the control plane")
    got = {n: (lab.core.read_node(n).metadata.labels or {}).get(label)
           for n in (A, B, CONTROL_PLANE)}  # fmt: skip
    verdict.saw(", ".join(f"{n}: {v}" for n, v in got.items()))
    assert got == {A: "true", B: "true", CONTROL_PLANE: None}
