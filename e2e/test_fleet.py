"""A fleet of fake GPU nodes (clusters/labs/fleet.py): KWOK copies of a lab's real GPU nodes,
none with a kubelet, for the real kube-scheduler to place pods on; on the `dra` lab (its
H100, T4 and A100 80 GB nodes: a mixed fleet) and on the MIG inventories, `dra-mig` (a whole
GPU beside static MIG devices) and `dra-dynmig` (DynamicMIG: every placement, with counters).
What a copy publishes is its model's, taken from the live node: the ResourceSlices NVIDIA's
DRA driver published for the model, compared field by field; its capacity and labels. A
one-attribute difference is found where it is. Claims that select by attribute or MIG
profile, and pods asking `nvidia.com/gpu` (the driver's extended resource), land on copies
of the right model, and KWOK runs them. The A100 node's copies are live: each has a driver
process of its own on fake GPUs of its own, which publishes the model's slices with its own
GPUs' UUIDs, and faults injected there taint that copy's devices and nothing else, as on a
real node: new claims go to the healthy copies, running pods and claims stay.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from clusters import steps
from clusters.labs import dra, features, fleet, spec
from clusters.labs.lab import Lab
from e2e.fixtures import NAMESPACE, lab_fixture, namespaced_pods
from e2e.pods import Pods
from e2e.verdict import Verdict
from fakenvml import mig

DRA, DRA_MIG, DYNMIG = (spec.load(n) for n in ("dra", "dra-mig", "dra-dynmig"))
MODELS = list(DRA.fleet)  # the fleets are the labs' specs' (`fleet:`), made here
# The model whose copies are live (a DRA driver each): the eight-GPU A100 node's.
LIVE = next(n for n, f in DRA.fleet.items() if f.live)
PODNET = "gpulab-podnet"  # the node image's pod network (clusters/infra/nodeimage/files)
START_S = 60  # as e2e/test_dra.py's: a pod with a claim runs in about a second when quiet


@dataclass(frozen=True)
class Fleet:
    lab: Lab
    copies: dict[str, list[str]]  # model -> its copies


def fleet_of(lab: Lab) -> Iterator[Fleet]:
    """The fleet the lab's spec declares (the suites' labs come up without it:
    e2e/fixtures.py bring_up), deleted afterwards."""
    yield Fleet(lab, fleet.up_spec(lab.ctx))
    fleet.down(lab.ctx)


@lab_fixture(DRA.name, scope="module")
def fleet_lab(labs: Callable[..., Lab]) -> Iterator[tuple[Lab, dict[str, list[str]]]]:
    for f in fleet_of(labs(DRA.name)):
        yield f.lab, f.copies


@lab_fixture(DRA_MIG.name, scope="module")
def mig_fleet(labs: Callable[..., Lab]) -> Iterator[Fleet]:
    yield from fleet_of(labs(DRA_MIG.name))


@lab_fixture(DYNMIG.name, scope="module")
def dynmig_fleet(labs: Callable[..., Lab]) -> Iterator[Fleet]:
    yield from fleet_of(labs(DYNMIG.name))


@pytest.fixture
def fpods(fleet_lab: tuple[Lab, dict[str, list[str]]]) -> Iterator[Pods]:
    lab, _ = fleet_lab
    yield from namespaced_pods(lab)
    dra.delete_claims(lab, NAMESPACE)


def product(lab: Lab, node: str) -> str:
    first = next(iter(dra.devices(lab, node).values()))
    return str(dra.attribute(first, "productName"))


@pytest.mark.parametrize("model", MODELS)
def test_each_copy_publishes_its_models_resource_slices(
    fleet_lab: tuple[Lab, dict[str, list[str]]], model: str, verdict: Verdict
) -> None:
    """Every field of every device the driver published for the model (attributes,
    capacities, counters, taints), in each copy's slices, under the copy's node and pool.
    A live copy's own driver publishes them for GPUs of its own: every field the model's
    but each GPU's UUID, which is its own (none shared with the model or another copy)."""
    lab, made = fleet_lab
    live = model == LIVE
    want = fleet.slices(lab.ctx, model)
    devices = sum(len(s["spec"]["devices"]) for s in want)
    own = "; each GPU's UUID its own (live copies)" if live else ""
    verdict.expect(f"{DRA.fleet[model].copies} copies, each {len(want)} slices of {devices} "
                   f"devices, no field different{own}")  # fmt: skip
    found = {c: fleet.slices(lab.ctx, c) for c in made[model]}
    diffs = {c: fleet.differences(want, got) for c, got in found.items()}
    uuids = [str(d["attributes"]["uuid"]["string"]) for got in [want, *found.values()]
             for s in got for d in s["spec"]["devices"]]  # fmt: skip
    if live:  # the UUIDs apart: the last assertion wants each its own
        diffs = {c: [d for d in ds if ".attributes.uuid.string: " not in d]
                 for c, ds in diffs.items()}  # fmt: skip
    pools = {c: sorted({s["spec"]["pool"]["name"] for s in got}) for c, got in found.items()}
    verdict.saw(f"{len(found)} copies; differences {sum(map(len, diffs.values()))}; "
                f"pools {pools}; {len(set(uuids))} distinct UUIDs of {len(uuids)}")  # fmt: skip
    assert devices > 0
    assert diffs == {c: [] for c in made[model]}
    assert pools == {c: [c] for c in made[model]}
    assert len(set(uuids)) == (len(uuids) if live else devices)


def test_a_one_attribute_difference_is_found_where_it_is(
    fleet_lab: tuple[Lab, dict[str, list[str]]], verdict: Verdict
) -> None:
    """One copy's slice with one device's productName changed: the comparison names that
    field, with both values, and nothing else; put back, none."""
    lab, made = fleet_lab
    model = MODELS[0]
    copy_node = made[model][0]
    (first, *_) = sorted(fleet.slices(lab.ctx, copy_node), key=lambda s: s["metadata"]["name"])
    changed = copy.deepcopy(first)
    device = changed["spec"]["devices"][0]
    old = device["attributes"]["productName"]["string"]
    device["attributes"]["productName"]["string"] = "NVIDIA B200"
    verdict.expect(f"1 difference: {device['name']} productName {old!r} -> 'NVIDIA B200'")
    # As fleet.up applied it (an apply that left out its owner would take the owner off).
    meta = {k: first["metadata"][k] for k in ("name", "ownerReferences")}
    original = {"apiVersion": "/".join(fleet.SLICES[:2]), "kind": "ResourceSlice",
                "metadata": meta, "spec": first["spec"]}  # fmt: skip
    try:
        lab.kube.apply({**original, "spec": changed["spec"]})
        diffs = fleet.differences(fleet.slices(lab.ctx, model),
                                  fleet.slices(lab.ctx, copy_node))  # fmt: skip
    finally:
        lab.kube.apply(original)
    after = fleet.differences(fleet.slices(lab.ctx, model), fleet.slices(lab.ctx, copy_node))
    verdict.saw(f"{diffs}; put back: {after}")
    assert len(diffs) == 1
    assert "attributes.productName.string" in diffs[0]
    assert diffs[0].endswith(f"{old!r} -> 'NVIDIA B200'")
    assert after == []


def test_copies_show_their_models_capacity_and_gpu_labels(
    fleet_lab: tuple[Lab, dict[str, list[str]]], verdict: Verdict
) -> None:
    """Each copy: Ready (KWOK), its model's capacity and allocatable, and its model's
    labels of the GPU world (GFD's nvidia.com/, NFD's feature.node.kubernetes.io/)."""
    lab, made = fleet_lab
    copies = sum(f.copies for f in DRA.fleet.values())
    verdict.expect(f"{copies} copies Ready with their model's capacity and labels")

    def gpu_labels(labels: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in labels.items()
                if k.startswith(("nvidia.com/", "feature.node.kubernetes.io/"))}  # fmt: skip

    wrong = []
    for model, copies in made.items():
        m = lab.core.read_node(model)
        for c in copies:
            n = lab.core.read_node(c)
            ready = any(x.type == "Ready" and x.status == "True" for x in n.status.conditions)
            same = (n.status.capacity == m.status.capacity
                    and n.status.allocatable == m.status.allocatable
                    and gpu_labels(n.metadata.labels) == gpu_labels(m.metadata.labels))  # fmt: skip
            if not (ready and same):
                wrong.append(f"{c}: ready {ready}, same {same}")
    labelled = gpu_labels(lab.core.read_node(MODELS[0]).metadata.labels)
    verdict.saw(f"{wrong or 'all alike'}; {MODELS[0]}'s GPU labels: {len(labelled)}")
    assert wrong == []
    assert labelled  # the lab's NFD labelled the model: something was compared


def test_the_labs_pod_network_leaves_the_fleet_out(
    fleet_lab: tuple[Lab, dict[str, list[str]]], verdict: Verdict
) -> None:
    """gpulab-podnet on every kind node routes to the other kind nodes' podCIDRs alone, and
    never exited while the copies were there. A copy's address is KWOK's pod's, on no
    node's network: routing to it failed, the script exited, and systemd started it again
    every few seconds, each start a list of every node (1,000 copies: 3 workers listing
    5 MB of Nodes every ~3 s)."""
    lab, made = fleet_lab
    kind_nodes = [n.name for n in lab.ctx.lab.nodes]
    cidrs = {n: lab.core.read_node(n).spec.pod_cidr for n in kind_nodes}
    verdict.expect(f"on {len(kind_nodes)} nodes: routes to the others' podCIDRs, no exit, "
                   f"with {sum(map(len, made.values()))} copies up")  # fmt: skip
    wrong = []
    for node in kind_nodes:
        journal = lab.node_exec(node, "journalctl", "-u", PODNET, "--no-pager", "-o", "cat")
        routes = lab.node_exec(node, "ip", "-4", "route", "show")
        routed = {line.split()[0] for line in routes.splitlines() if " via " in line
                  and not line.startswith("default")}  # fmt: skip
        want = {c for n, c in cidrs.items() if n != node}
        exits = journal.count("Main process exited")
        if routed != want or exits:
            wrong.append(f"{node}: routes to {sorted(routed)}, want {sorted(want)}; "
                         f"{exits} exits")  # fmt: skip
    verdict.saw("; ".join(wrong) or "as expected on every node")
    assert wrong == []


def test_the_labs_tolerate_all_daemonsets_stay_off_the_fleet(
    fleet_lab: tuple[Lab, dict[str, list[str]]], verdict: Verdict
) -> None:
    """kube-proxy and NFD's worker tolerate every taint: each kind node runs one of each,
    and no copy does (else KWOK runs two pods for each copy: 10,020 at 5,000 copies)."""
    lab, made = fleet_lab
    kind_nodes = sorted(n.name for n in lab.ctx.lab.nodes)
    copies = {c for cs in made.values() for c in cs}
    verdict.expect(f"one pod of each on the {len(kind_nodes)} kind nodes, none on the "
                   f"{len(copies)} copies")  # fmt: skip
    lab.ctx.kube.wait_daemonset(*fleet.KUBE_PROXY)  # the fleet's patch rolls it, unwaited
    wrong = []
    for what, ns, labels in (("kube-proxy", "kube-system", "k8s-app=kube-proxy"),
                             ("nfd-worker", features.NAMESPACE, features.WORKER)):  # fmt: skip
        on = sorted(p.spec.node_name or "" for p in lab.ctx.kube.pods(ns, labels))
        if on != kind_nodes:
            wrong.append(f"{what} on {len(on)} nodes ({len(copies & set(on))} copies), "
                         f"want {kind_nodes}")  # fmt: skip
    verdict.saw("; ".join(wrong) or "as expected")
    assert copies  # there was a fleet to stay off
    assert wrong == []


def test_the_labs_control_plane_args_are_its_components_flags(
    fleet_lab: tuple[Lab, dict[str, list[str]]], verdict: Verdict
) -> None:
    """The lab spec's control_plane_args (the scheduler's and controller-manager's API
    client limits, raised for fleets: `make bench-scale`) on those components' command
    lines as the kubelet runs them (kubeadm's static pods)."""
    lab, _ = fleet_lab
    args = lab.ctx.lab.spec.control_plane_args
    cp = lab.ctx.lab.control_plane.name
    want = {"kube-scheduler": args.scheduler, "kube-controller-manager": args.controller_manager}
    verdict.expect("; ".join(f"{c}: {a}" for c, a in want.items()))
    got = {}
    for component, flags in want.items():
        static = lab.core.read_namespaced_pod(f"{component}-{cp}", "kube-system")
        command = static.spec.containers[0].command
        got[component] = {k: v for k, v in flags.items() if f"--{k}={v}" in command}
    verdict.saw("; ".join(f"{c}: {a}" for c, a in got.items()))
    assert all(want.values()) and got == want


@pytest.mark.parametrize("model", MODELS)
def test_a_claim_by_product_runs_on_a_copy_of_its_model(
    fleet_lab: tuple[Lab, dict[str, list[str]]], fpods: Pods, model: str, verdict: Verdict
) -> None:
    """A claim selecting the model's product, from a pod that tolerates KWOK's taint and
    asks for a copy of the model: the scheduler allocates it a device of one copy's slice,
    binds the pod there, and KWOK runs it."""
    lab, made = fleet_lab
    name = product(lab, model)
    case = model.rsplit("-", 1)[-1]
    dra.create_template(lab, NAMESPACE, f"fleet-{case}",
                        f"device.attributes['{dra.DRIVER}'].productName == '{name}'")  # fmt: skip
    verdict.expect(f"Running on a copy of {model}, a device of its pool ({name})")
    doc = dra.pod(f"fleet-{case}", fpods.image, f"fleet-{case}")
    pod = fpods.create(fleet.on_fleet(doc, model))
    running = fpods.wait_running(pod, deadline_s=START_S)
    got = dra.allocated(lab, NAMESPACE, running)
    verdict.saw(f"Running on {running.spec.node_name}; {got}")
    assert running.spec.node_name in made[model]
    assert [p for p, _ in got] == [running.spec.node_name]


def test_pods_asking_nvidia_com_gpu_are_placed_on_the_fleet_by_the_driver_class(
    fleet_lab: tuple[Lab, dict[str, list[str]]], fpods: Pods, verdict: Verdict
) -> None:
    """A pod asking `nvidia.com/gpu: 8` (the driver's DeviceClass names that extended
    resource) on copies of the A100 node: the scheduler makes its claim from the class and
    gives it the eight GPUs of one copy."""
    lab, made = fleet_lab
    model = next(m for m in MODELS if len(dra.devices(lab, m)) == 8)
    verdict.expect(f"Running on a copy of {model}; 8 devices of its pool")
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fleet-eight"},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": fpods.image, "imagePullPolicy": "Never",
               "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}  # fmt: skip
    pod = fpods.wait_running(fpods.create(fleet.on_fleet(doc, model)), deadline_s=START_S)
    status = pod.status.extended_resource_claim_status
    claim = dra.api(lab).read_namespaced_resource_claim(status.resource_claim_name, NAMESPACE)
    pools = [r.pool for r in claim.status.allocation.devices.results]
    verdict.saw(f"Running on {pod.spec.node_name}; pools {pools}")
    assert pod.spec.node_name in made[model]
    assert pools == [pod.spec.node_name] * 8


def test_faults_on_live_copies_taint_only_their_devices_and_new_pods_go_elsewhere(
    fleet_lab: tuple[Lab, dict[str, list[str]]], fpods: Pods, verdict: Verdict
) -> None:
    """With a pod holding all eight GPUs of one live copy: an Xid 79 on each of that copy's
    GPUs and one GPU of a second copy lost, injected in their own fake GPUs at once. Their
    drivers taint those copies' devices (NoSchedule: the first's eight with the Xid, the
    second's eight `gpu-lost`, as the driver does on a node, NVML's event wait naming no
    GPU), nothing else in the fleet or the lab; the running pod and its claim stay; a new
    eight-GPU pod goes to the one healthy copy, and another stays Pending, the scheduler
    unable to allocate its claim."""
    lab, made = fleet_lab
    model = LIVE
    selector = f"device.attributes['{dra.DRIVER}'].productName == '{product(lab, model)}'"
    dra.create_template(lab, NAMESPACE, "fleet-faults", selector, count=8)

    def eight(name: str) -> str:
        return fpods.create(fleet.on_fleet(dra.pod(name, fpods.image, "fleet-faults"), model))

    first = fpods.wait_running(eight("fleet-held"), deadline_s=START_S)
    held = first.spec.node_name
    lost, spare = (c for c in made[model] if c != held)
    verdict.expect(f"{held}: 8 devices xid=79:NoSchedule, {lost}: 8 gpu-lost:NoSchedule, "
                   f"no other taint; fleet-held Running on {held} with its claim; the next "
                   f"pod on {spare}, the one after Pending")  # fmt: skip
    for i in range(8):
        fleet.live_state(lab.ctx, model, held).inject_xid(i, 79)
    fleet.live_state(lab.ctx, model, lost).lose(0)

    def tainted() -> dict[str, dict[str, list[str]]]:
        return dra.taints(dra.slices(lab))

    want = {node: {f"gpu-{i}": [f"{dra.DRIVER}/{taint}:NoSchedule"] for i in range(8)}
            for node, taint in ((held, "xid=79"), (lost, "gpu-lost"))}  # fmt: skip
    steps.poll("the live copies' drivers tainting their devices",
               lambda: (tainted() == want, str(tainted())), START_S)  # fmt: skip
    second = fpods.wait_running(eight("fleet-next"), deadline_s=START_S)
    third = eight("fleet-pending")
    reason = fpods.wait_failed_scheduling(third, "cannot allocate all claims")
    still = fpods.get("fleet-held")
    verdict.saw(f"taints {tainted()}; fleet-held {still.status.phase} on {still.spec.node_name} "
                f"with {len(dra.allocated(lab, NAMESPACE, still))} devices; fleet-next on "
                f"{second.spec.node_name}; fleet-pending: {reason}")  # fmt: skip
    assert tainted() == want
    assert still.status.phase == "Running"
    assert sorted(dra.allocated(lab, NAMESPACE, still)) == [(held, f"gpu-{i}") for i in range(8)]
    assert second.spec.node_name == spare
    assert fpods.get(third).spec.node_name is None


# -- MIG inventories


def identical(f: Fleet, verdict: Verdict) -> None:
    """Each copy's slices are its model's, field by field, counters included."""
    ((model, copies),) = f.copies.items()
    want = fleet.slices(f.lab.ctx, model)
    kinds = sorted(
        {d["attributes"]["type"]["string"] for s in want for d in s["spec"].get("devices") or []}
    )  # a counters-only slice has none
    counters = sum(len(s["spec"].get("sharedCounters") or []) for s in want)
    verdict.expect(f"{len(copies)} copies of {model}: {kinds}, {counters} counter sets, no "
                   "field different")  # fmt: skip
    diffs = {c: fleet.differences(want, fleet.slices(f.lab.ctx, c)) for c in copies}
    verdict.saw(f"differences {diffs}")
    assert diffs == {c: [] for c in copies}
    assert "mig" in kinds  # MIG devices were published, and compared


def mig_claim_on_a_copy(f: Fleet, profile: str, verdict: Verdict) -> tuple[str, str]:
    """A pod with a claim for one MIG device of `profile`, tolerating KWOK's taint and
    asking for a copy: (its node, the device it was allocated) once KWOK runs it."""
    ((model, copies),) = f.copies.items()
    verdict.expect(f"Running on a copy of {model} with a {profile} device of its pool; the "
                   "model's own GPUs untouched")  # fmt: skip
    name = "fleet-" + profile.replace(".", "")
    pods = Pods.of(f.lab, NAMESPACE)
    f.lab.ensure_namespace(NAMESPACE)
    dra.create_template(f.lab, NAMESPACE, name, dra.profile_selector(profile),
                        device_class=dra.MIG_CLASS)  # fmt: skip
    try:
        pod = pods.wait_running(pods.create(fleet.on_fleet(dra.pod(name, pods.image, name), model)),
                                deadline_s=START_S)  # fmt: skip
        ((pool, device),) = dra.allocated(f.lab, NAMESPACE, pod)
    finally:
        pods.delete_all()
        dra.delete_claims(f.lab, NAMESPACE)
    verdict.saw(f"Running on {pod.spec.node_name}: {pool}/{device}")
    assert pod.spec.node_name in copies and pool == pod.spec.node_name
    return pool, device


def test_copies_of_a_static_mig_node_publish_its_slices(mig_fleet: Fleet,
                                                        verdict: Verdict) -> None:  # fmt: skip
    identical(mig_fleet, verdict)


def test_a_mig_claim_runs_on_a_copy_of_a_static_mig_node(mig_fleet: Fleet,
                                                         verdict: Verdict) -> None:  # fmt: skip
    _, device = mig_claim_on_a_copy(mig_fleet, "2g.20gb", verdict)
    assert "-mig-" in device


def test_copies_of_a_dynamic_mig_node_publish_its_slices_and_counters(
    dynmig_fleet: Fleet, verdict: Verdict
) -> None:
    identical(dynmig_fleet, verdict)
    ((model, _),) = dynmig_fleet.copies.items()
    assert any(s["spec"].get("sharedCounters") for s in fleet.slices(dynmig_fleet.lab.ctx, model))


def test_a_dynamic_mig_claim_is_allocated_on_a_copy_and_nothing_is_made(
    dynmig_fleet: Fleet, verdict: Verdict
) -> None:
    """A 3g.40gb claim on a copy of the DynamicMIG node: the scheduler picks a placement of
    the copy's (its counters), KWOK runs the pod, and no MIG device is made on the model's
    fake GPUs: only a kubelet plugin makes one, and a copy has none."""
    ((model, _),) = dynmig_fleet.copies.items()
    _, device = mig_claim_on_a_copy(dynmig_fleet, "3g.40gb", verdict)
    layout = mig.layout(dynmig_fleet.lab.fake_gpus(model))
    assert "-mig-3g40gb-" in device
    assert [m.gis for m in layout if m.current or m.gis] == []
