"""clusters/labs/fleet.py without a cluster: a fleet node and its slices as made from a model,
and the comparison that must find any field a copy does not share with its model."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from io import StringIO
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client
from rich.console import Console

from clusters import built, steps
from clusters.labs import fleet, kindconfig

MODEL = "dra-worker"


def model_node() -> client.V1Node:
    labels = {"kubernetes.io/hostname": MODEL, "node-role.kubernetes.io/worker": "",
              "gpulab.dev/plugin": "true",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
              "kubernetes.io/arch": "amd64"}  # fmt: skip
    status = client.V1NodeStatus(capacity={"cpu": "2", "nvidia.com/gpu": "4"},
                                 allocatable={"cpu": "2", "nvidia.com/gpu": "3"})  # fmt: skip
    return client.V1Node(metadata=client.V1ObjectMeta(name=MODEL, labels=labels), status=status)


def model_slice(node: str = MODEL, product: str = "NVIDIA H100 80GB HBM3") -> dict:
    device = {"name": "gpu-0", "attributes": {"productName": {"string": product},
                                              "index": {"int": 0}},
              "capacity": {"memory": {"value": "80Gi"}}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-abcde", "uid": "u1",
                     "resourceVersion": "7", "ownerReferences": [{"kind": "Node", "name": node}]},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
                 "devices": [device, copy.deepcopy(device) | {"name": "gpu-1"}]},
    }  # fmt: skip


def test_a_copy_shows_the_models_capacity_and_labels_under_its_own_name() -> None:
    doc = fleet.node_doc(model_node(), "dra-worker-kwok-0")
    labels = doc["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "dra-worker-kwok-0"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels[fleet.FLEET_LABEL] == MODEL
    assert not any(k.startswith("node-role.kubernetes.io/") for k in labels)
    assert "gpulab.dev/plugin" not in labels  # the lab's switch: its DaemonSets stay off
    assert doc["metadata"]["annotations"][fleet.MANAGED[0]] == fleet.MANAGED[1]
    assert doc["spec"]["taints"] == [fleet.TAINT]
    assert doc["status"]["allocatable"] == {"cpu": "2", "nvidia.com/gpu": "3"}


def test_a_copied_slice_is_the_copys_pool_owned_by_the_copy() -> None:
    node = client.V1Node(metadata=client.V1ObjectMeta(name="c-0", uid="n-uid"))
    doc = fleet.slice_doc(model_slice(), node, 0)
    assert doc["spec"]["nodeName"] == doc["spec"]["pool"]["name"] == "c-0"
    assert doc["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node",
                                                   "name": "c-0", "uid": "n-uid",
                                                   "controller": True}]  # fmt: skip
    assert fleet.differences([model_slice()], [model_slice("c-0")]) == []


def test_a_pool_not_named_after_its_node_is_refused() -> None:
    odd = model_slice()
    odd["spec"]["pool"]["name"] = "shared"
    with pytest.raises(steps.StepError, match="pool shared"):
        fleet.slice_doc(odd, client.V1Node(metadata=client.V1ObjectMeta(name="c", uid="u")), 0)


def test_bookkeeping_and_device_order_are_no_difference() -> None:
    other = model_slice("c-0")
    other["metadata"] |= {"name": "elsewhere", "uid": "u2", "resourceVersion": "99"}
    other["spec"]["pool"]["generation"] = 1
    other["spec"]["devices"].reverse()
    assert fleet.differences([model_slice()], [other]) == []


@pytest.mark.parametrize(("change", "where"), [
    (lambda s: s["spec"]["devices"][1]["attributes"]["productName"].update(string="B200"),
     "slices[0].spec.devices[1].attributes.productName.string: 'NVIDIA H100 80GB HBM3' -> 'B200'"),
    (lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(value="40Gi"),
     "slices[0].spec.devices[0].capacity.memory.value: '80Gi' -> '40Gi'"),
    (lambda s: s["spec"]["devices"][0].update(taints=[{"key": "gpu.nvidia.com/xid"}]),
     "slices[0].spec.devices[0].taints: '<absent>' -> [{'key': 'gpu.nvidia.com/xid'}]"),
    (lambda s: s["spec"]["pool"].update(resourceSliceCount=2),
     "slices[0].spec.pool.resourceSliceCount: 1 -> 2"),
], ids=["attribute", "capacity", "taint", "slice-count"])  # fmt: skip
def test_any_field_of_the_content_is_a_difference(change: Callable[[dict], object],
                                                  where: str) -> None:  # fmt: skip
    other = copy.deepcopy(model_slice("c-0"))
    change(other)
    assert fleet.differences([model_slice()], [other]) == [where]


def test_a_device_missing_is_a_difference() -> None:
    other = model_slice("c-0")
    del other["spec"]["devices"][1]
    assert fleet.differences([model_slice()], [other])[0] == "slices[0].spec.devices: 2 items -> 1"


def driver_template() -> dict:
    """The DRA driver DaemonSet's pod template, as the API server serves it (its parts
    `live_pod` changes)."""
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "CDI_ROOT", "value": "/var/run/cdi"}]  # fmt: skip
    volumes = [{"name": n, "hostPath": {"path": p}} for n, p in (
        ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
        ("plugins", "/var/lib/kubelet/plugins"), ("cdi", "/var/run/cdi"),
        ("driver-root", "/run/fakenvml/driver"))]  # fmt: skip
    return {
        "metadata": {"labels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"},
                     "annotations": {"gpulab.dev/fakenvml": "gpulab/gpulab:x"}},
        "spec": {"affinity": {"nodeAffinity": {}},
                 "initContainers": [{"name": "init-container", "env": copy.deepcopy(env)}],
                 "containers": [{"name": "gpus", "env": env}], "volumes": volumes},
    }  # fmt: skip


def test_a_live_copys_driver_is_the_daemonsets_pod_serving_the_copy_from_its_models_node() -> None:
    """Bound to the model's node; NODE_NAME the copy's in every container; the copy's own
    fakenvml state and kubelet plugin dirs and CDI root; the driver root shared; labels
    that the DaemonSet's selector does not match (it would delete the pod)."""
    template = driver_template()
    pod = fleet.live_pod(template, MODEL, "dra-worker-kwok-0")
    spec = pod["spec"]
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "nvidia-dra-driver-gpu"
    assert spec["nodeName"] == MODEL and "affinity" not in spec
    assert "dra-driver-nvidia-gpu-component" not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"][fleet.LIVE_LABEL] == "dra-worker-kwok-0"
    state = "/driver-root/var/lib/fakenvml/fleet/dra-worker-kwok-0"
    for c in spec["initContainers"] + spec["containers"]:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env == {"NODE_NAME": "dra-worker-kwok-0", "CDI_ROOT": "/var/run/cdi",
                       "FAKENVML_STATE_DIR": state}  # fmt: skip
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert paths == {"plugins-registry": "/var/lib/gpulab-fleet/dra-worker-kwok-0/plugins_registry",
                     "plugins": "/var/lib/gpulab-fleet/dra-worker-kwok-0/plugins",
                     "cdi": "/var/lib/gpulab-fleet/dra-worker-kwok-0/cdi",
                     "driver-root": "/run/fakenvml/driver"}  # fmt: skip
    assert template == driver_template()  # the template itself is left as it was


def kwok(lease: int) -> tuple[dict, dict]:
    """KWOK's config and its controller's pod template, as kwok_docs makes them."""
    docs = fleet.kwok_docs("gpulab/kwok:t", "v1.37.0", lease)
    mine = {d["kind"]: d for d in docs if d["metadata"]["name"] == fleet.CONTROLLER}
    conf = yaml.safe_load(mine["ConfigMap"]["data"]["kwok.yaml"])
    return conf, mine["Deployment"]["spec"]["template"]


@pytest.mark.parametrize("lease", [40, 240])
def test_kwoks_config_carries_the_labs_node_lease_and_its_renewal_workers(lease: int) -> None:
    conf, template = kwok(lease)
    assert conf["options"]["nodeLeaseDurationSeconds"] == lease
    assert conf["options"]["nodeLeaseParallelism"] == fleet.LEASE_WORKERS
    # The rest of KWOK's own config as its chart has it.
    assert conf["options"]["manageNodesWithAnnotationSelector"] == "=".join(fleet.MANAGED)
    assert template["spec"]["containers"][0]["image"] == "gpulab/kwok:t"


def test_a_change_of_kwoks_config_restarts_its_controller() -> None:
    """KWOK reads its file once: the pod template carries the config's digest."""
    (_, a), (_, again), (_, b) = kwok(40), kwok(40), kwok(240)
    key = fleet.CONFIG_ANNOTATION
    assert a["metadata"]["annotations"][key] == again["metadata"]["annotations"][key]
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]


def test_a_node_is_ready_by_its_ready_condition_alone() -> None:
    def node(*conditions: tuple[str, str]) -> dict:
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}

    assert fleet.is_ready(node(("MemoryPressure", "False"), ("Ready", "True")))
    assert not fleet.is_ready(node(("Ready", "Unknown")))
    assert not fleet.is_ready(node(("NetworkUnavailable", "True")))
    assert not fleet.is_ready({"metadata": {"name": "new"}})  # no status yet


def test_the_node_images_pod_network_leaves_out_the_fleets_label() -> None:
    """gpulab-podnet (a shell script in the node image) spells the fleet's label itself."""
    script = built.ROOT / "clusters/infra/nodeimage/files/usr/local/bin/gpulab-podnet"
    said = re.search(r"^FLEET_LABEL=(\S+)$", script.read_text(), re.M)
    assert said and said[1] == kindconfig.FLEET_LABEL
    assert '-l "!$FLEET_LABEL"' in script.read_text()


def test_deleting_copies_goes_on_past_a_pod_or_node_already_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DaemonSet's pod on a copy went between the list and its delete (its controller
    was first): the copy is deleted all the same (a 5,000-copy run stopped on that 404)."""
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="kube-proxy-tsm9s",
                                                    namespace="kube-system"))  # fmt: skip
    deleted: list[str] = []

    class Core:
        def list_namespaced_pod(self, ns: str, label_selector: str) -> client.V1PodList:
            return client.V1PodList(items=[])

        def list_pod_for_all_namespaces(self, field_selector: str) -> client.V1PodList:
            return client.V1PodList(items=[pod])

        def delete_namespaced_pod(self, name: str, ns: str, **kw: object) -> None:
            raise client.ApiException(status=404, reason="Not Found")

        def delete_node(self, name: str) -> None:
            deleted.append(name)
            if name.endswith("-1"):
                raise client.ApiException(status=404, reason="Not Found")

    class Slices:
        def delete_collection_resource_slice(self, field_selector: str) -> None:
            deleted.append(field_selector)

    ctx = type("Ctx", (), {"kube": type("Kube", (), {"core": Core()})()})()
    monkeypatch.setattr(fleet.dra, "api", lambda ctx: Slices())
    monkeypatch.setattr(fleet, "slices", lambda ctx: [])
    fleet.delete(ctx, ["c-0", "c-1"])
    assert sorted(deleted) == ["c-0", "c-1", "spec.nodeName=c-0", "spec.nodeName=c-1"]


def test_a_long_fleet_step_says_how_far_it_is_at_most_once_a_period() -> None:
    """A CI log has no spinner: a fleet step prints a line when its period has passed."""
    out = StringIO()
    ctx = SimpleNamespace(name="dra", console=Console(file=out, width=200))
    quiet = fleet.progress(ctx, "KWOK copies of dra-worker")  # type: ignore[arg-type]
    quiet("1/5000 made")
    assert out.getvalue() == ""
    each = fleet.progress(ctx, "KWOK copies of dra-worker", every_s=0)  # type: ignore[arg-type]
    each("2350/5010 Ready")
    assert re.fullmatch(r"… dra: KWOK copies of dra-worker: 2350/5010 Ready \(\d+s\)\n",
                        out.getvalue())  # fmt: skip
