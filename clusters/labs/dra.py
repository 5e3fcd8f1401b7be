"""NVIDIA's DRA driver for GPUs (sigs.k8s.io/dra-driver-nvidia-gpu) in a lab, installed the
way its docs say: its own Helm chart, from the release's Go module, as a real Helm release.
A lab spec with `dra:` gets it instead of a device plugin (the chart refuses to run beside
one: both would serve the node's GPUs).

What the driver needs besides NVML, and where the lab gives it (docs/dra-driver.md has the
evidence for each):
- a driver root with libnvidia-ml.so.1, a regular-file nvidia-smi that runs, the
  versioned library and /dev/nvidia<minor> character devices: the fake-gpus chart's
  `fakenvml install-driver` into /run/fakenvml/driver (nvidiaDriverRoot);
- /usr/bin/nvidia-cdi-hook in its image (copied to the host for the CDI specs it writes):
  built from the nvidia-container-toolkit its go.mod requires;
- containerd with CDI (the node image's), resource.k8s.io/v1 (Kubernetes >= 1.34) and,
  for health as device taints, DRADeviceTaints (GA in 1.37) and the driver's own
  NVMLDeviceHealthCheck gate (alpha, off by default: the lab turns it on);
- nodes it may run on: its default affinity wants NFD's NVIDIA PCI labels or the GPU
  operator's nvidia.com/gpu.present, which a fake host has neither of; the lab points it
  at its own gpulab.dev/fake-gpus label instead.
Compute domains (IMEX over NVLink fabric) are turned off: they need a fabric manager.

MIG claims (static, and DynamicMIG's): preparing one reads the MIG device's two capability
files at /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<N>[/ci<M>]/access (a path fixed
in the binary) and the nvidia-caps major from /proc/devices. On a GPU host the kernel shows
both in every container's /proc; here the fake driver root holds them (`fakenvml
install-driver`), and gpulab's driver image runs the unchanged binary behind a wrapper of
its name (clusters/infra/images/dra-kubelet-plugin.sh) that bind-mounts the root's proc/driver
over /proc/driver and points the driver's own ALT_PROC_DEVICES_PATH at the root's
proc/devices: whoever installs the chart (a lab, the driver's own suite) gets it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client

from clusters import built, versions
from clusters.charts import chart
from clusters.kube import Kube, absent_ok
from clusters.labs import actions, kindconfig, spec
from clusters.labs.actions import Action
from clusters.labs.context import Context
from clusters.labs.serving import Serving
from clusters.subjects.subject import Logs
from fakenvml import mig
from fakenvml.model import Gpu

MODULE = "sigs.k8s.io/dra-driver-nvidia-gpu"
CHART_DIR = "deployments/helm/dra-driver-nvidia-gpu"
RELEASE = NAMESPACE = "nvidia-dra-driver-gpu"  # as in the driver's install docs
DRIVER = "gpu.nvidia.com"  # its driver name: ResourceSlices, DeviceClass, taint keys
DEVICE_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"  # the chart's class for its type 'mig' devices
DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"  # <chart name>-kubelet-plugin
POD_LABELS = "dra-driver-nvidia-gpu-component=kubelet-plugin"  # its pods' selector
CONTAINER = "gpus"  # the kubelet plugin's container (the chart's `gpus` resources)
CONTAINER_DRIVER_ROOT = "/driver-root"  # where the chart mounts nvidiaDriverRoot


def version() -> str:
    return versions.get("DRA_DRIVER_VERSION")


def chart_dir() -> Path:
    where = chart.module_dir(f"{MODULE}@{version()}") / CHART_DIR
    if not (where / "Chart.yaml").is_file():
        raise built.InfraMissing(f"the DRA driver's chart is not in {where}; {built.MAKE_INFRA}")
    return where


def values(image: str, feature_gates: dict[str, bool], library: str = "") -> dict[str, Any]:
    """The chart's values. `library`: the gpulab image whose fakenvml the driver root holds,
    as a pod annotation, so a new library rolls the kubelet plugins (a running one keeps
    the library it loaded: a lab reused after `make infra` tested the old one)."""
    repo, tag = chart.split_image(image)
    # The lab's fake-GPU nodes where the plugin label is on (as a device plugin's DaemonSet
    # selects): DraDriver.set_on stops and starts it on one node.
    on = [{"key": f"{kindconfig.LABEL_PREFIX}/{label}", "operator": "In", "values": ["true"]}
          for label in ("fake-gpus", "plugin")]  # fmt: skip
    plugin: dict[str, Any] = {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": on}]}}}}  # fmt: skip
    if library:
        plugin["podAnnotations"] = {f"{kindconfig.LABEL_PREFIX}/fakenvml": library}
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "nvidiaDriverRoot": kindconfig.DRIVER_ROOT,
        # The chart's guard against running beside a device plugin: the lab runs none.
        "gpuResourcesEnabledOverride": True,
        "resources": {"computeDomains": {"enabled": False}},
        "featureGates": {k: str(v).lower() for k, v in feature_gates.items()},
        "kubeletPlugin": plugin,
    }


def install(kubeconfig: Path, image: str, feature_gates: dict[str, bool], library: str = "",
            timeout_s: int = 240) -> str:  # fmt: skip
    return chart.install(built.helm(), chart_dir(), RELEASE, NAMESPACE,
                         values(image, feature_gates, library), kubeconfig,
                         timeout_s)  # fmt: skip


class Cluster(Protocol):
    """A lab's API server seam: a Context, or the Lab a suite holds."""

    @property
    def kube(self) -> Kube: ...


def api(lab: Cluster) -> client.ResourceV1Api:
    return client.ResourceV1Api(lab.kube.api)


def slices(lab: Cluster, node: str | None = None) -> list[client.V1ResourceSlice]:
    """The driver's ResourceSlices (of `node` only, if given)."""
    fields = f"spec.driver={DRIVER}" + (f",spec.nodeName={node}" if node else "")
    return api(lab).list_resource_slice(field_selector=fields).items


def devices(lab: Cluster, node: str) -> dict[str, client.V1Device]:
    """The node's published devices by name."""
    return {d.name: d for s in slices(lab, node) for d in s.spec.devices or []}


def attribute(device: client.V1Device, name: str) -> object:
    """An attribute's value, whatever its type (string, int, bool, version)."""
    a = (device.attributes or {}).get(name)
    if a is None:
        return None
    return next((v for v in (a.string, a.int, a.bool, a.version) if v is not None), None)


# -- workloads: claims (a pod's spec.resourceClaims), what a claim was given, taints
#
#    dra.create_template(lab, ns, "t4", "device.attributes['gpu.nvidia.com'].productName"
#                        " == 'Tesla T4'")
#    pods.create(dra.pod("job", pods.image, template="t4"))
#    dra.allocated(lab, ns, pods.get("job"))       # [(node pool, device name)]

CLAIM = "gpu"  # the name a pod gives its one claim (pod.spec.resourceClaims[].name)


def request(selector: str | None = None, count: int = 1, device_class: str = DEVICE_CLASS,
            same: str | None = None) -> dict:  # fmt: skip
    """A claim spec: `count` devices of `device_class` (whole GPUs unless named), matching
    the CEL `selector`, all with one value of the attribute `same` if given."""
    exactly: dict = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if same:
        devices["constraints"] = [{"matchAttribute": same}]
    return {"devices": devices}


def create_template(lab: Cluster, namespace: str, name: str, selector: str | None = None,
                    count: int = 1, device_class: str = DEVICE_CLASS,
                    same: str | None = None) -> None:  # fmt: skip
    """A ResourceClaimTemplate `name` (made again if one is left from an earlier run). Give
    each selector a name of its own: the claim controller makes claims from its cached copy,
    which can still hold the template deleted a moment ago under the same name."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": request(selector, count, device_class, same)}}  # fmt: skip
    absent_ok(api(lab).delete_namespaced_resource_claim_template, name, namespace)
    api(lab).create_namespaced_resource_claim_template(namespace, body)


def delete_claims(lab: Cluster, namespace: str) -> None:
    """Every claim and claim template in `namespace` (claims made from templates go with
    their pods; shared ones and templates stay until this)."""
    api(lab).delete_collection_namespaced_resource_claim(namespace)
    api(lab).delete_collection_namespaced_resource_claim_template(namespace)


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


def allocated(lab: Cluster, namespace: str, p: client.V1Pod) -> list[tuple[str, str]]:
    """(node pool, device) of every device the pod's first claim was allocated: the claim
    made from its template (named in the pod's status), or the one it names. Empty while
    it is not allocated."""
    made = {s.name: s.resource_claim_name for s in p.status.resource_claim_statuses or []}
    ref = p.spec.resource_claims[0]
    name = made.get(ref.name) or ref.resource_claim_name
    if not name:
        return []
    claim = api(lab).read_namespaced_resource_claim(name, namespace)
    if claim.status is None or claim.status.allocation is None:
        return []
    return [(r.pool, r.device) for r in claim.status.allocation.devices.results]


def taint_text(t: client.V1DeviceTaint) -> str:
    """`key=value:effect`, as kubectl writes node taints."""
    return f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}"


def taints(found: list[client.V1ResourceSlice]) -> dict[str, dict[str, list[str]]]:
    """node -> device -> its taints (`taint_text`), for the devices that have any."""
    out: dict[str, dict[str, list[str]]] = {}
    for s in found:
        for d in s.spec.devices or []:
            if d.taints:
                out.setdefault(s.spec.node_name, {})[d.name] = [taint_text(t) for t in d.taints]
    return out


def gpu_uuid(device: client.V1Device) -> str | None:
    """The UUID of the GPU a published device is (a MIG device: its parent's)."""
    u = attribute(device, "parentUUID") or attribute(device, "uuid")
    return str(u) if u else None


# -- the driver as what serves a lab's GPUs


def minor(gpu: Gpu) -> int:
    """The GPU's device minor (the driver names devices by it: gpu-<minor>), its index
    where the fake leaves it unset."""
    return gpu.minor if gpu.minor >= 0 else gpu.index


def mig_device_name(gpu: Gpu, profile: str, gi_profile_id: int, start: int) -> str:
    """The name the driver publishes a MIG device under (v0.4.1 mig.go's canonical name):
    gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start>."""
    return f"gpu-{minor(gpu)}-mig-{profile.replace('.', '')}-{gi_profile_id}-{start}"


def profile_selector(profile: str) -> str:
    """CEL for the MIG devices of one profile (`1g.10gb`)."""
    return f"device.attributes['{DRIVER}'].profile == '{profile}'"


def dynamic_placements(gpu: Gpu) -> Counter[str]:
    """What the driver with DynamicMIG publishes for a GPU out of MIG mode: the GPU, and a
    MIG device per possible placement of each GPU-instance profile it reports (an H100
    80GB: 1 + 25), by profile (`gpu` for the whole GPU)."""
    out: Counter[str] = Counter({"gpu": 1})
    for p in gpu.mig_profiles:
        out[mig.short(p.name)] += len(p.placement_starts)
    return out


def made_mig_devices(node_dir: mig.StateDir) -> dict[str, int]:
    """The MIG devices that exist in a node's fake state (fakenvml.mig.devices: a compute
    instance smaller than its GPU instance is `<slices>c.<profile>`), by the name the
    driver gives them, each to its GPU's index."""
    return _named(mig.layout(node_dir))


def mig_device_changes(node_dir: mig.StateDir, since_ns: int) -> list[tuple[int, str, int, bool]]:
    """Each MIG device made or destroyed in a node's fake state at or after `since_ns` (the
    journal's realtime clock), as (realtime_ns, name, GPU index, made), in journal order:
    what the driver did, to the nanosecond, where samples of the state miss a device
    destroyed and made again between two of them."""
    out, held = [], {}
    for rec, gpus in mig.history(node_dir):
        now = _named(gpus)
        if rec.realtime_ns >= since_ns:
            out += [(rec.realtime_ns, n, g, False) for n, g in held.items() if n not in now]
            out += [(rec.realtime_ns, n, g, True) for n, g in now.items() if n not in held]
        held = now
    return out


def _named(gpus: list[mig.GpuMig]) -> dict[str, int]:
    out = {}
    for d in mig.devices_of(gpus):
        m = gpus[d.gpu]
        gi = m.gis[d.gi]
        out[mig_device_name(m.gpu, d.profile, gi.prof.id, gi.start)] = d.gpu
    return out


def expected_devices(lab: Context, node: str, dynamic_mig: bool = False) -> int:
    """How many devices the driver publishes for `node`, by its fake state. With
    DynamicMIG, every GPU and its every placement, whatever instances claims made (the
    driver publishes what could be made; a claim's instance consumes the GPU's counters).
    Without: a GPU in MIG mode as its MIG devices (the statically made ones, and nothing
    for one with none), any other GPU as itself."""
    if dynamic_mig:
        return sum(sum(dynamic_placements(g).values()) for g in lab.fake_gpus(node).node().gpus)
    return sum(sum(1 for gi in m.gis.values() for _ in gi.cis) if m.current else 1
               for m in mig.layout(lab.fake_gpus(node)))  # fmt: skip


def wait_slices(lab: Context, deadline_s: float = 180, untainted: bool = False,
                dynamic_mig: bool = False) -> None:  # fmt: skip
    """Until every GPU node's slices publish as many devices as its fake GPUs make (and,
    with `untainted`, none of them has a taint: a restarted driver's slices replace the
    old ones, and between the two a node may have none, which is not "untainted")."""
    want = {n.name: expected_devices(lab, n.name, dynamic_mig) for n in lab.lab.gpu_nodes}

    def published(found: dict[str, client.V1ResourceSlice]) -> tuple[bool, str]:
        got: dict[str, int] = {}
        tainted: list[str] = []
        for s in found.values():
            if s.spec.node_name in want:
                got[s.spec.node_name] = got.get(s.spec.node_name, 0) + len(s.spec.devices or [])
                tainted += [f"{s.spec.node_name}/{d.name}" for d in s.spec.devices or []
                            if d.taints and untainted]  # fmt: skip
        seen = f"devices per node {got}" + (f", tainted: {', '.join(sorted(tainted))}"
                                            if tainted else "")  # fmt: skip
        return got == want and not tainted, seen

    what = "untainted " if untainted else ""
    lab.kube.watch_until(f"{what}{DRIVER} ResourceSlices of {sorted(want)}",
                         api(lab).list_resource_slice, published, deadline_s,
                         field_selector=f"spec.driver={DRIVER}")  # fmt: skip


class DraDriver(Serving):
    """NVIDIA's DRA driver: pods ask through ResourceClaims; health is device taints in its
    ResourceSlices (its NVMLDeviceHealthCheck gate); v0.4.1 never lifts a taint it set, so
    healing restarts its kubelet plugins."""

    name = "nvidia-dra-driver"
    signal = "taints"
    switches = False  # the lab's spec chose it: no subject can take its place
    # A force-deleted pod leaves the API before its node unprepared its claim, and the
    # claim stays reserved for ~70 s (docs/dra-driver.md): workload pods get a 1 s grace.
    grace_s = 1
    # The one line the experiments read: an Xid it turns into a health event
    # (device_health.go, at its chart's verbosity 4).
    logs = Logs(xid=r"Sending XID=(?P<xid>\d+) health event for device (?P<dev>[^\s,]+)")

    def __init__(self, dra: spec.DraSpec) -> None:
        self.feature_gates = dra.feature_gates
        # MIG devices made per claim: what the driver publishes differs (expected_devices).
        self.dynamic_mig = dra.feature_gates.get("DynamicMIG", False)
        self.words = f"NVIDIA's DRA driver {version()}"

    @property
    def recorded(self) -> str:
        return self.words

    @property
    def report_suffix(self) -> str:
        return ""  # one driver: out/experiments/<name>

    def actions(self) -> list[Action]:
        return [
            *actions.gpus(wanted=["dra"]),
            *actions.labels(self.mig_strategy),
            Action(f"{self.words} through its Helm chart", self.deploy),
            Action(
                "Wait for the DRA driver's kubelet plugin pods",
                lambda ctx: ctx.kube.wait_daemonset(DAEMONSET, NAMESPACE),
            ),
            Action("Wait for every GPU node's ResourceSlices", self.wait_slices),
        ]

    def wait_slices(self, ctx: Context, deadline_s: float = 180, untainted: bool = False) -> None:
        wait_slices(ctx, deadline_s, untainted, self.dynamic_mig)

    def deploy(self, ctx: Context) -> None:
        install(ctx.kubeconfig, ctx.images["dra"], self.feature_gates, ctx.images["gpulab"])

    def pods(self, ctx: Context, node: str | None = None) -> list[client.V1Pod]:
        return ctx.kube.pods(NAMESPACE, POD_LABELS, node)

    def restart(self, ctx: Context, nodes: Collection[str] | None = None) -> None:
        """A restart is what clears v0.4.1's taints: until every node publishes again."""
        ctx.kube.restart_pods(NAMESPACE, POD_LABELS, DAEMONSET, nodes=nodes)
        self.wait_slices(ctx)

    def forget(self, ctx: Context) -> None:
        ctx.kube.restart_pods(NAMESPACE, POD_LABELS, DAEMONSET)

    def set_on(self, ctx: Context, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop the kubelet plugin on `node` and wait until the node's devices are
        published, or gone: the kubelet removes a stopped plugin's ResourceSlices 30 s after
        it unregistered (defaultWipingDelay, pkg/kubelet/cm/dra/manager.go), and until then
        the scheduler may still allocate them."""
        ctx.kube.label_node(node, {f"{kindconfig.LABEL_PREFIX}/plugin": "true" if on else None})
        if on:
            self.wait_slices(ctx, deadline_s)
            return

        def gone(found: dict[str, client.V1ResourceSlice]) -> tuple[bool, str]:
            left = sum(len(s.spec.devices or []) for s in found.values())
            return not found, f"{len(found)} slices, {left} devices"

        fields = f"spec.driver={DRIVER},spec.nodeName={node}"
        ctx.kube.watch_until(f"{DRIVER} ResourceSlices of {node} gone",
                             api(ctx).list_resource_slice, gone, deadline_s,
                             field_selector=fields)  # fmt: skip

    def heal(self, ctx: Context, disturbed: frozenset[str]) -> str:
        self.back_on(ctx)
        # Where a fault was or a taint is (a taint may still be coming for a fault recovered
        # meanwhile): the other nodes' plugins restarting too made each heal ~5 s longer.
        if nodes := disturbed | set(taints(slices(ctx))):
            self.restart(ctx, nodes)
        self.wait_slices(ctx, 60, untainted=True)
        return ""

    def taints(self, api_client: client.ApiClient) -> dict[str, dict[str, list[str]]]:
        found = client.ResourceV1Api(api_client).list_resource_slice(
            field_selector=f"spec.driver={DRIVER}", _request_timeout=5).items  # fmt: skip
        return taints(found)

    def ask(self, ctx: Context, namespace: str, name: str, selector: str | None,
            gpus: int, mig: str | None = None) -> None:  # fmt: skip
        if mig:  # MIG devices of one profile, and of the selector's if one is given too
            selector = profile_selector(mig) + (f" && ({selector})" if selector else "")
        create_template(ctx, namespace, name, selector, gpus,  # each pod gets its own claim
                        MIG_CLASS if mig else DEVICE_CLASS)  # fmt: skip

    def request(self, doc: dict, name: str, gpus: int | None) -> dict:
        if not doc["spec"].get("resourceClaims"):  # an inline pod may bring its own
            use_claim(doc, name)
        return doc

    def given(self, ctx: Context, namespace: str, pod: client.V1Pod) -> list[str] | None:
        out = []
        for node, device in allocated(ctx, namespace, pod):
            d = devices(ctx, node).get(device)
            out.append((d and gpu_uuid(d)) or f"{node}/{device}")
        return out

    def claimed(self, ctx: Context, namespace: str, pod: client.V1Pod) -> list[str]:
        return [device for _, device in allocated(ctx, namespace, pod)]

    def devices(self, ctx: Context, node: str, uuids: list[str]) -> dict[str, int] | None:
        return {name: uuids.index(u) for name, d in devices(ctx, node).items()
                if (u := gpu_uuid(d)) in uuids}  # fmt: skip

    def clean(self, ctx: Context, namespace: str) -> None:
        delete_claims(ctx, namespace)
