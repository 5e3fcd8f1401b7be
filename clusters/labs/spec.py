"""Lab specs (clusters/labs/*.yaml): a validated, versioned description of a kind lab.

    name: seed
    kubernetes: v1.36.1             # optional: the lab run's version (make e2e KUBE=...)
    subject: gpulab                 # plugin under test by default: a subject name or path,
                                    # or none (fake GPUs only)
    dra: {feature_gates: {...}}     # or NVIDIA's DRA driver instead of a plugin (no subject)
    operator: {values: {...}}       # or NVIDIA's GPU Operator deploys NVIDIA's (no subject)
    feature_gates: {DRAExtendedResource: true}   # Kubernetes' own, on every component
    control_plane_args:             # flags of the control plane's components (kubeadm's
      scheduler: {kube-api-qps: "1000"}   # extraArgs): scheduler, controller_manager,
                                    # api_server
    node_status_update_frequency: 1s
    fleet_node_lease: 40s           # a fleet node's Lease (KWOK renews it every quarter)
    container_toolkit: true         # NVIDIA Container Toolkit in GPU nodes' containerd
    nodes:
      - role: control-plane
      - role: worker
        gpus: [{profile: H100-SXM5-80GB, count: 10}]   # a fakenvml inventory's `gpus:`
        topology: {...}                               # optional, as in inventories
        driver_version: "580.159.04"                  # optional, as in inventories
        extra_resources: {example.com/rdma: 10}       # counted, served by our plugin
        plugin: {start: true}       # false: the plugin DaemonSet skips this node until
                                    # the node is labelled (the seeds' second worker)
        fleet: {copies: 3, live: 1} # KWOK copies of this GPU node made with the lab
                                    # (clusters/labs/fleet.py); live: the first copies run
                                    # a DRA driver of their own (a dra: lab's)

kind names nodes by role and order (<lab>-control-plane, <lab>-worker, <lab>-worker2,
...), so a node's name follows from its position; `Node.name` computes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from clusters import versions
from clusters.subjects.subject import SubjectName
from fakenvml import inventory, yamlmodel
from fakenvml.errors import FakeNvmlError
from fakenvml.model import Node as GpuNode
from fakenvml.yamlmodel import Duration, LoadError, Strict

LABS_DIR = Path(__file__).resolve().parent
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")


class SpecError(LoadError):
    """A lab spec that cannot become a cluster; one line naming the file and key."""


class PluginPlacement(Strict):
    start: bool = True


class FleetSpec(Strict):
    """KWOK copies of a GPU node (clusters/labs/fleet.py): its capacity, labels and DRA
    slices, for the real scheduler across a fleet."""

    copies: int = Field(ge=1)
    live: int = Field(0, ge=0)  # the first `live` copies run a DRA driver of their own

    @model_validator(mode="after")
    def _live_of_copies(self) -> FleetSpec:
        if self.live > self.copies:
            raise ValueError(f"live: {self.live}, more than its {self.copies} copies")
        return self


class NodeSpec(Strict):
    role: Literal["control-plane", "worker"] = "worker"
    gpus: list[dict] | None = None
    topology: dict | None = None
    driver_version: str | None = None  # the node's fake driver (default: the profiles')
    extra_resources: dict[str, int] = Field(default_factory=dict)
    plugin: PluginPlacement = PluginPlacement()
    fleet: FleetSpec | None = None


class DraSpec(Strict):
    """A lab whose GPUs a DRA driver serves (NVIDIA's, clusters/labs/dra.py) instead of a
    device plugin."""

    # The driver's feature gates (FEATURE_GATES); NVMLDeviceHealthCheck makes it taint
    # devices on Xid and GPU-lost events.
    feature_gates: dict[str, bool] = Field(default_factory=dict)


class OperatorSpec(Strict):
    """A lab whose GPUs NVIDIA's GPU Operator serves (clusters/labs/gpuoperator.py): its
    chart's values over the project's (clusters/charts/gpu-operator-values.yaml)."""

    values: dict = Field(default_factory=dict)


_FLAG = re.compile(r"[a-z0-9][a-z0-9-]*")
# A kubelet's node Lease (and KWOK's default for its nodes): 40 s, renewed every 10 s; the
# controller manager's node-monitor-grace-period, 50 s by default, is that and 10 s more.
NODE_LEASE_S = 40
NODE_GRACE_MARGIN_S = 10


class ControlPlaneArgs(Strict):
    """Flags of the control plane's components, as kubeadm's extraArgs (name: value, no
    dashes before the name): over kubeadm's and kind's own."""

    scheduler: dict[str, str] = Field(default_factory=dict)
    controller_manager: dict[str, str] = Field(default_factory=dict)
    api_server: dict[str, str] = Field(default_factory=dict)

    @field_validator("scheduler", "controller_manager", "api_server")
    @classmethod
    def _flags(cls, v: dict[str, str]) -> dict[str, str]:
        if bad := [k for k in v if not _FLAG.fullmatch(k)]:
            raise ValueError(f"{bad[0]!r}: a flag's name, without dashes (kube-api-qps)")
        return v


class LabSpec(Strict):
    name: str
    kubernetes: str | None = None  # None: the run's (clusters.versions.kube_version())
    # The kubelet of its workers and GPU nodes, older than the control plane's within the
    # skew policy (one `make infra` builds: KUBELET_VERSIONS); None: the run's
    # ($GPULAB_KUBELET_VERSION, else the control plane's).
    kubelet: str | None = None
    subject: SubjectName = "gpulab"
    dra: DraSpec | None = None  # set: NVIDIA's DRA driver, no device plugin (`subject`)
    operator: OperatorSpec | None = None  # set: NVIDIA's GPU Operator deploys the plugin
    node_status_update_frequency: Duration = Field(1.0, gt=0)
    # How long a fleet node's Lease lasts (KWOK's nodeLeaseDurationSeconds; it renews each a
    # quarter of that apart, as a kubelet does). Longer than a kubelet's only where a fleet
    # outgrows the cores: at 40 s, 5,000 copies are 500 Lease writes a second. The controller
    # manager's node-monitor-grace-period follows it (clusters/labs/kindconfig.py).
    fleet_node_lease: Duration = Field(float(NODE_LEASE_S), ge=4)
    # The NVIDIA Container Toolkit in GPU nodes' containerd (clusters/labs/toolkit.py), the
    # nvidia runtime their default, as on GPU nodes; false: plain runc.
    container_toolkit: bool = True
    # Kubernetes feature gates, on every component (kind's `featureGates`): explicit even
    # where the version's default agrees, for suites that read them from the API server's
    # command line (the DRA driver's own checks DRAExtendedResource so).
    feature_gates: dict[str, bool] = Field(default_factory=dict)
    control_plane_args: ControlPlaneArgs = ControlPlaneArgs()
    nodes: list[NodeSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"{v!r}: expected 1-32 lower-case letters, digits or '-'")
        return v

    @field_validator("kubernetes", "kubelet")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"v1\.(3[3-9])\.\d+", v):
            raise ValueError(f"{v!r}: expected a Kubernetes version v1.33.x or newer")
        return v

    @field_validator("fleet_node_lease")
    @classmethod
    def _whole_seconds(cls, v: float) -> float:
        if v != int(v):
            raise ValueError(f"{v}s: whole seconds (KWOK's nodeLeaseDurationSeconds)")
        return v

    @model_validator(mode="after")
    def _one_server(self) -> LabSpec:
        if self.dra and self.operator:
            raise ValueError("dra and operator: one of them serves a lab's GPUs")
        return self

    @model_validator(mode="after")
    def _fleet_of_gpu_nodes(self) -> LabSpec:
        for i, n in enumerate(self.nodes):
            if n.fleet is None:
                continue
            if n.gpus is None:
                raise ValueError(f"nodes[{i}].fleet: copies of a node without gpus: "
                                 "only a GPU node has a fleet")  # fmt: skip
            if n.fleet.live and self.dra is None:
                raise ValueError(f"nodes[{i}].fleet.live: a live copy runs NVIDIA's DRA "
                                 "driver: a dra: lab's")  # fmt: skip
        return self

    @field_validator("nodes")
    @classmethod
    def _one_control_plane(cls, v: list[NodeSpec]) -> list[NodeSpec]:
        if sum(n.role == "control-plane" for n in v) != 1:
            raise ValueError("a lab has exactly one control-plane node")
        return v


class Node:
    """A spec node with its kind name and, for GPU nodes, its fakenvml inventory."""

    def __init__(self, lab: LabSpec, spec: NodeSpec, name: str) -> None:
        self.lab, self.spec, self.name = lab, spec, name
        self.gpu_node: GpuNode | None = None
        self.inventory: dict | None = None  # as a fakenvml inventory file would say it
        if spec.gpus is not None:
            inv: dict = {"gpus": spec.gpus}
            if spec.topology is not None:
                inv["topology"] = spec.topology
            if spec.driver_version is not None:
                inv["driver_version"] = spec.driver_version
            self.gpu_node = inventory.from_dict(inv, name)
            self.inventory = inv

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_node.gpus) if self.gpu_node else 0

    @property
    def gpu_product(self) -> str:
        """The product label value, as GPU feature discovery writes it (spaces -> '-')."""
        return self.gpu_node.gpus[0].name.replace(" ", "-") if self.gpu_node else ""


class Lab:
    """A validated spec plus derived node names; what kindconfig and the Lab runner use."""

    def __init__(self, spec: LabSpec, source: Path | None = None) -> None:
        self.spec, self.source = spec, source
        self.nodes: list[Node] = []
        workers = 0
        for n in spec.nodes:
            if n.role == "control-plane":
                name = f"{spec.name}-control-plane"
            else:
                workers += 1
                name = f"{spec.name}-worker" + (str(workers) if workers > 1 else "")
            self.nodes.append(Node(spec, n, name))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def control_plane(self) -> Node:
        """Its one control-plane node (the spec allows no other count)."""
        return next(n for n in self.nodes if n.spec.role == "control-plane")

    @property
    def kubernetes(self) -> str:
        """The Kubernetes version this lab runs: its spec's, else the run's."""
        return self.spec.kubernetes or versions.kube_version()

    @property
    def kubelet(self) -> str:
        """The kubelet its workers and GPU nodes run: the control plane's version, or an
        older one within the skew policy (its spec's, else $GPULAB_KUBELET_VERSION;
        ValueError beyond it)."""
        return versions.kubelet_version(self.kubernetes, self.spec.kubelet)

    @property
    def versions_text(self) -> str:
        """v1.37.0, or v1.37.0 (kubelet v1.34.0) where the workers' kubelet is older."""
        return versions.describe(self.kubernetes, self.spec.kubelet)

    @property
    def gpu_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.gpu_node]

    @property
    def fleet(self) -> dict[str, FleetSpec]:
        """Its GPU nodes' fleets (`fleet:`), by node name: KWOK copies of each."""
        return {n.name: n.spec.fleet for n in self.nodes if n.spec.fleet}


def from_dict(data: object, source: str = "lab spec", path: Path | None = None) -> Lab:
    spec = yamlmodel.validate(LabSpec, data, source, error=SpecError)
    try:
        return Lab(spec, path)
    except FakeNvmlError as e:
        raise SpecError(f"{source}: GPU inventory: {e}") from None


def load(name_or_path: str | Path, over: dict[str, object] | None = None) -> Lab:
    """A lab by name (clusters/<name>.yaml) or by path; `over`'s top-level keys replace
    its file's before validation (a run's settings: each checked as the file's are)."""
    path = yamlmodel.resolve(name_or_path, [LABS_DIR], what="lab", error=SpecError)
    data = yamlmodel.read(path, what="lab", error=SpecError)
    if over and isinstance(data, dict):
        data = {**data, **over}
    said = ", ".join(f"{k}={v}" for k, v in (over or {}).items())
    return from_dict(data, f"lab {path.stem} with {said}" if over else str(path), path)


def shipped() -> list[Lab]:
    """The labs that ship: clusters/<name>.yaml."""
    return [load(p) for p in sorted(LABS_DIR.glob("*.yaml"))]
