"""CDI on the `seed` lab, for subjects whose Allocate names CDI devices (`device_ids: {cdi:
vendor/class}`; NVIDIA's cdi-cri strategy): the spec the plugin wrote on the node, and what
containerd made of it in a container — the GPUs' device nodes, the driver library, the env.
The whole-GPU suites run for these subjects too, reading devices from /dev.
"""

from __future__ import annotations

import pytest

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e import cdi, checkpoint
from e2e.pods import DEVICE_NODE, Pods
from e2e.verdict import Verdict

SEED = spec.load("seed")  # the --lab default: its first GPU worker
NODE = SEED.gpu_nodes[0].name
SPEC_DIR = "/var/run/cdi"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
pytestmark = pytest.mark.needs("cdi")


def node_specs(lab: Lab, kind: str) -> dict[str, list[str]]:
    """CDI device name -> its device nodes' paths, over the node's specs of `kind`."""
    names = lab.node_exec(NODE, "sh", "-c", f"ls {SPEC_DIR}").split()
    return cdi.device_nodes((lab.node_read(NODE, f"{SPEC_DIR}/{n}") for n in names), kind)


def test_the_plugin_wrote_a_spec_naming_every_gpu_with_its_device_node(
    subject: Subject, lab: Lab, verdict: Verdict
) -> None:
    kind = subject.spec.device_ids.cdi
    assert kind is not None
    gpus = lab.fake_gpus(NODE).node().gpus
    verdict.expect(f"{kind}: one device per GPU, named by its id, with its /dev/nvidia<minor>")
    specs = node_specs(lab, kind)
    # Each device as the GPU its name (the plugin's device id) names.
    named = {subject.gpu_of(name, gpus) or name: nodes for name, nodes in specs.items()}
    want = {g.uuid: [f"/dev/nvidia{g.minor if g.minor >= 0 else g.index}"] for g in gpus}
    right = [u for u, nodes in want.items() if named.get(u) == nodes]
    verdict.saw(f"{kind}: {len(specs)} devices; {len(right)} of {len(gpus)} GPUs by their id "
                f"with their device node")  # fmt: skip
    assert len(right) == len(gpus), {u: named.get(u) for u in want if u not in right}


def test_a_pod_gets_its_gpus_device_nodes_the_library_and_no_device_env(
    lab: Lab, pods: Pods, verdict: Verdict
) -> None:
    """2 GPUs: the container has exactly those GPUs' /dev/nvidia<minor> (the ones kubelet's
    checkpoint records for it) plus the control nodes, the driver's versioned library,
    and NVIDIA_VISIBLE_DEVICES=void (the runtime hook must not inject anything itself)."""
    version = lab.fake_gpus(NODE).node().driver_version
    verdict.expect("2 GPU device nodes = checkpoint, nvidiactl, libnvidia-ml.so.<ver>, env void")
    pods.create(pods.gpu_pod("cdi-2", 2, NODE))
    pod = pods.wait_running("cdi-2")
    dev = pods.device_nodes("cdi-2")
    gpu_nodes = sorted(n for n in dev if DEVICE_NODE.match(n))
    got = pods.devices("cdi-2")
    libs = pods.exec("cdi-2", ["ls", LIB_DIR], lambda out: "No such file" not in out).split()
    env = pods.env("cdi-2")
    verdict.saw(f"{gpu_nodes}, nvidiactl={'nvidiactl' in dev}, "
                f"libs={[x for x in libs if 'nvidia-ml' in x]}, "
                f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')}")  # fmt: skip
    assert len(gpu_nodes) == 2
    allocated = checkpoint.allocations(lab, NODE)[(pod.metadata.uid, "main", pods.resource)]
    assert sorted(got) == sorted(pods.gpus_of(NODE, allocated))
    assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} <= set(dev)
    assert f"libnvidia-ml.so.{version}" in libs
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void"
