"""Subjects: the device plugin under test, described in one file (clusters/subjects/*.yaml,
examples/*/subject.yaml, or any path a user passes with SUBJECT= / --subjects). The guide
with the conventions a plugin meets in a lab: docs/subjects.md. Every key, and the tier
that reads it (C: container tier, tests/containers; K: cluster tier, e2e/; N: node tier,
tests/plugin, shipped subjects only; all: C, K and N):

    name: my-plugin                   # all: ids, image tags, the DaemonSet's label
    description: ...                  # none: for people
    versions: NVIDIA_PLUGIN_VERSIONS  # loading: one subject per pinned version (below)
    image: {build: ., prepare: p.sh}  # C K: or {ref: my/plugin:1.0} (in the local engine)
                                      # or {infra: nvidia-{version}} (built by `make infra`)
    daemonset: daemonset.yaml         # C K: its manifest; ${SUBJECT_IMAGE} / ${GPULAB_IMAGE}
    # or, instead of daemonset, a Helm chart rendered by `helm template` (clusters/charts/chart.py):
    # chart: {path: chart/, release: my-plugin, namespace: gpu, values: {...}}      # C K
    # chart: {go_module: github.com/NVIDIA/k8s-device-plugin@{version},
    #         dir: deployments/helm/nvidia-device-plugin, ...}
    resource: nvidia.com/gpu          # C K (default nvidia.com/gpu)
    socket: my-plugin-*.sock          # C N: its socket in the device-plugins dir, or a glob
    device_ids:                       # C K: exactly one of env, cdi, device_specs
      env: NVIDIA_VISIBLE_DEVICES     #   Allocate puts the device ids in this env var
      # cdi: vendor/class             #   Allocate names CDI devices -> /dev nodes
      # device_specs: "/dev/nvidia{minor}"  # Allocate returns DeviceSpecs (container paths)
      id: "{uuid}"                    #   how an id names its GPU: {uuid} {minor} {index}
    ready_log: "serving \\d+ devices" # C: a line it logs once it serves its devices
    logs: {xid: "Xid=(?P<xid>\\d+) on (?P<dev>\\S+)"}  # K: lines the experiments read:
                                      # xid, unhealthy, healthy, registered, restart
                                      # (Logs, below); or a file with them (logs.yaml)
    process: gpulab-plugin            # N: how the node tier runs it, without its image:
                                      # gpulab-plugin | nvidia-device-plugin
    env: {MIG_STRATEGY: mixed}        # C K: set in every container of its DaemonSet
    companions: [sched.yaml, {path: webhook/}]  # K: manifest files or charts (as chart:)
                                      # applied first: a scheduler, a webhook, RBAC
    scheduler: {name: my-scheduler, webhook: true}  # K: the scheduler its pods need
    expects:                          # what the suites assert for it (Expects, below)
      recovers: true                  # K N: Healthy again after `fakenvml recover`
      lost_gpu: that-device           # K N: GPU_IS_LOST marks that-device | every-device,
                                      #      or nothing (ignored)
      double_bit_ecc: unhealthy       # K N: the ECC event alone (no Xid 48): | ignored
      preferred_allocation_on_64_gpus: true   # N
      health_across_kubelet_restarts: true    # N
      healthcheck_env: true           # K: its health-check switch: true (NVIDIA's), false,
                                      # or {disable: VAR, off_values: [all, xids], codes: true,
                                      #     enable: VAR} (HealthSwitch, below)
      ignored_xids: nvidia-default    # K: NVIDIA's list of harmless Xids | none | [31, 43]
      kubelet_restart: re-registers   # K: | stays-gone (registers once, at start)
      event_wait_errors: ignored      # K: a failed event wait marks every-device | nothing
      start_with_lost_gpu: serves-the-rest  # K N: a GPU lost before it starts | exits
      extra_resources: false          # K: serves the lab spec's extra resources (default)
      replicas: 1                     # all: time-slicing, each GPU advertised N times
      xid_marks: every-replica        # C K, with replicas > 1: | one-replica
      mig: none                       # all: none | single | mixed (MIG suites only)
      mig_slice_xid: that-slice       # C K N, with mig: | one-per-gpu

Required are only name, image, daemonset or chart, and device_ids: both tiers a user runs
(C, K) read them.
The rest is read where a tier or scenario needs it: a behaviour left out is not stated,
never a default — a scenario that reads one fails at once in one line naming the file, the
key and its values (Unstated: at setup for a `needs(...)` marker, else where it is read),
and every other scenario runs. Only what configures a plugin has a default (resource,
extra_resources, replicas, mig, id).

`versions: NVIDIA_PLUGIN_VERSIONS` (a key of clusters/versions.env) makes one subject per
pinned version, named `<name>-<version>`, with `{version}` replaced in its strings; the bare
name stands for the first (newest) one. Paths are relative to the subject file.

Suites read a subject's `expects` instead of branching on plugin names; a scenario whose
`needs` a subject lacks is deselected for it (never skipped).

Device ids: the suites compare what the kubelet holds (its checkpoint, a pod's
allocatedResourcesStatus: the plugin's own ids) with the GPUs a container got and the GPUs
they fault, so every id goes through one mapping, `DeviceIds.gpu_of`: `id:` says where the
GPU is in an id — {uuid} (NVIDIA's, ours; MIG-... UUIDs too), {minor} (/dev/nvidia<minor>:
GKE's `nvidia<minor>`), {index} (NVML's) — with a time-slicing replica as a `::<k>` suffix
or where {replica} says. Opaque ids (no GPU in them) are refused: which GPU an id stands
for could only be guessed from a container's devices one allocation at a time, and a pod
of several GPUs would leave the pairing unknown, so the checkpoint and pod-status checks
would get weaker for everyone to cover them; a plugin with such ids can put the GPU in them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clusters import built, kube, versions
from clusters.charts import chart
from fakenvml import yamlmodel
from fakenvml.yamlmodel import LoadError, Strict
from plugin.config import DEFAULT_IGNORED_XIDS

if TYPE_CHECKING:
    from fakenvml.mig import MigDevice
    from fakenvml.model import Gpu

SUBJECTS_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?")


class SubjectError(LoadError):
    """A subject that cannot be tested; one line naming the file and key."""


class Image(Strict):
    """Where the subject's image comes from: exactly one of the three."""

    infra: str | None = None  # a lab image `make infra` builds (gpulab, nvidia-v0.19.3)
    ref: str | None = None  # an image already in the local engine (no registry here)
    build: str | None = None  # a directory with a Dockerfile, relative to the subject file
    # A script run on the host before `docker build` (e.g. `go build`: no registry serves a
    # Go image here); the build gets --build-arg GPULAB_BASE_IMAGE (Debian, glibc, python3).
    prepare: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Image:
        if sum(v is not None for v in (self.infra, self.ref, self.build)) != 1:
            raise ValueError("give exactly one of infra, ref, build")
        if self.prepare is not None and self.build is None:
            raise ValueError("prepare: only with build")
        return self


# `id: opaque`: ids that name no GPU (a counter, a hash). Which GPU each is, e2e learns from
# the device specs the plugin's Allocate answers hold (e2e/checkpoint.py): device_specs only.
OPAQUE = "opaque"
# A device id pattern's placeholders: the one that names the GPU, and the replica.
GPU_KEYS = ("uuid", "minor", "index")
REPLICA = "replica"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_VALUE = {"uuid": r".+?", "minor": r"\d+", "index": r"\d+", REPLICA: r"\d+"}


@dataclass(frozen=True)
class IdForm:
    """A compiled `id` or `device_specs` pattern: which GPU a device id (or a device node's
    path) names, and which replica of it."""

    pattern: str
    key: str  # uuid | minor | index
    regex: re.Pattern[str]

    def parse(self, text: str) -> tuple[str, int | None] | None:
        """(the GPU's uuid, minor or index as written, the replica or None), or None when
        `text` is not of this form."""
        m = self.regex.fullmatch(text)
        if m is None:
            return None
        replica = m.groupdict().get(REPLICA)
        return m.group(self.key), None if replica is None else int(replica)

    def gpu_of(self, text: str, gpus: Sequence[Gpu], mig: Sequence[MigDevice] = ()) -> str | None:
        """The UUID of the GPU (or MIG device: `{uuid}` only) that `text` names, or None."""
        found = self.parse(text)
        if found is None:
            return None
        value = found[0]
        if self.key == "uuid":
            return value if any(d.uuid == value for d in (*gpus, *mig)) else None
        if self.key == "index":
            return next((g.uuid for g in gpus if g.index == int(value)), None)
        # A device node's number is the GPU's minor, its index where the inventory sets none.
        minor = {g.minor if g.minor >= 0 else g.index: g.uuid for g in gpus}
        return minor.get(int(value))


@lru_cache(maxsize=64)
def id_form(pattern: str, keys: tuple[str, ...] = GPU_KEYS, replica: bool = True) -> IdForm:
    """`pattern` compiled: literal text, exactly one of `keys` ({uuid}, {minor}, {index}),
    and where `replica`, an optional {replica}; without one, a `::<k>` suffix (NVIDIA's
    time-slicing ids, <uuid>::<k>) is accepted after the id. ValueError, in one line, for
    a pattern that cannot be read back."""
    found = _PLACEHOLDER.findall(pattern)
    allowed = (*keys, REPLICA) if replica else keys
    shown = ", ".join(f"{{{k}}}" for k in allowed)
    for name in found:
        if name not in allowed:
            raise ValueError(f"{pattern!r}: unknown placeholder {{{name}}} (expected {shown})")
    gpu = [k for k in found if k in keys]
    if not gpu:
        gpus = ", ".join(f"{{{k}}}" for k in keys)
        raise ValueError(f"{pattern!r} names no GPU: give one of {gpus}, or `{OPAQUE}` for "
                         "ids that name none (with device_specs)")  # fmt: skip
    if len(gpu) > 1 or found.count(REPLICA) > 1:
        raise ValueError(f"{pattern!r}: each placeholder once, and one GPU placeholder only")
    if "}{" in pattern:
        raise ValueError(f"{pattern!r}: placeholders must be separated by text")
    out, at = "", 0
    for m in _PLACEHOLDER.finditer(pattern):
        out += re.escape(pattern[at : m.start()]) + f"(?P<{m[1]}>{_VALUE[m[1]]})"
        at = m.end()
    out += re.escape(pattern[at:])
    if replica and REPLICA not in found:
        out += rf"(?:::(?P<{REPLICA}>\d+))?"
    return IdForm(pattern, gpu[0], re.compile(out))


# How a container shows the GPUs of a CDI device (the runtime makes them from the spec).
CDI_NODES = "/dev/nvidia{minor}"


class DeviceIds(Strict):
    """How a container learns which GPUs it got — exactly one of: an env var Allocate fills
    with the device ids (`env:`); CDI devices Allocate names (`cdi: <vendor>/<class>`,
    the device's name after `=` is its id), which the runtime turns into the GPUs'
    /dev/nvidia<minor> nodes; or device specs Allocate returns (`device_specs:`, the
    container path of each GPU's device node, e.g. /dev/nvidia{minor}). And how a device
    id names its GPU (`id:`, default {uuid}): the ids the plugin lists are what the
    kubelet's checkpoint and a pod's status hold."""

    env: str | None = None
    cdi: str | None = None  # e.g. k8s.device-plugin.nvidia.com/gpu
    device_specs: str | None = None  # e.g. /dev/nvidia{minor}
    id: str = "{uuid}"  # e.g. nvidia{minor}, {uuid}, gpu{index}::{replica}, opaque
    # How the env var's entries name GPUs where that differs from the ids (with env only):
    # a sharing plugin's kubelet ids are units of memory, its env the GPU's index.
    env_id: str | None = None

    @model_validator(mode="after")
    def _one(self) -> DeviceIds:
        if sum(v is not None for v in (self.env, self.cdi, self.device_specs)) != 1:
            raise ValueError("give exactly one of env, cdi, device_specs")
        if self.env_id is not None:
            if self.env is None:
                raise ValueError("env_id: only with env")
            try:
                id_form(self.env_id, replica=False)
            except ValueError as e:
                raise ValueError(f"env_id: {e}") from None
        if self.opaque:
            if self.device_specs is None and self.env_id is None:
                raise ValueError(f"id: {OPAQUE} needs device_specs, or env with env_id: the "
                                 "device nodes Allocate hands, or the env's own form, say "
                                 "which GPU a container got (an env var or a CDI name that "
                                 "shows only the id again cannot)")  # fmt: skip
        else:
            try:
                id_form(self.id)
            except ValueError as e:
                raise ValueError(f"id: {e}") from None
        if self.device_specs is not None:
            path = PurePosixPath(self.device_specs)
            if path.parent != PurePosixPath("/dev") or "{" not in path.name:
                raise ValueError(f"device_specs: expected a device node in /dev named by the GPU, "
                                 f"e.g. {CDI_NODES}, found {self.device_specs!r}")  # fmt: skip
            try:
                id_form(self.device_specs, ("minor", "index"), replica=False)
            except ValueError as e:
                raise ValueError(f"device_specs: {e}") from None
        return self

    @property
    def opaque(self) -> bool:
        """The ids name no GPU: e2e maps them through the device specs of each Allocate."""
        return self.id == OPAQUE

    @property
    def form(self) -> IdForm:
        """How a device id names its GPU (ValueError for opaque ids: none)."""
        if self.opaque:
            raise ValueError(f"{OPAQUE} ids name no GPU")
        return id_form(self.id)

    @property
    def env_form(self) -> IdForm:
        """How the env var's entries name their GPUs: `env_id`, else the ids' own form."""
        return id_form(self.env_id, replica=False) if self.env_id else self.form

    @property
    def nodes(self) -> IdForm | None:
        """How a container's device node names its GPU (CDI, device specs), or None (env)."""
        if self.env is not None:
            return None
        return id_form(self.device_specs or CDI_NODES, ("minor", "index"), replica=False)

    def gpu_of(
        self, device_id: str, gpus: Sequence[Gpu], mig: Sequence[MigDevice] = ()
    ) -> str | None:
        """The UUID of the GPU (a MIG device's own, for `{uuid}` ids) `device_id` names,
        replica suffix or not; None if it names none of `gpus` / `mig`, and for every opaque
        id (e2e/checkpoint.py maps those)."""
        return None if self.opaque else self.form.gpu_of(device_id, gpus, mig)

    def replica_of(self, device_id: str) -> int | None:
        """The replica a time-sliced id names (<uuid>::<k>, or the `{replica}` of `id`)."""
        found = None if self.opaque else self.form.parse(device_id)
        return None if found is None else found[1]

    def describe(self) -> str:
        """One line: how the ids reach the container and how they name GPUs."""
        how = (f"env {self.env}" if self.env else f"cdi {self.cdi}" if self.cdi
               else f"device_specs {self.device_specs}")  # fmt: skip
        return f"{how}, id {self.id}" + (f", env {self.env_id}" if self.env_id else "")


LostGpu = Literal["that-device", "every-device", "ignored"]
DoubleBitEcc = Literal["unhealthy", "ignored"]
XidMarks = Literal["every-replica", "one-replica"]
MigSliceXid = Literal["that-slice", "one-per-gpu"]
MigStrategy = Literal["none", "single", "mixed"]
# Or a plugin's own list, e.g. [31, 43, 45]: some ignore neither NVIDIA's six nor nothing.
IgnoredXids = Literal["nvidia-default", "none"] | tuple[int, ...]  # hashable
KubeletRestart = Literal["re-registers", "stays-gone"]
EventWaitErrors = Literal["every-device", "ignored"]
StartWithLostGpu = Literal["serves-the-rest", "exits"]


class HealthSwitch(Strict):
    """A plugin's health-check switch: env vars of its DaemonSet and the values they take.
    `healthcheck_env: true` is NVIDIA's, as the defaults here spell it (its plugin's
    health.go: `all` or `xids` turns every check off, a comma list of codes adds to the
    ignored Xids; DP_ENABLE_HEALTHCHECKS lists Xids checked even so)."""

    disable: str = "DP_DISABLE_HEALTHCHECKS"  # the env var that turns checks off
    off_values: tuple[str, ...] = Field(("all", "xids"), min_length=1)  # its "all off"
    codes: bool = True  # `disable` also takes Xid codes, comma-separated, to ignore
    enable: str | None = "DP_ENABLE_HEALTHCHECKS"  # Xids checked even if ignored; or none

    @field_validator("disable", "enable")
    @classmethod
    def _var(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r} is not an env var name")
        return v

    @field_validator("off_values", mode="before")
    @classmethod
    def _values(cls, v: object) -> object:
        if not isinstance(v, list | tuple) or not v:
            raise ValueError(f"expected a list of values such as [all, xids], found {v!r}")
        if bad := [x for x in v if not isinstance(x, str) or not x or "," in x]:
            raise ValueError(f"{bad[0]!r}: a word without commas (a comma list is codes)")
        return tuple(v)  # YAML's list, hashable


class PodSelector(Strict):
    """Pods a subject runs beside its plugin, found by namespace and labels."""

    namespace: str = "kube-system"
    labels: dict[str, str] = Field(min_length=1)

    @property
    def selector(self) -> str:
        return kube.selector(self.labels)


MpsDaemonDeath = Literal["unnoticed"]


class Mps(Strict):
    """Sharing through an MPS control daemon (NVIDIA's `sharing.mps`): each replica is an
    MPS client of its GPU. Pods get the daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY)
    and, through it, its per-client limits: `100 / replicas` percent of the GPU's threads
    and `memory / replicas` of pinned device memory (NVIDIA's mps-control-daemon sets them)."""

    daemon: PodSelector  # where the control daemon runs, one pod per plugin node
    max_request: int | None = Field(None, ge=1)  # more replicas a container is refused
    # The daemon gone (its nvidia-cuda-mps-control killed): `unnoticed` (NVIDIA's: no MPS
    # health check; GPUs stay Healthy, pods are admitted with a pipe no daemon serves).
    daemon_death: MpsDaemonDeath


class NodeHealth(Strict):
    """Where a plugin reports its GPUs' health on its Node, outside the device-plugin API
    (HAMi and gpushare-style plugins write it for their schedulers): an annotation, and a
    regex its value matches for an Unhealthy GPU, that GPU named by one of {index},
    {uuid}, {minor} (filled in, escaped, before matching)."""

    annotation: str = Field(min_length=1)
    unhealthy: str

    @field_validator("unhealthy")
    @classmethod
    def _pattern(cls, v: str) -> str:
        found = _PLACEHOLDER.findall(v)
        if len([k for k in found if k in GPU_KEYS]) != 1:
            raise ValueError(f"{v!r}: name the GPU with exactly one of {{index}}, {{uuid}}, "
                             "{minor}")  # fmt: skip
        try:
            re.compile(_PLACEHOLDER.sub("0", v))
        except re.error as e:
            raise ValueError(f"{v!r} is no regex: {e}") from None
        return v

    def unhealthy_of(self, gpu: Gpu) -> re.Pattern[str]:
        """The pattern with `gpu` filled in."""
        minor = gpu.minor if gpu.minor >= 0 else gpu.index
        values = {"index": gpu.index, "uuid": gpu.uuid, "minor": minor}
        return re.compile(_PLACEHOLDER.sub(lambda m: re.escape(str(values[m[1]])), self.unhealthy))


class Expects(Strict):
    """The subject's documented behaviour, which the suites assert. A behaviour left out
    (None) is not stated: the scenarios that read it fail at once saying so (Unstated);
    the others run. Only what configures the subject has a default."""

    recovers: bool | None = None  # Healthy again after `fakenvml recover`, without a restart
    # What GPU_IS_LOST marks Unhealthy: that GPU's devices (ours asks NVML), every device
    # (NVIDIA's: its wait names no GPU), or nothing (the lost GPU stays listed Healthy).
    lost_gpu: LostGpu | None = None
    double_bit_ecc: DoubleBitEcc | None = None  # ignored: acts on Xid 48 only (NVIDIA's)
    preferred_allocation_on_64_gpus: bool | None = None  # answers GetPreferredAllocation on 64
    health_across_kubelet_restarts: bool | None = None  # Unhealthy stays so on re-registering
    # Its health-check switch (HealthSwitch; true: NVIDIA's), or false: it has none.
    healthcheck_env: HealthSwitch | Literal[False] | None = None
    # Which Xids leave a GPU Healthy: NVIDIA's default list (13, 31, 43, 45, 68, 109:
    # application errors; ours follows it), none (every Xid marks its GPU), or its own list.
    ignored_xids: IgnoredXids | None = None
    # After a kubelet restart: it registers with the new kubelet (watching for its socket
    # to go, as the API asks), or it registered once at start and its resource stays gone.
    kubelet_restart: KubeletRestart | None = None
    # A failed NVML event wait (not a timeout, not GPU_IS_LOST): every device Unhealthy
    # (NVIDIA's: "Error waiting for event ... Marking all devices as unhealthy"), or
    # nothing: it waits again and still hears the next Xid.
    event_wait_errors: EventWaitErrors | None = None
    # Started with a GPU already lost (its handle lookup fails, NVML_ERROR_GPU_IS_LOST): it
    # serves the node's other GPUs (ours), or exits (NVIDIA's: "error getting device handle
    # for index N: GPU is lost"; its pod crash-loops, the other GPUs go unserved).
    start_with_lost_gpu: StartWithLostGpu | None = None
    extra_resources: bool = False  # serves the lab spec's extra_resources too
    replicas: int = Field(1, ge=1, le=64)  # time-slicing: each GPU advertised N times
    mps: Mps | Literal[False] = False  # the replicas are MPS clients (and how it behaves)
    # Each device is this many MiB of one GPU's memory (a sharing plugin's units; which GPU
    # is its scheduler's choice): such a subject runs the sharing suite only
    # (e2e/test_share.py), whose scenarios count memory, not GPUs.
    memory_unit_mib: int | None = Field(None, ge=1)
    # Its GPUs' health as it writes it on its Node (NodeHealth), read after an Xid; or
    # false: it writes none there.
    node_health: NodeHealth | Literal[False] | None = None
    # With replicas > 1, what a fault on a GPU takes out: all its replicas (health is per
    # GPU) or only one (NVIDIA's: it matches the event's UUID to one replica id).
    xid_marks: XidMarks | None = None
    # The MIG strategy it serves (NVIDIA's): a subject with one runs the MIG suites only
    # (e2e/test_mig.py, on the `mig` lab); "none" runs the whole-GPU suites.
    mig: MigStrategy = "none"
    # An Xid on one MIG slice (its GPU and compute instance in the event) marks: that slice
    # (ours), or only if it is the one slice per GPU and resource the plugin keeps in its
    # parent-UUID map (NVIDIA's: the last of its GPU's slices in Go map order, so per
    # start a random one; Xids on the other slices of that GPU are dropped).
    mig_slice_xid: MigSliceXid | None = None

    @field_validator("healthcheck_env", mode="before")
    @classmethod
    def _switch(cls, v: object) -> object:
        if v is True:
            return HealthSwitch()
        if v is None or v is False or isinstance(v, dict | HealthSwitch):
            return v
        raise ValueError("expected true (NVIDIA's switch), false or a mapping of disable, "
                         f"off_values, codes, enable; found {v!r}")  # fmt: skip

    @field_validator("ignored_xids", mode="before")
    @classmethod
    def _xids(cls, v: object) -> object:
        # One line for any wrong value: pydantic's own names only the union's first branch.
        if v is None or v in ("nvidia-default", "none"):
            return v
        if isinstance(v, list | tuple) and v and all(type(x) is int and 1 <= x <= 1023 for x in v):
            return tuple(v)  # YAML's list, hashable
        raise ValueError(f"expected nvidia-default, none or a list of Xid codes such as "
                         f"[31, 43, 45], found {v!r}")  # fmt: skip


class Unstated(SubjectError):
    """A scenario read something the subject file does not state: one line naming the
    file, the key and the values it may take."""


def allowed(annotation: object) -> str:
    """The values a field's annotation allows, as a subject file spells them."""
    args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    out: list[str] = []
    for a in args:
        if get_origin(a) is Literal:
            out += [str(v).lower() if isinstance(v, bool) else str(v) for v in get_args(a)]
        elif get_origin(a) is tuple:
            out.append("a list of Xid codes")
        elif a is bool:
            out += ["true", "false"]
        elif a is HealthSwitch:
            out += ["true (NVIDIA's switch)", "{disable: VAR, off_values: [values], codes: bool, "
                    "enable: VAR}"]  # fmt: skip
        else:
            out.append(getattr(a, "__name__", str(a)))
    return " | ".join(out)


def unstated(source: Path, key: str, values: str, reader: str = "this scenario") -> Unstated:
    return Unstated(f"{source}: {key} is not stated, and {reader} reads it: state {values}")


class Expectations:
    """A subject's `expects` as scenarios read them: an unstated one raises Unstated
    instead of standing in for a default nobody wrote."""

    if TYPE_CHECKING:  # the fields, for type checkers (read through __getattr__)
        recovers: bool
        lost_gpu: LostGpu
        double_bit_ecc: DoubleBitEcc
        preferred_allocation_on_64_gpus: bool
        health_across_kubelet_restarts: bool
        healthcheck_env: HealthSwitch | Literal[False]
        ignored_xids: IgnoredXids
        kubelet_restart: KubeletRestart
        event_wait_errors: EventWaitErrors
        start_with_lost_gpu: StartWithLostGpu
        extra_resources: bool
        replicas: int
        mps: Mps | Literal[False]
        xid_marks: XidMarks
        mig: MigStrategy
        mig_slice_xid: MigSliceXid
        memory_unit_mib: int
        node_health: NodeHealth | Literal[False]

    def __init__(self, spec: Expects, source: Path) -> None:
        self._spec, self._source = spec, source

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key not in Expects.model_fields:
            raise AttributeError(key)
        value = getattr(self._spec, key)
        if value is None:
            values = allowed(Expects.model_fields[key].annotation)
            raise unstated(self._source, f"expects.{key}", f"one of {values}")
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expectations) and self._spec == other._spec

    def __hash__(self) -> int:
        return hash(self._spec)

    def __repr__(self) -> str:
        return f"Expectations({self._spec!r})"

    def stated(self, key: str) -> bool:
        return getattr(self._spec, key) is not None

    @property
    def shares_memory(self) -> bool:
        """Its devices are units of GPU memory (`memory_unit_mib`): the sharing suite's."""
        return self._spec.memory_unit_mib is not None

    @property
    def time_sliced(self) -> bool:
        return self.replicas > 1 and not self._spec.mps

    @property
    def health_codes(self) -> bool:
        """Its switch takes Xid codes to ignore and has a variable for codes checked even so
        (false where `healthcheck_env` is unstated: reading that one says so)."""
        switch = self._spec.healthcheck_env
        return bool(switch) and switch.codes and switch.enable is not None  # type: ignore[union-attr]

    @property
    def ignored_xid_codes(self) -> frozenset[int]:
        """The Xids `ignored_xids` names, as codes."""
        said = self.ignored_xids
        if said == "nvidia-default":
            return DEFAULT_IGNORED_XIDS  # NVIDIA's list, which our plugin follows
        return frozenset() if said == "none" else frozenset(said)

    @property
    def out_per_faulted_gpu(self) -> int:
        """How many advertised devices one faulted GPU takes out of allocatable."""
        if self.replicas == 1:
            return 1
        return self.replicas if self.xid_marks == "every-replica" else 1


# The log lines the experiments read (e2e/runner.py parse_log), each a regex searched in
# one line of the plugin's log, with the named groups its reader takes from the line.
LOG_GROUPS: dict[str, tuple[str, ...]] = {
    "xid": ("xid", "dev"),
    "unhealthy": ("dev",),
    "healthy": ("dev",),
    "registered": (),
    "restart": (),
}
# A named group `registered` may have: the resource it registered (others are not counted).
LOG_RESOURCE = "resource"


class Logs(Strict):
    """What the plugin logs when it acts, as regexes: the experiments' "plugin saw" and
    "plugin update" columns and their registrations read them. A line left out is not
    stated: the report says so instead of an empty column. `dev` is the GPU's UUID (a
    `::<k>` replica suffix is dropped when matched to a fault)."""

    xid: str | None = None  # an Xid it acts on: (?P<xid>) its code, (?P<dev>) the GPU
    unhealthy: str | None = None  # a ListAndWatch update marking (?P<dev>) Unhealthy
    healthy: str | None = None  # a ListAndWatch update marking (?P<dev>) Healthy again
    registered: str | None = None  # registered with the kubelet; (?P<resource>) if named
    restart: str | None = None  # it saw kubelet.sock come back and registers again

    @field_validator("*")
    @classmethod
    def _readable(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        try:
            regex = re.compile(v)
        except re.error as e:
            raise ValueError(f"{v!r} is not a regex: {e}") from None
        need = LOG_GROUPS[str(info.field_name)]
        if missing := [g for g in need if g not in regex.groupindex]:
            names = ", ".join(f"(?P<{g}>...)" for g in missing)
            raise ValueError(f"{v!r} has no group {names}: the experiments read it from the "
                             "line")  # fmt: skip
        return v

    def pattern(self, key: str) -> re.Pattern[str] | None:
        """The compiled regex of one line (`xid`, `unhealthy` ...), or None: not stated."""
        v = getattr(self, key)
        return None if v is None else re.compile(v)

    @property
    def unstated(self) -> list[str]:
        """The lines the file does not state, in LOG_GROUPS order."""
        return [k for k in LOG_GROUPS if getattr(self, k) is None]


# How the node tier (tests/plugin) runs a plugin as a process, without its image: gpulab's
# plugin from this checkout (standin/gpulab.py), or NVIDIA's binary of the subject's
# version as `make infra` built it (standin/nvidia.py).
Process = Literal["gpulab-plugin", "nvidia-device-plugin"]


class Chart(Strict):
    """A Helm chart the subject is deployed from: a directory, or one inside a Go module."""

    path: str | None = None  # a chart directory, relative to the subject file
    go_module: str | None = None  # <module>@<version>, from gpulab's Go module cache
    dir: str | None = None  # the chart's directory inside that module
    release: str | None = None  # the release name (default: the subject's name)
    namespace: str = "default"  # the release namespace (`helm install --namespace`)
    values: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one(self) -> Chart:
        if (self.path is None) == (self.go_module is None):
            raise ValueError("give exactly one of path, go_module")
        if (self.dir is None) != (self.go_module is None):
            raise ValueError("dir: goes with go_module (the chart's directory in the module)")
        if self.go_module is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+", self.go_module):
            raise ValueError(f"go_module: expected <module>@<version>, found {self.go_module!r}")
        return self

    def directory(self, base: Path) -> Path:
        """Its directory: `path` relative to `base` (the subject file's), or inside a Go
        module in the cache."""
        if self.path is not None:
            return (base / self.path).resolve()
        assert self.go_module is not None and self.dir is not None
        return chart.module_dir(self.go_module) / self.dir


# A companion: a manifest file, or a chart (a mapping, as `chart:`). Tagged, so that a bad
# chart is explained as a chart, not as "expected a string".
Companion = Annotated[
    Annotated[str, Tag("File")] | Annotated[Chart, Tag("Chart")],
    Discriminator(lambda v: "File" if isinstance(v, str) else "Chart"),
]


class Choice(Strict):
    """Where a plugin's scheduler writes the GPU it chose on a pod: an annotation, and how
    its value names the GPU ({index}, {uuid} or {minor} in text)."""

    annotation: str = Field(min_length=1)
    id: str = "{uuid}"

    @field_validator("id")
    @classmethod
    def _form(cls, v: str) -> str:
        id_form(v, replica=False)
        return v

    @property
    def form(self) -> IdForm:
        return id_form(self.id, replica=False)


class Scheduler(Strict):
    """A scheduler the plugin needs (its own, or the cluster's with its extender, run by
    the subject's companions): the suites' pods name it in schedulerName."""

    name: str = Field(min_length=1)
    choice: Choice | None = None  # where it writes the GPU it chose, if it does
    # A companion webhook names it in the schedulerName of pods that ask for the resource
    # (as HAMi's does): the suites' pods leave schedulerName unset and go through it.
    webhook: bool = False


class SubjectSpec(Strict):
    name: str
    description: str = ""
    versions: str | None = None
    image: Image
    daemonset: str | None = None  # its manifest, or
    chart: Chart | None = None  # a Helm chart
    resource: str = "nvidia.com/gpu"
    socket: str | None = None  # its socket's name in the device-plugins dir; or a glob
    device_ids: DeviceIds
    ready_log: str | None = None  # a regex of a line it logs once it serves its devices
    # Its log lines the experiments read: a mapping, or a file holding one (relative to the
    # subject file), which the subjects of one plugin share.
    logs: Logs = Field(default_factory=Logs)
    process: Process | None = None  # how the node tier runs it (without its image)
    # Why its plugin serves only in a cluster (a companion beside it, the kube API): the node
    # and container tiers leave it out and say so in one line, instead of failing each test.
    cluster_only: str | None = Field(None, min_length=1)
    expects: Expects = Field(default_factory=Expects)
    # Manifest files or Helm charts applied with the plugin, before it (relative to the
    # file; placeholders as in its own, and ${KUBE_SCHEDULER_IMAGE}: the cluster's
    # kube-scheduler): a scheduler or extender, a webhook, CRDs, RBAC. Their Deployments
    # and DaemonSets are waited for.
    companions: list[Companion] = Field(default_factory=list)
    scheduler: Scheduler | None = None  # the scheduler the suites' pods name
    # Set in (or replacing the value of) every container of the subject's DaemonSet:
    # one manifest serves several configurations (MIG_STRATEGY: single | mixed).
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _deployed_one_way(self) -> SubjectSpec:
        if (self.daemonset is None) == (self.chart is None):
            raise ValueError("give exactly one of daemonset, chart")
        return self


class Subject:
    """A validated subject with its file's directory, its DaemonSet and its version."""

    def __init__(self, spec: SubjectSpec, source: Path, version: str = "") -> None:
        self.spec, self.source, self.version = spec, source, version
        self.name = spec.name
        self.expects = Expectations(spec.expects, source)

    def __repr__(self) -> str:
        return f"Subject({self.name!r})"

    def path(self, relative: str) -> Path:
        return (self.source.parent / relative).resolve()

    def chart_dir(self) -> Path:
        """The chart's directory: the subject's own, or inside a Go module in the cache."""
        assert self.spec.chart is not None
        return self.spec.chart.directory(self.source.parent)

    @property
    def charts(self) -> list[Chart]:
        """Every chart it is deployed with: its own and its companions'."""
        own = [self.spec.chart] if self.spec.chart else []
        return own + [c for c in self.spec.companions if isinstance(c, Chart)]

    def _chart_text(self, c: Chart, key: str, release: str, crds: bool = False) -> str:
        """`helm template` of one of its charts (`key`: where the file names it)."""
        where = c.directory(self.source.parent)
        if not (where / "Chart.yaml").is_file():
            if c.go_module is not None:
                raise built.InfraMissing(f"subject {self.name}: {c.go_module} is not in the "
                                         f"Go module cache ({where}); run `make infra "
                                         f"SUBJECT={self.source}`")  # fmt: skip
            raise SubjectError(f"{self.source}: {key}.path: no chart (Chart.yaml) in {where}")
        try:
            return chart.template(built.helm(), where, c.release or release, c.namespace,
                                  c.values, versions.kube_version(), include_crds=crds)  # fmt: skip
        except chart.ChartError as e:
            raise SubjectError(f"{self.source}: {key}: {e}") from None

    @cached_property
    def manifest_text(self) -> str:
        """The manifest as text, images still as ${SUBJECT_IMAGE} etc.: the DaemonSet file,
        or the chart rendered by `helm template` (once per Subject)."""
        if self.spec.daemonset is not None:
            return self.path(self.spec.daemonset).read_text()
        assert self.spec.chart is not None
        return self._chart_text(self.spec.chart, "chart", self.name)

    @cached_property
    def manifest(self) -> list[dict]:
        """The manifest's documents, images still as ${SUBJECT_IMAGE} etc."""
        return [d for d in yaml.safe_load_all(self.manifest_text) if d]

    @cached_property
    def daemonset(self) -> dict:
        found = next((d for d in self.manifest if d.get("kind") == "DaemonSet"), None)
        if found is None:
            what = self.spec.daemonset or f"chart {self.chart_dir()}"
            key = "daemonset" if self.spec.daemonset else "chart"
            raise SubjectError(f"{self.source}: {key}: {what} has no DaemonSet")
        return found

    @property
    def daemonset_name(self) -> str:
        return self.daemonset["metadata"]["name"]

    @property
    def default_namespace(self) -> str:
        """Where the manifest's namespaced objects go when they name no namespace: the
        release namespace of a chart (as `helm install` does), else "default"."""
        return self.spec.chart.namespace if self.spec.chart else "default"

    @property
    def namespace(self) -> str:
        return self.daemonset["metadata"].get("namespace", self.default_namespace)

    @property
    def selector(self) -> str:
        return kube.selector(self.daemonset["spec"]["selector"]["matchLabels"])

    @property
    def plugin(self) -> str:
        """Which plugin program runs: its image (lab image, ref, or build directory).
        Subjects that configure one binary differently (nvidia, nvidia-cdi,
        nvidia-timeslicing) share it."""
        img = self.spec.image
        return img.infra or img.ref or str(self.path(img.build or "."))

    def build_tag(self, args: dict[str, str]) -> str:
        """The tag `make infra` builds its image under (`image: {build: DIR}`) with these
        build args (build_args): named for the build context and changing with any file of
        it or image it may start FROM, so the subjects that build one directory share one
        image."""
        context = self.path(self.spec.image.build or ".")
        h = hashlib.sha256(repr(sorted(args.items())).encode())
        for f in sorted(p for p in context.rglob("*") if p.is_file() and ".git" not in p.parts):
            h.update(str(f.relative_to(context)).encode() + b"\0" + f.read_bytes())
        name = re.sub(r"[^a-z0-9._-]+", "-", context.name.lower()).strip("-._") or "subject"
        return f"gpulab-subject/{name}:{h.hexdigest()[:12]}"

    def image_ref(self, products: built.Products) -> str:
        """The image it runs, present in the engine; InfraMissing saying how to get it."""
        img = self.spec.image
        if img.infra is not None:
            ref = products.images.get(img.infra, "")
            if not ref or not built.image_present(ref):
                raise built.InfraMissing(f"subject {self.name}: the {img.infra} image is not "
                                         f"built; {built.MAKE_INFRA}")  # fmt: skip
            return ref
        if img.ref is not None:
            if not built.image_present(img.ref):
                raise built.InfraMissing(f"subject {self.name}: image {img.ref} is not in the "
                                         "Docker engine (no registry here: build or load it "
                                         "first)")  # fmt: skip
            return img.ref
        tag = self.build_tag(build_args(products.images))
        if not built.image_present(tag):
            raise built.InfraMissing(f"subject {self.name}: its image is not built; run "
                                     f"`make infra SUBJECT={self.source}`")  # fmt: skip
        return tag

    def trait(self, key: str) -> str:
        """An expectation's value ("None": not stated), or a property's of the
        expectations (`time_sliced`) or the subject (`plugin`, `cdi`, `device_ids`), as
        text."""
        if key in Expects.model_fields:
            return str(getattr(self.spec.expects, key))
        return str(getattr(self.expects if hasattr(Expectations, key) else self, key))

    @property
    def cdi(self) -> bool:
        """Allocate names CDI devices (the runtime makes the device nodes)."""
        return self.spec.device_ids.cdi is not None

    @property
    def scheduler_webhook(self) -> bool:
        """A companion webhook names its scheduler on pods (a trait)."""
        return self.spec.scheduler is not None and self.spec.scheduler.webhook

    @property
    def device_ids(self) -> str:
        """How device ids reach a container and name GPUs, as one line (a trait)."""
        return self.spec.device_ids.describe()

    def unstated(self, needs: tuple[str, ...]) -> list[str]:
        """The expectations `needs` names that the subject file does not state."""
        keys = [n.partition("=")[0] for n in needs]
        return [k for k in keys if k in Expects.model_fields and not self.expects.stated(k)]

    def require(self, needs: tuple[str, ...]) -> None:
        """Unstated for the first expectation `needs` names that the file does not state:
        a scenario that needs it fails at once, never runs on a guess."""
        for key in self.unstated(needs):
            getattr(self.expects, key)

    def needs_met(self, needs: tuple[str, ...]) -> bool:
        """Every named expectation (or property: `cdi`, `time_sliced`) is true (or, for
        `lost_gpu=that-device` style, equal). An unstated one counts as met: the scenario
        is kept, and fails on it (`require`) instead of vanishing from the run."""
        for need in needs:
            key, _, want = need.partition("=")
            if key in self.unstated((key,)):
                continue
            have = self.trait(key)
            if (have != want) if want else have in ("False", "None", "none", "0", ""):
                return False
        return True

    def gpu_of(
        self, device_id: str, gpus: Sequence[Gpu], mig: Sequence[MigDevice] = ()
    ) -> str | None:
        """The UUID of the GPU (or MIG device) one of the plugin's device ids names, or
        None: see DeviceIds.gpu_of."""
        return self.spec.device_ids.gpu_of(device_id, gpus, mig)

    @property
    def ready_log(self) -> str:
        """The line the container tier waits for (Unstated when the file gives none)."""
        if self.spec.ready_log is None:
            raise unstated(self.source, "ready_log", "a regex of a line it logs once it serves "
                           "its devices", "the container tier")  # fmt: skip
        return self.spec.ready_log

    @property
    def logs(self) -> Logs:
        """The log lines its file states (the experiments read them; none: not stated)."""
        return self.spec.logs

    @property
    def process(self) -> Process:
        """How the node tier runs it as a process (Unstated when the file does not say)."""
        if self.spec.process is None:
            raise unstated(self.source, "process", f"one of {allowed(Process)}",
                           "the node tier")  # fmt: skip
        return self.spec.process

    def serves_on(self, endpoint: str) -> bool:
        """The plugin registered `endpoint` (a socket's name) as its file says: equal to
        `socket:`, or matched by it as a glob (a name with a timestamp, a node name)."""
        if self.spec.socket is None:
            raise unstated(self.source, "socket", "its socket's name in the device-plugins "
                           "dir (a glob may match it)", "the container tier")  # fmt: skip
        return fnmatch.fnmatchcase(endpoint, self.spec.socket)

    def render(self, images: dict[str, str]) -> list[dict]:
        """The manifest with ${SUBJECT_IMAGE} and ${GPULAB_IMAGE} replaced, and their
        halves ${..._REPOSITORY} and ${..._TAG} (charts take an image in two values)."""
        docs = [d for d in yaml.safe_load_all(_fill(self.manifest_text, images)) if d]
        for d in docs:
            if d.get("kind") == "DaemonSet" and self.spec.env:
                for c in d["spec"]["template"]["spec"]["containers"]:
                    env = [e for e in c.get("env", []) if e["name"] not in self.spec.env]
                    c["env"] = env + [{"name": k, "value": v} for k, v in self.spec.env.items()]
        return docs

    @cached_property
    def _companion_texts(self) -> list[tuple[str, str]]:
        """Each companion as text and the namespace its objects go to when they name none
        (a chart's release namespace, as `helm install`; a file's: the subject's).
        Rendered once per Subject, so a chart's generated certificates stay one pair."""
        out = []
        for i, c in enumerate(self.spec.companions):
            if isinstance(c, str):
                out.append((self.path(c).read_text(), self.default_namespace))
            else:
                release = c.release or f"{self.name}-{c.directory(self.source.parent).name}"
                text = self._chart_text(c, f"companions[{i}]", release, crds=True)
                out.append((text, c.namespace))
        return out

    def companion_docs(self, images: dict[str, str]) -> list[tuple[dict, str]]:
        """The companions' documents, placeholders filled as in `render`, each with the
        namespace it goes to if it names none."""
        return [(d, ns) for text, ns in self._companion_texts
                for d in yaml.safe_load_all(_fill(text, images)) if d]  # fmt: skip


def build_args(images: dict[str, str]) -> dict[str, str]:
    """What a subject's Dockerfile may start FROM (`make infra`'s images): gpulab's base
    (Debian, glibc, python3) and gpulab's own image (its Python package: grpc, nvidia-ml-py,
    the device-plugin API; fakenvml)."""
    return {"GPULAB_BASE_IMAGE": images["base"], "GPULAB_IMAGE": images["gpulab"]}


def _fill(text: str, images: dict[str, str]) -> str:
    """${KEY} replaced by each image, ${KEY_REPOSITORY} and ${KEY_TAG} by its halves."""
    for key, image in images.items():
        repo, tag = chart.split_image(image)
        for k, v in ((f"{key}_REPOSITORY", repo), (f"{key}_TAG", tag), (key, image)):
            text = text.replace("${" + k + "}", v)
    return text


def _expand(data: dict, version: str) -> dict:
    """{version} replaced in every string of the document."""

    def sub(v: object) -> object:
        if isinstance(v, str):
            return v.replace("{version}", version)
        if isinstance(v, dict):
            return {k: sub(x) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v

    return sub(data)  # type: ignore[return-value]


def _with_logs(data: object, path: Path) -> object:
    """The document with a `logs:` that names a file (shared by the subjects of one
    plugin) replaced by that file's mapping, validated there: a bad line is refused in one
    line naming both files and the key."""
    if not isinstance(data, dict) or not isinstance(data.get("logs"), str):
        return data
    where = (path.parent / data["logs"]).resolve()
    if not where.is_file():
        raise SubjectError(f"{path}: logs: no file {where}")
    try:
        logs = yamlmodel.validate(Logs, yamlmodel.read(where, what="logs file"), str(where))
    except LoadError as e:
        raise SubjectError(f"{path}: logs: {e}") from None
    return {**data, "logs": logs.model_dump(exclude_none=True)}


def from_file(path: Path) -> list[Subject]:
    """The subjects a file describes: one, or one per pinned version."""
    data = _with_logs(yamlmodel.read(path, what="subject", error=SubjectError), path)
    spec = yamlmodel.validate(SubjectSpec, data, str(path), error=SubjectError)
    found = [(spec, "")]
    if spec.versions:
        try:
            pinned = versions.listed(spec.versions)
        except KeyError as e:
            raise SubjectError(f"{path}: versions: {e.args[0]}") from None
        assert isinstance(data, dict)  # validate() refused anything else
        found = [(yamlmodel.validate(SubjectSpec, {**_expand(data, v), "name": f"{spec.name}-{v}"},
                                     str(path), error=SubjectError), v)
                 for v in pinned]  # fmt: skip
    out = []
    for s, version in found:
        if not _NAME.fullmatch(s.name):
            raise SubjectError(f"{path}: name: {s.name!r}: expected lower-case letters, "
                               "digits, '-' or '.'")  # fmt: skip
        subject = Subject(s, path, version)
        if s.chart is not None:
            # Rendered when first used (it needs helm, which `make infra` builds); a chart
            # directory of the subject's own must be there now.
            if s.chart.path is not None and not (subject.chart_dir() / "Chart.yaml").is_file():
                raise SubjectError(f"{path}: chart.path: no chart (Chart.yaml) in "
                                   f"{subject.chart_dir()}")  # fmt: skip
        elif not subject.path(s.daemonset or "").is_file():
            raise SubjectError(f"{path}: daemonset: no file {subject.path(s.daemonset or '')}")
        else:
            try:
                subject.daemonset  # noqa: B018 - validates the manifest has one
            except yaml.YAMLError:
                raise SubjectError(f"{path}: daemonset: {s.daemonset} is not valid YAML") from None
        for i, f in enumerate(s.companions):
            if isinstance(f, Chart):
                where = f.directory(path.parent)
                if f.path is not None and not (where / "Chart.yaml").is_file():
                    raise SubjectError(f"{path}: companions[{i}]: no chart (Chart.yaml) in "
                                       f"{where}")  # fmt: skip
                continue
            if not subject.path(f).is_file():
                raise SubjectError(f"{path}: companions: no file {subject.path(f)}")
            try:
                list(yaml.safe_load_all(subject.path(f).read_text()))
            except yaml.YAMLError:
                raise SubjectError(f"{path}: companions: {f} is not valid YAML") from None
        out.append(subject)
    return out


def tier_subjects(subjects: list[Subject]) -> list[Subject]:
    """The subjects the node and container tiers run: all but those `cluster_only`."""
    return [s for s in subjects if s.spec.cluster_only is None]


def cluster_only(subjects: list[Subject]) -> list[str]:
    """One line for each subject the node and container tiers leave out, and why."""
    return [f"{s.name}: cluster tier only: {s.spec.cluster_only}"
            for s in subjects if s.spec.cluster_only is not None]  # fmt: skip


def shipped() -> list[Subject]:
    """The subjects in clusters/subjects/, every pinned version."""
    return [s for p in sorted(SUBJECTS_DIR.glob("*.yaml")) for s in from_file(p)]


def examples() -> list[Subject]:
    """The example plugins' subjects (examples/*/subject.yaml): plugins gpulab did not
    write, tested through the same seam."""
    return [s for p in sorted(EXAMPLES_DIR.glob("*/subject.yaml")) for s in from_file(p)]


def load(name_or_path: str | Path | Subject) -> Subject:
    """A subject by name (a shipped one: gpulab, nvidia = newest pinned, nvidia-v0.17.4)
    or by path to a subject file."""
    if isinstance(name_or_path, Subject):
        return name_or_path
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return from_file(path)[0]
    by_name: dict[str, Subject] = {}
    for p in sorted(SUBJECTS_DIR.glob("*.yaml")):
        found = from_file(p)
        by_name.setdefault(p.stem, found[0])  # the bare name: the newest version
        by_name.update({s.name: s for s in found})
    if str(name_or_path) not in by_name:
        shipped = ", ".join(sorted(by_name))
        raise SubjectError(f"no subject {str(name_or_path)!r} (shipped: {shipped}; or a "
                           "path to a subject file)")  # fmt: skip
    return by_name[str(name_or_path)]


# A lab with fake GPUs and no plugin under test (`subject: none`, `--subject none`): for a
# suite that installs its own (NVIDIA's chart at its default values, say).
NONE = "none"


def _check(v: str) -> str:
    if v == NONE:
        return v
    try:
        load(v)
    except SubjectError as e:
        raise ValueError(str(e)) from None
    return v


# A field naming a subject (lab specs, experiments): validated by loading it.
SubjectName = Annotated[str, AfterValidator(_check)]


def names(value: str) -> list[str]:
    """A comma-separated --subjects value, split."""
    return [v.strip() for v in value.split(",") if v.strip()]
