"""A fleet of fake GPU nodes: KWOK nodes (no kubelet, no containers) that are copies of one of
a lab's real GPU nodes, for the real kube-scheduler to place pods across.

Each fleet node is made from its model, a live lab node whose GPUs the lab's fakenvml, and
its plugin or DRA driver, serve: the model's capacity and allocatable (`nvidia.com/gpu`
and every other resource), its labels (GFD's and NFD's among them; its hostname and roles
are the copy's own) and the ResourceSlices its DRA driver published, each with the copy's
node and pool name. Nothing about a board is written here: what a fleet node shows is what
the real plugin or driver showed for that inventory on a real kubelet. `differences`
compares a copy's slices with its model's field by field.

KWOK (sigs.k8s.io/kwok, built by `make infra`) is installed as its docs say: its CRDs, its
chart and its stage-fast chart (nodes Ready at once, pods Running as soon as they are
bound), all read from its module. Fleet nodes carry KWOK's annotation and taint
(`kwok.x-k8s.io/node=fake:NoSchedule`), so only pods that tolerate it land on them, as
KWOK's docs do. DaemonSets that tolerate every taint get a pod there that KWOK runs, as
on a real fleet a node's agents run on each; the lab's own (kube-proxy, NFD's worker) are
kept on the kind nodes (`kindconfig.OFF_FLEET`): they are the lab's, not the fleet's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from clusters import built, steps, versions
from clusters.charts import chart
from clusters.kube import absent_ok
from clusters.labs import dra, kindconfig
from clusters.labs.context import Context
from clusters.labs.spec import NODE_LEASE_S
from fakenvml import inventory
from fakenvml.node import NodeDir

MODULE = "sigs.k8s.io/kwok"
NAMESPACE = "kube-system"  # where KWOK's docs install its controller
CONTROLLER = "kwok-controller"
KUBE_PROXY = ("kube-proxy", "kube-system")  # kind's (kubeadm's) DaemonSet: tolerates all
MANAGED = ("kwok.x-k8s.io/node", "fake")  # the annotation its config manages nodes by
CONFIG_ANNOTATION = f"{kindconfig.LABEL_PREFIX}/kwok-config"  # on KWOK's pod template
# KWOK renews its nodes' Leases with this many workers, each one blocking update at a time
# (its default: 4). A Lease is renewed every quarter of its duration, so 5,000 copies with
# a kubelet's 40 s Lease need 500 updates a second; 4 workers on this 2-core machine
# kept 1,950-2,350 of them Ready and no more (2026-12-07, KWOK at 0.2 cores, the API
# server's answers slow under the load): the workers' round trips were the limit.
LEASE_WORKERS = 32
TAINT = {"key": MANAGED[0], "value": MANAGED[1], "effect": "NoSchedule"}
TOLERATION = {"key": MANAGED[0], "operator": "Equal", "value": MANAGED[1],
              "effect": "NoSchedule"}  # fmt: skip
MODEL = f"{kindconfig.LABEL_PREFIX}/fleet-model"  # a fleet node's annotation: its model
FLEET_LABEL = kindconfig.FLEET_LABEL  # and its label (the model), to select the fleet by
# The model's labels that are its own, not its inventory's: its name and roles, and the
# lab's switches (fake GPUs, plugin on), which would put the lab's own DaemonSets there.
OWN_LABELS = ("kubernetes.io/hostname", "node-role.kubernetes.io/", f"{kindconfig.LABEL_PREFIX}/")
SLICES = ("resource.k8s.io", "v1", "resourceslices")  # group, version, plural
# Live copies: a DRA driver process of their own (`live_pod`), with its own fakenvml state
# in its model's state dir, and its own kubelet plugin dirs and CDI root on the model's
# node, where no kubelet looks (the model's kubelet must not register a copy's driver).
LIVE_STATE = "fleet"  # <model's state dir>/fleet/<copy>
LIVE_NODE_DIR = "/var/lib/gpulab-fleet"  # <this>/<copy>/{plugins_registry,plugins,cdi}
# The driver's hostPaths a live copy gets its own of (the chart's defaults).
KUBELET_DIRS = ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi")
LIVE_LABEL = f"{kindconfig.LABEL_PREFIX}/fleet-node"  # a live driver pod's: the copy it serves
WRITERS = 4  # copies made at once
# What differs between two nodes' slices of one inventory by construction, not by
# content: names, ownership, bookkeeping, and the pool's generation (a counter the driver
# bumps each time it republishes).
VOLATILE_META = ("name", "generateName", "uid", "resourceVersion", "creationTimestamp",
                 "managedFields", "ownerReferences", "generation")  # fmt: skip


def kwok_dir() -> Any:
    where = chart.module_dir(f"{MODULE}@{versions.get('KWOK_VERSION')}")
    if not (where / "charts" / "kwok" / "Chart.yaml").is_file():
        raise built.InfraMissing(f"KWOK's module is not in {where}; {built.MAKE_INFRA}")
    return where


def kwok_docs(image: str, kube_version: str, lease_s: int = NODE_LEASE_S) -> list[dict]:
    """KWOK as its docs install it, from its module: its CRDs, the kwok chart (with the
    local image) and the stage-fast chart; its nodes' Leases last `lease_s` (the chart's
    config file says 40: its ConfigMap is the one place KWOK reads it from, at start),
    renewed by LEASE_WORKERS."""
    where = kwok_dir()
    docs = [yaml.safe_load(p.read_text())
            for p in sorted((where / "kustomize" / "crd" / "bases").glob("*.yaml"))]  # fmt: skip
    repo, tag = chart.split_image(image)
    # The controller on the control plane (its chart tolerates it there), where its image
    # is loaded: the GPU nodes' pods stay the lab's.
    kwok = {"image": {"repository": repo, "tag": tag},
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}  # fmt: skip
    for name, values in (("kwok", kwok), ("stage-fast", {})):
        text = chart.template(built.helm(), where / "charts" / name, "kwok", NAMESPACE,
                              values, kube_version)  # fmt: skip
        docs += [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == CONTROLLER:
            conf = yaml.safe_load(d["data"]["kwok.yaml"])
            conf["options"]["nodeLeaseDurationSeconds"] = lease_s
            conf["options"]["nodeLeaseParallelism"] = LEASE_WORKERS
            d["data"]["kwok.yaml"] = yaml.safe_dump(conf, sort_keys=False)
            config = hashlib.sha256(d["data"]["kwok.yaml"].encode()).hexdigest()[:12]
    for d in docs:
        if d.get("kind") == "Deployment" and d["metadata"]["name"] == CONTROLLER:
            # A changed config restarts the controller (it reads the file once).
            meta = d["spec"]["template"].setdefault("metadata", {})
            meta.setdefault("annotations", {})[CONFIG_ANNOTATION] = config
    return docs


def deploy_kwok(ctx: Context) -> None:
    """KWOK's controller running on the control plane (its image loaded there)."""
    image = built.require(["kwok"], ctx.lab.kubernetes).images["kwok"]
    ctx.host.load([image], [ctx.lab.control_plane.name])
    lease = int(ctx.lab.spec.fleet_node_lease)
    ctx.kube.apply_all(kwok_docs(image, ctx.lab.kubernetes, lease), NAMESPACE)
    ctx.kube.wait_deployment(CONTROLLER, NAMESPACE)
    proxy = ctx.apps.read_namespaced_daemon_set(*KUBE_PROXY)
    # Once: a patch rolls its pods (3 s on an idle lab), not waited for. The DaemonSet
    # controller places pods by the template it has now, so no copy made from here on
    # gets one, and the rules of a kube-proxy being replaced stay in its node's tables.
    if proxy.spec.template.spec.affinity is None:
        ctx.apps.patch_namespaced_daemon_set(
            *KUBE_PROXY, {"spec": {"template": {"spec": {"affinity": kindconfig.OFF_FLEET}}}}
        )


def on_fleet(doc: dict, model: str) -> dict:
    """A pod spec that tolerates KWOK's taint and asks for a copy of `model`."""
    doc["spec"]["tolerations"] = [TOLERATION]
    doc["spec"]["nodeSelector"] = {FLEET_LABEL: model}
    return doc


def names(model: str, count: int) -> list[str]:
    return [f"{model}-kwok-{i}" for i in range(count)]


def node_doc(model: client.V1Node, name: str) -> dict:
    """A KWOK node that shows what `model` shows."""
    labels = {k: v for k, v in (model.metadata.labels or {}).items()
              if not k.startswith(OWN_LABELS)}  # fmt: skip
    labels |= {"kubernetes.io/hostname": name, FLEET_LABEL: model.metadata.name}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {MANAGED[0]: MANAGED[1], MODEL: model.metadata.name}},
        "spec": {"taints": [TAINT]},
        "status": {"capacity": dict(model.status.capacity or {}),
                   "allocatable": dict(model.status.allocatable or {})},
    }  # fmt: skip


def slices(ctx: Context, node: str | None = None) -> list[dict]:
    """The DRA driver's ResourceSlices (for `node` only, if given), as the API server serves
    them: raw JSON, not the client library's models, which drop any field their version
    does not know (a copy would lose it, and a comparison through them would not see it)."""
    fields = f"spec.driver={dra.DRIVER}" + (f",spec.nodeName={node}" if node else "")
    found = client.CustomObjectsApi(ctx.kube.api).list_cluster_custom_object(
        *SLICES, field_selector=fields)  # fmt: skip
    return list(found["items"])


def slice_doc(model_slice: dict, node: client.V1Node, index: int) -> dict:
    """`model_slice` published for `node` instead: its node and pool, owned by the node (so
    its slices go with it, as a kubelet's do)."""
    spec = copy.deepcopy(model_slice["spec"])
    model = spec["nodeName"]
    if spec["pool"]["name"] != model:
        raise steps.StepError(f"a ResourceSlice of {model} is in pool {spec['pool']['name']}, "
                              f"not one named after its node: cannot copy it")  # fmt: skip
    spec["nodeName"] = spec["pool"]["name"] = node.metadata.name
    owner = {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name,
             "uid": node.metadata.uid, "controller": True}  # fmt: skip
    name = f"{node.metadata.name}-{spec['driver'].replace('.', '-')}-{index}"
    return {"apiVersion": "/".join(SLICES[:2]), "kind": "ResourceSlice",
            "metadata": {"name": name, "ownerReferences": [owner]}, "spec": spec}  # fmt: skip


def live_state(ctx: Context, model: str, name: str) -> NodeDir:
    """The fake GPUs of the live copy `name` (host side: inject here, its driver sees it)."""
    return NodeDir(ctx.fake_gpus(model).path / LIVE_STATE / name)


def live_pod(template: dict, model: str, name: str) -> dict:
    """NVIDIA's DRA driver serving the KWOK node `name` from `model`'s node: its
    DaemonSet's own pod template (`template`, as the API server serves it), bound to the
    model's node, with NODE_NAME the copy's, the copy's fakenvml state
    (FAKENVML_STATE_DIR, in the driver root's state mount) and its own kubelet plugin
    dirs and CDI root. Its labels are not the DaemonSet's, which would adopt the pod and
    delete it as one too many on that node."""
    pod = copy.deepcopy(template)
    state = f"{dra.CONTAINER_DRIVER_ROOT}{kindconfig.NODE_STATE_DIR}/{LIVE_STATE}/{name}"
    spec = pod["spec"]
    spec["nodeName"] = model
    spec.pop("affinity", None)
    for c in spec.get("initContainers", []) + spec["containers"]:
        env = [e for e in c.get("env", []) if e["name"] != "NODE_NAME"]
        c["env"] = [*env, {"name": "NODE_NAME", "value": name},
                    {"name": "FAKENVML_STATE_DIR", "value": state}]  # fmt: skip
    for v in spec["volumes"]:
        path = (v.get("hostPath") or {}).get("path", "")
        for own in KUBELET_DIRS:
            if path == own:
                v["hostPath"] = {"path": f"{LIVE_NODE_DIR}/{name}/{Path(own).name}",
                                 "type": "DirectoryOrCreate"}  # fmt: skip
    meta = pod.get("metadata") or {}
    pod["metadata"] = {"name": f"{name}-driver", "namespace": dra.NAMESPACE,
                       "labels": {LIVE_LABEL: name, FLEET_LABEL: model},
                       "annotations": meta.get("annotations") or {}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", **pod}


# A fleet step still going after this long says how far it is, one line at a time: a CI
# log or a file has no spinner, and 5,000 copies took ten minutes without a word.
PROGRESS_S = 30.0


def progress(ctx: Context, what: str, every_s: float = PROGRESS_S) -> Callable[[str], None]:
    """A reporter for a long step: say(seen) prints "<lab>: <what>: <seen> (<s>)" on the
    lab's console when `every_s` has passed since the step began or its last line; safe
    from the step's threads."""
    t0 = time.monotonic()
    last = [t0]
    lock = threading.Lock()

    def say(seen: str) -> None:
        now = time.monotonic()
        with lock:
            if now - last[0] < every_s:
                return
            last[0] = now
        ctx.console.print(f"[dim]…[/] {ctx.name}: {what}: {seen} [dim]({now - t0:.0f}s)[/]",
                          highlight=False)  # fmt: skip

    return say


def up(ctx: Context, model: str, count: int, live: int = 0) -> list[str]:
    """Exactly `count` KWOK copies of the lab node `model` (made, or the extra ones
    deleted), Ready, their slices published; their names. KWOK is deployed first. The
    first `live` copies get a DRA driver process of their own (`live_pod`) that publishes
    their slices from their own fake GPUs (faults injected there reach them as on a real
    node); the others get the model's slices copied."""
    if model not in {n.name for n in ctx.lab.gpu_nodes}:
        have = ", ".join(n.name for n in ctx.lab.gpu_nodes) or "none"
        raise steps.StepError(f"lab {ctx.lab.name} has no GPU node {model!r} to copy "
                              f"(its GPU nodes: {have})")  # fmt: skip
    if not 0 <= live <= count:
        raise steps.StepError(f"{live} live copies of {count}: 0 to {count}")
    made = names(model, count)
    lives = set(made[:live])
    # A copy that is to change between live and copied is made again.
    running = live_copies(ctx)
    delete(ctx, [n for n in members(ctx, model) if n not in made or (n in lives) != (n in running)])
    if not made:
        return []
    deploy_kwok(ctx)  # applied again each time: a KWOK of another spec is replaced
    source = ctx.kube.core.read_node(model)
    published = sorted(slices(ctx, model), key=lambda s: s["metadata"]["name"])
    existing = set(members(ctx, model))
    template: dict = {}
    if lives:
        ds = ctx.apps.read_namespaced_daemon_set(dra.DAEMONSET, dra.NAMESPACE)
        template = ctx.kube.api.sanitize_for_serialization(ds.spec.template)
        node = next(n for n in ctx.lab.gpu_nodes if n.name == model)

    def make(name: str) -> None:
        ctx.kube.apply(node_doc(source, name))
        if name in lives:
            if name not in existing:  # a running one keeps its GPUs' state and its driver
                live_state(ctx, model, name).init(inventory.from_dict(node.inventory, name))
                ctx.kube.apply(live_pod(template, model, name), namespace=dra.NAMESPACE)
            return
        node_obj = ctx.kube.core.read_node(name)
        for i, s in enumerate(published):
            ctx.kube.apply(slice_doc(s, node_obj, i))

    # A few at a time: each is three round trips or more, and the API server has cores
    # to spare for them (one at a time, 500 copies took over 4 minutes on 2 cores).
    say = progress(ctx, f"KWOK copies of {model}")
    with ThreadPoolExecutor(WRITERS) as pool:
        for i, _ in enumerate(pool.map(make, made), 1):
            say(f"{i}/{len(made)} made")
    wait_ready(ctx, made)
    if lives:
        wait_live(ctx, sorted(lives), len(published))
    return made


def up_spec(ctx: Context) -> dict[str, list[str]]:
    """The fleet the lab's spec declares (its GPU nodes' `fleet:`), each node's copies made
    as `up` makes them; the copies by model."""
    return {model: up(ctx, model, f.copies, live=f.live) for model, f in ctx.lab.fleet.items()}


def live_copies(ctx: Context) -> set[str]:
    """The fleet nodes a driver of their own serves (pods of the live copies' label)."""
    pods = ctx.kube.core.list_namespaced_pod(dra.NAMESPACE, label_selector=LIVE_LABEL).items
    return {p.metadata.labels[LIVE_LABEL] for p in pods}


def wait_live(ctx: Context, nodes: list[str], per_node: int, timeout_s: float = 180) -> None:
    """Until each live copy's driver has published its `per_node` slices."""

    def published() -> tuple[bool, str]:
        have = Counter(s["spec"].get("nodeName") for s in slices(ctx))
        done = sum(1 for n in nodes if have[n] >= per_node)
        return done == len(nodes), f"{done}/{len(nodes)} live copies' slices published"

    steps.poll("the live copies' drivers publishing", published, timeout_s, interval_s=1)


def is_ready(node: dict) -> bool:
    """Whether a Node, as the API server's JSON, is Ready."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def listed(ctx: Context, selector: str = FLEET_LABEL, cached: bool = False) -> list[dict]:
    """The fleet's Nodes as the API server's JSON: the client's models took seconds of a
    core per list at a few thousand nodes. `cached`: from its watch cache (resourceVersion
    0), for polls that need no read of etcd."""
    resp = ctx.kube.core.list_node(label_selector=selector, _preload_content=False,
                                   **({"resource_version": "0"} if cached else {}))  # fmt: skip
    return json.loads(resp.data)["items"]


def wait_ready(ctx: Context, nodes: list[str], stall_s: float = 120) -> None:
    """Until KWOK has made every one of `nodes` Ready; StepError once none more has
    become Ready for `stall_s` (KWOK readies a big fleet at its own pace: 881 of 1,000
    new copies in their first 120 s on 2 cores, the API server busy)."""
    want, best, since = set(nodes), -1, time.monotonic()
    say = progress(ctx, f"KWOK copies {nodes[0]}..{nodes[-1]}")

    def ready() -> tuple[bool, str]:
        nonlocal best, since
        found = listed(ctx, cached=True)
        ok = sum(1 for n in found if n["metadata"]["name"] in want and is_ready(n))
        say(f"{ok}/{len(nodes)} Ready")
        if ok > best:
            best, since = ok, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise steps.StepError(f"KWOK nodes {nodes[0]}..{nodes[-1]}: {ok}/{len(nodes)} "
                                  f"Ready, none more for {stall_s:.0f}s")  # fmt: skip
        return ok == len(nodes), f"{ok}/{len(nodes)} Ready"

    # The deadline only bounds a fleet that keeps becoming Ready: a second a node and more.
    # Listed every 2 s, and less often for thousands (each list is every node, ~5 KB each).
    steps.poll(f"KWOK nodes {nodes[0]}..{nodes[-1]} Ready", ready,
               stall_s + len(nodes), interval_s=max(2.0, len(nodes) / 250))  # fmt: skip


def members(ctx: Context, model: str | None = None) -> list[str]:
    """The lab's fleet nodes (copies of `model` only, if given)."""
    found = listed(ctx, f"{FLEET_LABEL}={model}" if model else FLEET_LABEL)
    return sorted(n["metadata"]["name"] for n in found)


def down(ctx: Context) -> None:
    """Every fleet node deleted (KWOK stays)."""
    delete(ctx, members(ctx))


def delete(ctx: Context, nodes: list[str]) -> None:
    """The fleet nodes deleted, with their slices and the pods bound to them (no kubelet is
    there to let them go). The slices are deleted outright rather than left to the garbage
    collector (their owner is the node): the next fleet may reuse the names at once."""

    core = ctx.kube.core

    def remove(name: str) -> None:
        # A live copy's driver first: it would publish its slices again. A pod may go
        # between the list and its delete (its DaemonSet's controller, the collector).
        for pod in core.list_namespaced_pod(
                dra.NAMESPACE, label_selector=f"{LIVE_LABEL}={name}").items:  # fmt: skip
            absent_ok(core.delete_namespaced_pod, pod.metadata.name, dra.NAMESPACE,
                      grace_period_seconds=0)  # fmt: skip
        for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
            absent_ok(core.delete_namespaced_pod, pod.metadata.name, pod.metadata.namespace,
                      grace_period_seconds=0)  # fmt: skip
        absent_ok(core.delete_node, name)
        dra.api(ctx).delete_collection_resource_slice(field_selector=f"spec.nodeName={name}")

    say = progress(ctx, "fleet nodes deleted")
    with ThreadPoolExecutor(WRITERS) as pool:
        for i, _ in enumerate(pool.map(remove, nodes), 1):
            say(f"{i}/{len(nodes)}")
    gone = set(nodes)

    def cleared() -> tuple[bool, str]:
        left = sum(1 for s in slices(ctx) if s["spec"].get("nodeName") in gone)
        return left == 0, f"{left} slices of deleted fleet nodes left"

    if nodes:
        steps.poll("fleet nodes' slices gone", cleared, 60)


# -- comparing slices


def normal(found: list[dict]) -> list[dict]:
    """Slices as two nodes of one inventory should publish them alike: node and pool name
    blanked, bookkeeping dropped, devices in name order, slices in their devices' order."""
    out = []
    for s in found:
        spec = copy.deepcopy(s["spec"])
        spec["nodeName"] = spec["pool"]["name"] = "<node>"
        spec["pool"].pop("generation", None)
        spec["devices"] = sorted(spec.get("devices") or [], key=lambda d: d["name"])
        meta = {k: v for k, v in s["metadata"].items() if k not in VOLATILE_META}
        out.append({"metadata": meta, "spec": spec})
    return sorted(out, key=lambda s: json.dumps(s["spec"]["devices"], sort_keys=True))


def differences(want: list[dict], got: list[dict]) -> list[str]:
    """Where `got`'s slices differ from `want`'s (both as `normal` makes them), one line
    per differing field: `path: want -> got`."""
    return list(_diff("slices", normal(want), normal(got)))


def _diff(path: str, a: Any, b: Any) -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _diff(f"{path}.{k}", a.get(k, "<absent>"), b.get(k, "<absent>"))
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: {len(a)} items -> {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _diff(f"{path}[{i}]", x, y)
    elif a != b:
        yield f"{path}: {a!r} -> {b!r}"
