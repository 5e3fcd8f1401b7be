"""Suites on the `hetero` lab (an A100, an H100 and a T4 worker), for each subject:
per-node capacity, scheduling by the labels NVIDIA's gpu-feature-discovery writes (product,
family, memory, count; clusters/labs/features.py) and those labels held to what GFD wrote on a
real H100, multi-container and init-container pods, and devices freed by a deleted pod."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusters.labs import spec
from clusters.labs.lab import Lab
from clusters.subjects.subject import Subject
from e2e.fixtures import gpu_node, lab_fixture, namespaced_pods
from e2e.pods import Pods
from e2e.verdict import Verdict

GPU = "nvidia.com/gpu"
CAPTURE = Path(__file__).resolve().parents[1] / "tests/fakenvml/data/h100/h100-gfd.txt"
HETERO = spec.load("hetero")
NODES = {n.name: n.gpu_count for n in HETERO.gpu_nodes}
NODE_A = HETERO.gpu_nodes[0].name
CONTROL_PLANE = HETERO.control_plane.name
A100, H100, T4 = (gpu_node(HETERO, p) for p in ("A100-SXM4-80GB", "H100-SXM5-80GB", "T4"))


@lab_fixture(HETERO.name)
def hetero(labs: Callable[..., Lab], subject: Subject) -> Lab:
    return labs(HETERO.name, subject)


@pytest.fixture
def hpods(hetero: Lab) -> Iterator[Pods]:
    yield from namespaced_pods(hetero)


def container(name: str, image: str, gpus: int) -> dict:
    return {"name": name, "image": image, "imagePullPolicy": "Never",
            "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}}  # fmt: skip


def pod(name: str, containers: list[dict], init: list[dict] | None = None,
        selector: dict | None = None) -> dict:  # fmt: skip
    spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                  "containers": containers}  # fmt: skip
    if init:
        spec["initContainers"] = init
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


# What a node advertises is the plugin program's and its replicas' (not how Allocate
# answers: CDI; nor what the replicas are: MPS clients share a GPU as time slices do).
@pytest.mark.varies_with("plugin", "replicas")
def test_each_node_reports_its_own_capacity(
    subject: Subject, hetero: Lab, verdict: Verdict
) -> None:
    want = {n: c * subject.expects.replicas for n, c in NODES.items()}
    verdict.expect(", ".join(f"{c}/{c}" for c in want.values()) + ", control plane 0")
    seen = {node: hetero.capacity(node) for node in [*NODES, CONTROL_PLANE]}
    verdict.saw(", ".join(f"{a}/{c}" for c, a in list(seen.values())[:-1])
                + f", control plane {seen[CONTROL_PLANE][0]}")  # fmt: skip
    assert seen == {**{n: (c, c) for n, c in want.items()}, CONTROL_PLANE: (0, 0)}


@pytest.mark.parametrize(
    ("product", "node"),
    [(n.gpu_product, n.name) for n in HETERO.gpu_nodes],
)
@pytest.mark.varies_with("replicas")  # scheduling reads GFD's labels, not the plugin
def test_pods_land_on_the_gpu_product_they_select(
    hetero: Lab, hpods: Pods, product: str, node: str, verdict: Verdict
) -> None:
    verdict.expect(f"on {node}")
    image = hetero.images["workload"]
    name = f"on-{product.lower()}"[:50].replace(".", "-")
    hpods.create(pod(name, [container("main", image, 1)], selector={
        "nvidia.com/gpu.product": product}))  # fmt: skip
    landed = hpods.wait_running(name).spec.node_name
    verdict.saw(f"on {landed}")
    assert landed == node
    visible = hpods.devices(name)
    assert set(visible) <= {g.uuid for g in hetero.fake_gpus(node).node().gpus}


@pytest.mark.parametrize(
    ("what", "terms", "node"),
    [("family hopper", [("nvidia.com/gpu.family", "In", ["hopper"])], H100.name),
     ("memory < 20 GiB", [("nvidia.com/gpu.memory", "Lt", ["20480"])], T4.name),
     (f"memory > 40 GiB, more than {H100.gpu_count} GPUs",
      [("nvidia.com/gpu.memory", "Gt", ["40960"]),
       ("nvidia.com/gpu.count", "Gt", [str(H100.gpu_count)])],
      A100.name)],
)  # fmt: skip
@pytest.mark.varies_with("replicas")
def test_pods_land_by_gfd_family_memory_and_count(
    hetero: Lab,
    hpods: Pods,
    what: str,
    terms: list[tuple[str, str, list[str]]],
    node: str,
    verdict: Verdict,
) -> None:
    """Node affinity on GFD's labels, as people select GPU nodes in real clusters."""
    verdict.expect(f"{what}: on {node}")
    spec = pod("by-labels", [container("main", hetero.images["workload"], 1)])
    exprs = [{"key": k, "operator": op, "values": v} for k, op, v in terms]
    spec["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}  # fmt: skip
    hpods.create(spec)
    landed = hpods.wait_running("by-labels").spec.node_name
    verdict.saw(f"on {landed}")
    assert landed == node


@pytest.mark.varies_with()  # GFD writes them, whichever plugin serves
def test_gfd_labels_of_the_h100_node_are_those_of_a_real_h100(
    hetero: Lab, verdict: Verdict
) -> None:
    """Every nvidia.com/ label GFD put on the H100 node, against what GFD wrote on the real
    H100 of the fidelity capture: equal but for the count (the node's GPUs here, 1 there)."""
    want = dict(line.split("=", 1) for line in CAPTURE.read_text().splitlines() if "=" in line)
    want["nvidia.com/gpu.count"] = str(H100.gpu_count)
    labels = hetero.core.read_node(H100.name).metadata.labels or {}
    got = {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}
    differ = {k: (want.get(k), got.get(k)) for k in sorted(want.keys() | got.keys())
              if want.get(k) != got.get(k)}  # fmt: skip
    verdict.expect(f"{len(want)} labels as on the real H100 (count {H100.gpu_count})")
    verdict.saw(f"{len(got)} labels, differing: {differ or 'none'}")
    assert differ == {}


@pytest.mark.needs("replicas=1")  # counts whole GPUs
@pytest.mark.varies_with("plugin")  # the kubelet picks; the program's Allocate answers
def test_sidecar_and_main_get_different_devices_and_init_runs_first(
    hetero: Lab, hpods: Pods, verdict: Verdict
) -> None:
    verdict.expect("main 2 + sidecar 1, disjoint; init exit 0")
    image = hetero.images["workload"]
    init = {**container("init", image, 1), "command": ["/bin/sh", "-c", "env"]}
    both = [container("main", image, 2), container("sidecar", image, 1)]
    hpods.create(pod("multi", both, init=[init], selector={"kubernetes.io/hostname": NODE_A}))
    p = hpods.wait_running("multi")
    main = set(hpods.devices("multi", "main"))
    side = set(hpods.devices("multi", "sidecar"))
    init_exit = p.status.init_container_statuses[0].state.terminated.exit_code
    verdict.saw(f"main {len(main)} + sidecar {len(side)}, {len(main & side)} shared; "
                f"init exit {init_exit}")  # fmt: skip
    assert len(main) == 2 and len(side) == 1 and not main & side
    assert init_exit == 0


@pytest.mark.needs("replicas=1")  # counts whole GPUs
@pytest.mark.varies_with("plugin")
def test_deleting_a_pod_frees_its_devices_for_the_next(
    hetero: Lab, hpods: Pods, verdict: Verdict
) -> None:
    every = T4.gpu_count  # the node's every GPU: nothing is left for the second pod
    verdict.expect(f"second Pending, then gets first's {every} GPUs")
    image = hetero.images["workload"]
    t4 = {"nvidia.com/gpu.product": T4.gpu_product}
    hpods.create(pod("first", [container("main", image, every)], selector=t4))
    first = set(hpods.devices(hpods.wait_running("first").metadata.name))  # fmt: skip
    hpods.create(pod("second", [container("main", image, every)], selector=t4))
    hpods.wait_failed_scheduling("second", f"Insufficient {hpods.resource}")
    hpods.delete("first")
    hpods.wait_running("second", deadline_s=120)
    got = set(hpods.devices("second"))
    verdict.saw(f"second ran with {'the same' if got == first else 'other'} {len(got)} GPUs")
    assert got == first
