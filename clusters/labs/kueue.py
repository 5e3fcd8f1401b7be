"""Kueue (sigs.k8s.io/kueue), the batch queue users run above the scheduler, on a lab: its
chart from its Go module with the controller manager's image built here, and the objects
a GPU quota is made of.

A ResourceFlavor per GPU product, read from GFD's `nvidia.com/gpu.product` label on the
nodes it is for (a lab's fleet: KWOK copies of its GPU nodes), so a flavor is what the
plugin or driver showed for that board; each tolerates KWOK's taint, which Kueue adds to
the pods it admits on that flavor. A ClusterQueue holds a quota of `nvidia.com/gpu` per
flavor; a LocalQueue in a namespace points at it; Jobs name the LocalQueue and are created
suspended, for Kueue to admit within quota and leave the rest queued.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from clusters import built, steps, versions
from clusters.charts import chart
from clusters.kube import absent_ok, or_none
from clusters.labs import fleet
from clusters.labs.context import Context

MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"  # its chart's documented release namespace
RELEASE = "kueue"
CONTROLLER = "kueue-controller-manager"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRODUCT = "nvidia.com/gpu.product"  # GFD's label: a flavor's board
GPU = "nvidia.com/gpu"


def module_dir() -> Path:
    where = chart.module_dir(f"{MODULE}@{versions.get('KUEUE_VERSION')}")
    if not (where / "charts" / "kueue" / "Chart.yaml").is_file():
        raise built.InfraMissing(f"Kueue's module is not in {where}; build its image first "
                                 "(gpulab infra kueue)")  # fmt: skip
    return where


def image(ctx: Context) -> str:
    """Kueue's image, as `make infra` recorded it (InfraMissing, one line, if it did not)."""
    return built.require(("kueue",), ctx.lab.kubernetes, ctx.lab.kubelet).images["kueue"]


def docs(image: str, kube_version: str, qps: int | None = None) -> list[dict]:
    """Kueue's chart, rendered with the local image, its manager on the control plane
    (where its image is loaded; the GPU nodes' pods stay the lab's). `qps`: its client's
    requests a second (burst twice that) instead of its config's 50 (burst 100)."""
    repo, tag = chart.split_image(image)
    manager: dict[str, Any] = {
        "manager": {"image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"}},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                         "operator": "Exists", "effect": "NoSchedule"}],
    }  # fmt: skip
    values: dict[str, Any] = {"controllerManager": manager}
    where = module_dir() / "charts" / "kueue"
    if qps is not None:
        # The chart's config is one YAML string: its own, with the client's limits changed.
        config_text = yaml.safe_load((where / "values.yaml").read_text())["managerConfig"][
            "controllerManagerConfigYaml"]  # fmt: skip
        config = yaml.safe_load(config_text)
        config["clientConnection"] = {"qps": qps, "burst": 2 * qps}
        values["managerConfig"] = {"controllerManagerConfigYaml": yaml.safe_dump(config)}
    text = chart.template(built.helm(), where, RELEASE, NAMESPACE, values, kube_version)
    return [d for d in yaml.safe_load_all(text) if d]


def install(ctx: Context, image: str, qps: int | None = None) -> None:
    """Kueue running (`qps`: docs'), its CRDs first, the rest in its namespace."""
    ctx.host.load([image], [ctx.lab.control_plane.name])
    ctx.kube.ensure_namespace(NAMESPACE)
    ctx.kube.apply_all(docs(image, ctx.lab.kubernetes, qps), NAMESPACE)
    ctx.kube.wait_deployment(CONTROLLER, NAMESPACE)


def uninstall(ctx: Context, image: str) -> None:
    """Everything the chart made, gone: Kueue's own objects first, while it runs to take
    their finalizers off (a CRD with objects left terminates forever); then its webhooks
    (failurePolicy Fail: they would refuse the lab's Jobs with no server behind them) and
    its aggregated API; its CRDs last, waited out (a new install's objects are refused
    while they terminate)."""
    rendered = docs(image, ctx.lab.kubernetes)
    crds = [d for d in rendered if d["kind"] == "CustomResourceDefinition"]
    purge(ctx, crds)
    first = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService")
    crd = "CustomResourceDefinition"
    for doc in sorted(rendered, key=lambda d: (d["kind"] not in first, d["kind"] == crd)):
        ctx.kube.delete(doc, namespace=NAMESPACE)
    api = client.ApiextensionsV1Api(ctx.kube.api)
    names = {d["metadata"]["name"] for d in crds}

    def gone() -> tuple[bool, str]:
        left = names & {c.metadata.name for c in api.list_custom_resource_definition().items}
        return not left, f"{len(left)} CRDs left: {', '.join(sorted(left)[:3])}"

    steps.poll("Kueue's CRDs gone", gone, 120)


def purge(ctx: Context, crds: list[dict], deadline_s: float = 120) -> None:
    """Every object of these CRDs deleted and gone. With Kueue running it takes their
    finalizers off; without it (a run cut short) nobody would, so gpulab does."""
    api = custom(ctx)
    kinds = [(c["spec"]["group"], next(v["name"] for v in c["spec"]["versions"] if v["storage"]),
              c["spec"]["names"]["plural"]) for c in crds]  # fmt: skip

    def left() -> list[tuple[str, str, str, dict]]:
        found = []
        for g, v, plural in kinds:
            listed = or_none(api.list_cluster_custom_object, g, v, plural)
            found += [(g, v, plural, o) for o in (listed or {}).get("items", [])]
        return found

    def each(what: str, objs: list[tuple[str, str, str, dict]]) -> None:
        for g, v, plural, o in objs:
            name, ns = o["metadata"]["name"], o["metadata"].get("namespace")
            if what == "delete" and ns:
                absent_ok(api.delete_namespaced_custom_object, g, v, ns, plural, name)
            elif what == "delete":
                absent_ok(api.delete_cluster_custom_object, g, v, plural, name)
            elif ns:
                absent_ok(api.patch_namespaced_custom_object, g, v, ns, plural, name, UNFINALIZE)
            else:
                absent_ok(api.patch_cluster_custom_object, g, v, plural, name, UNFINALIZE)

    def none() -> tuple[bool, str]:
        objs = left()
        return not objs, f"{len(objs)} left"

    each("delete", left())
    controller = or_none(ctx.kube.apps.read_namespaced_deployment, CONTROLLER, NAMESPACE)
    running = bool(controller and controller.status.available_replicas)
    try:
        steps.poll("Kueue's objects gone", none, deadline_s if running else 0)
    except steps.StepError:
        each("unfinalize", left())
        steps.poll("Kueue's objects gone, their finalizers taken off", none, 30)


UNFINALIZE = {"metadata": {"finalizers": None}}


def custom(ctx: Context) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(ctx.kube.api)


def create(ctx: Context, doc: dict, deadline_s: float = 60) -> None:
    """One Kueue object created, through its webhooks: a webhook whose server has just
    started may refuse for a moment (its certificates are made at start), so retried."""

    def made() -> tuple[bool, str]:
        try:
            plural = doc["kind"].lower() + "s"
            ns = doc["metadata"].get("namespace")
            if ns:
                custom(ctx).create_namespaced_custom_object(GROUP, VERSION, ns, plural, doc)
            else:
                custom(ctx).create_cluster_custom_object(GROUP, VERSION, plural, doc)
        except client.ApiException as e:
            if e.status == 409:
                return True, "there"
            if e.status in (500, 503):  # "failed calling webhook": not serving yet
                return False, f"{e.status}: {e.reason}"
            raise
        return True, "made"

    steps.poll(f"{doc['kind']} {doc['metadata']['name']}", made, deadline_s)


# -- what a GPU quota is made of


def flavor_name(product: str) -> str:
    """A flavor's name for a GFD product (`NVIDIA-A100-SXM4-80GB` -> `nvidia-a100-sxm4-80gb`)."""
    return re.sub(r"[^a-z0-9-]+", "-", product.lower()).strip("-")


def products(nodes: Iterable[client.V1Node]) -> dict[str, int]:
    """The GPU products GFD labelled these nodes with, each with its GPUs in their capacity
    or, for a DRA node, its devices' count label (`nvidia.com/gpu.count`)."""
    found: dict[str, int] = {}
    for n in nodes:
        labels = n.metadata.labels or {}
        if PRODUCT not in labels:
            continue
        count = int(labels.get("nvidia.com/gpu.count") or (n.status.capacity or {}).get(GPU, 0))
        found[labels[PRODUCT]] = found.get(labels[PRODUCT], 0) + count
    return found


def resource_flavor(product: str) -> dict:
    """The nodes GFD says have `product`; KWOK's taint tolerated (a fleet's nodes)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": flavor_name(product)},
            "spec": {"nodeLabels": {PRODUCT: product},
                     "tolerations": [fleet.TOLERATION]}}  # fmt: skip


def cluster_queue(name: str, quotas: dict[str, int]) -> dict:
    """A quota of GPUs per product (flavor), in the order given: Kueue tries them in turn."""
    flavors = [{"name": flavor_name(p), "resources": [{"name": GPU, "nominalQuota": q}]}
               for p, q in quotas.items()]  # fmt: skip
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {},  # every namespace
                     "resourceGroups": [{"coveredResources": [GPU],
                                         "flavors": flavors}]}}  # fmt: skip


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}}  # fmt: skip


def job(name: str, queue: str, image: str, gpus: int = 1,
        command: list[str] | None = None) -> dict:  # fmt: skip
    """A one-pod Job asking `gpus` of `nvidia.com/gpu`, queued in `queue`, created
    suspended (Kueue unsuspends it when it admits it); the flavor Kueue picks adds the
    product. With no `command` its pod may go to fleet nodes only (KWOK runs it, and
    completes it as a Job's); with one it runs on a kubelet's node."""
    container: dict[str, Any] = {"name": "work", "image": image,
                                 "resources": {"limits": {GPU: str(gpus)}}}  # fmt: skip
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if command is None:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": fleet.FLEET_LABEL, "operator": "Exists"}]}]}}}  # fmt: skip
    else:
        container["command"] = command
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "template": {"spec": pod}}}  # fmt: skip


def admitted_flavor(workload: dict) -> str | None:
    """The flavor Kueue admitted a Workload's GPUs on, None while it is not admitted."""
    admission = (workload.get("status") or {}).get("admission") or {}
    for ps in admission.get("podSetAssignments") or []:
        flavor = (ps.get("flavors") or {}).get(GPU)
        if flavor:
            return flavor
    return None


def condition(workload: dict, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])  # fmt: skip
