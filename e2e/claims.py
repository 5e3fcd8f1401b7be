"""Workloads on a DRA lab: ResourceClaimTemplates, pods that use claims, what a claim was
given, and the devices' taints, as NVIDIA's DRA driver publishes them.

    claims.create_template(lab, ns, "t4", "device.attributes['gpu.nvidia.com'].productName == 'Tesla T4'")
    pods.create(claims.pod("job", pods.image, template="t4"))
    claims.allocated(lab, ns, pods.get("job"))       # [(node pool, device name)]
"""  # noqa: E501

from __future__ import annotations

from typing import TYPE_CHECKING

from kubernetes import client

from clusters import dra

if TYPE_CHECKING:
    from clusters.lab import Lab

CLAIM = "gpu"  # the name a pod gives its one claim (pod.spec.resourceClaims[].name)


def request(selector: str | None = None, count: int = 1,
            device_class: str = dra.DEVICE_CLASS) -> dict:  # fmt: skip
    """A claim spec: `count` devices of `device_class` (whole GPUs unless named), matching
    the CEL `selector`."""
    exactly: dict = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def create_template(lab: Lab, namespace: str, name: str, selector: str | None = None,
                    count: int = 1, device_class: str = dra.DEVICE_CLASS) -> None:  # fmt: skip
    """A ResourceClaimTemplate `name` (made again if one is left from an earlier run). Give
    each selector a name of its own: the claim controller makes claims from its cached copy,
    which can still hold the template deleted a moment ago under the same name."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": request(selector, count, device_class)}}  # fmt: skip
    api = dra.api(lab)
    try:
        api.delete_namespaced_resource_claim_template(name, namespace)
    except client.ApiException as e:
        if e.status != 404:
            raise
    api.create_namespaced_resource_claim_template(namespace, body)


def delete_all(lab: Lab, namespace: str) -> None:
    """Every claim and claim template in `namespace` (claims made from templates go with
    their pods; shared ones and templates stay until this)."""
    api = dra.api(lab)
    api.delete_collection_namespaced_resource_claim(namespace)
    api.delete_collection_namespaced_resource_claim_template(namespace)


def pod(name: str, image: str, template: str | None = None, claim: str | None = None) -> dict:
    """A workload pod whose container uses one ResourceClaim: made from `template` for this
    pod, or the existing `claim` (shared)."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": CLAIM, **source}],
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "resources": {"claims": [{"name": CLAIM}]}}]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def use_claim(doc: dict, template: str) -> dict:
    """A device-plugin pod spec (e2e/specs) turned into one that uses a claim from
    `template`: its extended-resource GPU requests go (a DRA node has none to give)."""
    spec = doc["spec"]
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for amounts in (c.get("resources") or {}).values():
            for r in [r for r in amounts or {} if r.endswith("/gpu")]:
                del amounts[r]
    spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template}]
    first = spec["containers"][0].setdefault("resources", {})
    first["claims"] = [{"name": CLAIM}]
    return doc


def allocated(lab: Lab, namespace: str, p: client.V1Pod) -> list[tuple[str, str]]:
    """(node pool, device) of every device the pod's first claim was allocated: the claim
    made from its template (named in the pod's status), or the one it names. Empty while
    it is not allocated."""
    made = {s.name: s.resource_claim_name for s in p.status.resource_claim_statuses or []}
    ref = p.spec.resource_claims[0]
    name = made.get(ref.name) or ref.resource_claim_name
    if not name:
        return []
    claim = dra.api(lab).read_namespaced_resource_claim(name, namespace)
    if claim.status is None or claim.status.allocation is None:
        return []
    return [(r.pool, r.device) for r in claim.status.allocation.devices.results]


def taint_text(t: client.V1DeviceTaint) -> str:
    """`key=value:effect`, as kubectl writes node taints."""
    return f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}"


def taints(slices: list[client.V1ResourceSlice]) -> dict[str, dict[str, list[str]]]:
    """node -> device -> its taints (`taint_text`), for the devices that have any."""
    out: dict[str, dict[str, list[str]]] = {}
    for s in slices:
        for d in s.spec.devices or []:
            if d.taints:
                out.setdefault(s.spec.node_name, {})[d.name] = [taint_text(t) for t in d.taints]
    return out
