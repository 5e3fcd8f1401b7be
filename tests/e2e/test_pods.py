"""Pods ask for the subject's resource (the shipped specs say nvidia.com/gpu) and name what
a container got, and what the kubelet holds, by GPU whatever the plugin calls it."""

from __future__ import annotations

import base64
import itertools
import json
import re
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from kubernetes import client

from clusters.subjects.subject import DeviceIds
from e2e import checkpoint
from e2e.pods import Pods
from fakenvml import inventory
from fakenvml.mig import MigDevice, mig_uuid
from fakenvml.model import Gpu
from plugin.api.v1beta1 import api_pb2 as pb


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
    ids = DeviceIds(env="TINY_GPU_UUIDS")
    Pods(core, "ns", "img:1", "example.com/gpu", ids).create("test-gpu2-rdma10")  # type: ignore[arg-type]
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


# -- naming devices by GPU


NODE = "seed-worker"
# Four GPUs whose device minors do not follow their index (/dev/nvidia<minor>).
GPUS: list[Gpu] = [
    replace(g, minor=m)
    for g, m in zip(
        inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 4}]}, NODE).gpus,
        (3, 2, 1, 0),
        strict=True,
    )
]
SLICE = MigDevice(0, 0, GPUS[0].uuid, 1, 0, "1g.10gb", 9856, 16, mig_uuid(GPUS[0].uuid, 1, 0))


class Shown(Pods):
    """Pods whose one container shows `env` and `dev` (no cluster: exec and get stubbed)."""

    def __init__(self, ids: DeviceIds, env: dict[str, str] | None = None,
                 dev: list[str] | None = None) -> None:  # fmt: skip
        super().__init__(None, "ns", "img:1", ids=ids, node_gpus=self._node)  # type: ignore[arg-type]
        self.shown_env, self.shown_dev = env or {}, dev or []

    @staticmethod
    def _node(node: str) -> tuple[list[Gpu], list[MigDevice]]:
        assert node == NODE
        return GPUS, [SLICE]

    def get(self, name: str) -> client.V1Pod:
        return SimpleNamespace(spec=SimpleNamespace(node_name=NODE))  # type: ignore[return-value]

    def env(self, name: str, container: str | None = None, deadline_s: float = 30) -> dict:
        return self.shown_env

    def device_nodes(self, name: str, container: str | None = None) -> list[str]:
        return self.shown_dev


def test_uuids_in_the_env_are_the_gpus_and_a_stranger_says_so() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": f"{GPUS[2].uuid},{GPUS[0].uuid},GPU-elsewhere"}
    got = Shown(DeviceIds(env="NVIDIA_VISIBLE_DEVICES"), env).devices("p")
    assert got == [GPUS[2].uuid, GPUS[0].uuid, f"GPU-elsewhere (names no GPU of {NODE})"]


def test_a_missing_env_var_is_a_key_error_as_before() -> None:
    """The experiments runner reads a pod without the variable as one with no devices."""
    with pytest.raises(KeyError):
        Shown(DeviceIds(env="NVIDIA_VISIBLE_DEVICES"), {"PATH": "/bin"}).devices("p")


def test_minor_ids_in_the_env_name_the_gpu_of_that_device_node() -> None:
    ids = DeviceIds(env="GKE_DEVICES", id="nvidia{minor}")
    got = Shown(ids, {"GKE_DEVICES": "nvidia0,nvidia3"}).devices("p")
    assert got == [GPUS[3].uuid, GPUS[0].uuid]


def test_mig_uuids_in_the_env_name_the_mig_device() -> None:
    got = Shown(DeviceIds(env="NVIDIA_VISIBLE_DEVICES"), {"NVIDIA_VISIBLE_DEVICES": SLICE.uuid})
    assert got.devices("p") == [SLICE.uuid]


@pytest.mark.parametrize(
    "ids",
    [
        DeviceIds(device_specs="/dev/nvidia{minor}", id="nvidia{minor}"),
        DeviceIds(cdi="k8s.device-plugin.nvidia.com/gpu"),
    ],
    ids=["device-specs", "cdi"],
)
def test_device_nodes_name_their_gpus_by_minor(ids: DeviceIds) -> None:
    """Device specs or CDI: the container's /dev/nvidia<minor> nodes are its GPUs; the
    control nodes are not, and a node of no GPU says so."""
    dev = ["null", "nvidia-uvm", "nvidia1", "nvidia3", "nvidia9", "nvidiactl", "zero"]
    got = Shown(ids, dev=dev).devices("p")
    assert got == [GPUS[2].uuid, GPUS[0].uuid, f"/dev/nvidia9 (names no GPU of {NODE})"]


def test_checkpoint_ids_are_named_by_gpu_replica_suffix_or_not() -> None:
    p = Shown(DeviceIds(env="X"))
    ids = [GPUS[1].uuid, f"{GPUS[1].uuid}::2", "nvidia0"]
    assert p.gpus_of(NODE, ids) == [GPUS[1].uuid, GPUS[1].uuid, f"nvidia0 (names no GPU of {NODE})"]
    gke = Shown(DeviceIds(device_specs="/dev/nvidia{minor}", id="nvidia{minor}"))
    assert gke.gpus_of(NODE, ["nvidia0", "nvidia2"]) == [GPUS[3].uuid, GPUS[1].uuid]


def status(resource: str, health: dict[str, str]) -> client.V1Pod:
    """A pod whose status reports `health` of its devices of `resource` (KEP-4680)."""
    rs = client.V1ResourceStatus(name=resource, resources=[
        client.V1ResourceHealth(resource_id=i, health=h) for i, h in health.items()])  # fmt: skip
    cs = client.V1ContainerStatus(name="main", image="i", image_id="", ready=True,
                                  restart_count=0, allocated_resources_status=[rs])  # fmt: skip
    return client.V1Pod(spec=client.V1PodSpec(node_name=NODE, containers=[]),
                        status=client.V1PodStatus(container_statuses=[cs]))  # fmt: skip


def test_pod_status_health_is_keyed_by_the_gpu_each_id_names() -> None:
    gke = Shown(DeviceIds(device_specs="/dev/nvidia{minor}", id="nvidia{minor}"))
    pod = status("nvidia.com/gpu", {"nvidia0": "Unhealthy", "nvidia7": "Healthy"})
    assert gke.health(pod) == {GPUS[3].uuid: "Unhealthy",
                               f"nvidia7 (names no GPU of {NODE})": "Healthy"}  # fmt: skip
    uuids = Shown(DeviceIds(env="X"))
    assert uuids.health(status("nvidia.com/gpu", {GPUS[0].uuid: "Healthy"})) == {
        GPUS[0].uuid: "Healthy"
    }
    assert uuids.health(status("example.com/gpu", {GPUS[0].uuid: "Healthy"})) == {}


OPAQUE = DeviceIds(device_specs="/dev/nvidia{minor}", id="opaque")


def answered(answers: list[tuple[list[str], list[str]]]) -> Shown:
    """Pods of an opaque-id subject whose node's Allocate answers are `answers`."""
    p = Shown(OPAQUE)
    p.answers = lambda node: answers
    return p


def test_opaque_ids_are_named_by_the_device_specs_each_allocate_answered_with() -> None:
    """One id with one device node names it; known ids are taken out of the others."""
    p = answered([(["a"], ["/dev/nvidia0"]), (["b", "c"], ["/dev/nvidia1", "/dev/nvidia2"]),
                  (["c"], ["/dev/nvidia2"])])  # fmt: skip
    assert p.gpus_of(NODE, ["a", "b", "c"]) == [GPUS[3].uuid, GPUS[2].uuid, GPUS[1].uuid]


def test_opaque_ids_only_handed_together_are_named_as_their_group() -> None:
    p = answered([(["x", "y"], ["/dev/nvidia0", "/dev/nvidia3"])])
    assert sorted(p.gpus_of(NODE, ["y", "x"])) == sorted([GPUS[3].uuid, GPUS[0].uuid])
    assert p.gpus_of(NODE, ["x"]) == ["x (no Allocate answer tells its GPU)"]


def test_replica_ids_answered_with_one_device_node_all_name_its_gpu() -> None:
    assert answered([(["r1", "r2"], ["/dev/nvidia0"])]).gpus_of(NODE, ["r1", "r2"]) == [
        GPUS[3].uuid, GPUS[3].uuid]  # fmt: skip


def test_an_opaque_id_answered_with_two_gpus_is_the_plugins_bug() -> None:
    p = answered([(["a"], ["/dev/nvidia0"]), (["a"], ["/dev/nvidia1"])])
    with pytest.raises(checkpoint.InconsistentIds, match="device id a came with"):
        p.gpus_of(NODE, ["a"])


def test_the_kubelets_checkpoint_keeps_each_answers_device_specs() -> None:
    """kubelet stores every ContainerAllocateResponse (AllocResp) beside the ids."""
    spec = pb.DeviceSpec(container_path="/dev/nvidia2", host_path="/dev/nvidia2", permissions="rw")
    resp = pb.ContainerAllocateResponse(devices=[spec])
    entry = {"PodUID": "u1", "ContainerName": "main", "ResourceName": "example.com/gpu",
             "DeviceIDs": {"-1": ["dev-7f3a"]},
             "AllocResp": base64.b64encode(resp.SerializeToString()).decode()}  # fmt: skip
    text = json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}},
                       "Checksum": 1})  # fmt: skip
    lab = SimpleNamespace(node_read=lambda node, path: text)
    got = checkpoint.allocated_nodes(lab, NODE)  # type: ignore[arg-type]
    assert got == {("u1", "main", "example.com/gpu"): (["dev-7f3a"], ["/dev/nvidia2"])}


# -- waits


class Ended:
    """Stands in for CoreV1Api.read_namespaced_pod: a pod that `phase` after `reads` reads
    (Pending before), rejected at admission as a plugin whose Allocate failed leaves it."""

    def __init__(self, phase: str, reads: int = 2) -> None:
        self.phase, self.left, self.reads = phase, reads, 0

    def read_namespaced_pod(self, name: str, namespace: str) -> client.V1Pod:
        self.reads += 1
        ended = self.reads > self.left
        status = client.V1PodStatus(
            phase=self.phase if ended else "Pending",
            reason="UnexpectedAdmissionError" if ended else None,
            message="Allocate failed due to failed to find gpu ids" if ended else None)  # fmt: skip
        spec = client.V1PodSpec(containers=[], node_name="seed-worker")
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec, status=status)


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_wait_for_running_ends_at_once_on_a_pod_that_ended(phase: str) -> None:
    core = Ended(phase)
    pods = Pods(core, "ns", "img:1", plugin_log=lambda node: [f"{node}: Allocate: no gpu ids"])  # type: ignore[arg-type]
    with pytest.raises(AssertionError) as err:
        pods.wait_running("p", deadline_s=600)
    text = str(err.value)
    assert text.startswith(f"pod p will never be Running: {phase} (UnexpectedAdmissionError: "
                           "Allocate failed due to failed to find gpu ids)")  # fmt: skip
    assert text.endswith("last said:\n    seed-worker: Allocate: no gpu ids")
    assert core.reads <= 4  # the third read saw it end: no deadline waited out
