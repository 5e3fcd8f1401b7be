"""Subjects: the device plugin under test, described in one file (clusters/subjects/*.yaml,
or any path a user passes with SUBJECT= / --subjects).

    name: my-plugin
    image: {build: .}                 # or {ref: my/plugin:1.0} (present in the local engine)
                                      # or {infra: nvidia-{version}} (built by `make infra`)
    daemonset: daemonset.yaml         # its manifest; ${SUBJECT_IMAGE} / ${GPULAB_IMAGE} in it
    # or, instead of daemonset, a Helm chart rendered with `helm template` (clusters/chart.py):
    # chart: {path: chart/, release: my-plugin, namespace: gpu, values: {...}}
    # chart: {go_module: github.com/NVIDIA/k8s-device-plugin@{version},
    #         dir: deployments/helm/nvidia-device-plugin, ...}
    resource: nvidia.com/gpu
    socket: my-plugin.sock            # the socket it creates in the device-plugins dir
    device_ids: {env: NVIDIA_VISIBLE_DEVICES}   # where Allocate puts the device ids
                                      # or {cdi: vendor/class}: CDI devices -> /dev nodes
                                      # or {devices: true, id: "nvidia{minor}"}: device
                                      # specs (/dev nodes) in Allocate's answer
    ready_log: "serving \\d+ devices"            # a line it logs once it serves its devices
    expects:                          # what the suites assert for it
      recovers: true                  # Healthy again after `fakenvml recover`, no restart
      lost_gpu: that-device           # GPU_IS_LOST marks: that-device | every-device
      double_bit_ecc: unhealthy       # unhealthy | ignored (acts on Xid 48 only)
      replicas: 1                     # time-slicing: each GPU advertised N times
      ...

`versions: NVIDIA_PLUGIN_VERSIONS` (a key of clusters/versions.env) makes one subject per
pinned version, named `<name>-<version>`, with `{version}` replaced in its strings; the bare
name stands for the first (newest) one. Paths are relative to the subject file.

Suites read a subject's `expects` instead of branching on plugin names; a scenario whose
`needs` a subject lacks is deselected for it (never skipped).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, model_validator

from clusters import chart, kube, versions
from fakenvml import yamlmodel
from fakenvml.model import Gpu
from fakenvml.yamlmodel import LoadError, Strict

SUBJECTS_DIR = Path(__file__).resolve().parent / "subjects"
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
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


class DeviceIds(Strict):
    """How a container learns which GPUs it got: an env var Allocate fills with the device
    ids, CDI devices Allocate names (`cdi: <vendor>/<class>`), which the runtime turns
    into the GPUs' device nodes (/dev/nvidia<minor>) in the container, or device specs
    Allocate returns itself (`devices: true`: /dev/nvidia<minor> and the control nodes),
    the device ids then following `id` ({minor}, {index} or {uuid} of the GPU)."""

    env: str | None = None
    cdi: str | None = None  # e.g. k8s.device-plugin.nvidia.com/gpu
    # Tentative (to align with the device-spec schema being designed beside it).
    devices: bool = False
    id: str = "{uuid}"  # e.g. nvidia{minor} (GKE's plugin)

    @model_validator(mode="after")
    def _one(self) -> DeviceIds:
        if sum((self.env is not None, self.cdi is not None, self.devices)) != 1:
            raise ValueError("give exactly one of env, cdi, devices")
        if self.id != "{uuid}" and not self.devices:
            raise ValueError("id: only with devices")
        try:
            self.id.format(minor=0, index=0, uuid="GPU-0")
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"id: {self.id!r}: expected text with {{minor}}, {{index}} or "
                             "{uuid}") from None  # fmt: skip
        return self

    def of(self, gpu: Gpu) -> str:
        """The device id a plugin advertises for `gpu` (not time-sliced)."""
        minor = gpu.minor if gpu.minor >= 0 else gpu.index
        return self.id.format(minor=minor, index=gpu.index, uuid=gpu.uuid)


class Expects(Strict):
    """The subject's documented behaviour, which the suites assert."""

    recovers: bool  # Healthy again after `fakenvml recover`, without a restart
    lost_gpu: Literal["that-device", "every-device"]
    double_bit_ecc: Literal["unhealthy", "ignored"]
    preferred_allocation_on_64_gpus: bool  # answers GetPreferredAllocation on 64 GPUs
    health_across_kubelet_restarts: bool  # an Unhealthy GPU stays so after re-registering
    healthcheck_env: bool = True  # honours DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS
    extra_resources: bool = False  # serves the lab spec's extra_resources too
    replicas: int = Field(1, ge=1, le=64)  # time-slicing: each GPU advertised N times
    # With replicas > 1, what a fault on a GPU takes out: all its replicas (health is per
    # GPU) or only one (NVIDIA's: it matches the event's UUID to one replica id).
    xid_marks: Literal["every-replica", "one-replica"] = "every-replica"
    # The MIG strategy it serves (NVIDIA's): a subject with one runs the MIG suites only
    # (e2e/test_mig.py, on the `mig` lab); "none" runs the whole-GPU suites.
    mig: Literal["none", "single", "mixed"] = "none"
    # An Xid on one MIG slice (its GPU and compute instance in the event) marks: that slice
    # (ours), or only if it is the one slice per GPU and resource the plugin keeps in its
    # parent-UUID map (NVIDIA's: the last of its GPU's slices in Go map order, so per
    # start a random one; Xids on the other slices of that GPU are dropped).
    mig_slice_xid: Literal["that-slice", "one-per-gpu"] = "that-slice"

    @property
    def time_sliced(self) -> bool:
        return self.replicas > 1

    @property
    def out_per_faulted_gpu(self) -> int:
        """How many advertised devices one faulted GPU takes out of allocatable."""
        return self.replicas if self.xid_marks == "every-replica" else 1


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


class SubjectSpec(Strict):
    name: str
    description: str = ""
    versions: str | None = None
    image: Image
    daemonset: str | None = None  # its manifest, or
    chart: Chart | None = None  # a Helm chart
    resource: str = "nvidia.com/gpu"
    socket: str
    device_ids: DeviceIds
    ready_log: str
    expects: Expects
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
        self.expects = spec.expects

    def __repr__(self) -> str:
        return f"Subject({self.name!r})"

    def path(self, relative: str) -> Path:
        return (self.source.parent / relative).resolve()

    def chart_dir(self) -> Path:
        """The chart's directory: the subject's own, or inside a Go module in the cache."""
        c = self.spec.chart
        assert c is not None
        if c.path is not None:
            return self.path(c.path)
        assert c.go_module is not None and c.dir is not None
        return chart.module_dir(c.go_module) / c.dir

    @cached_property
    def manifest_text(self) -> str:
        """The manifest as text, images still as ${SUBJECT_IMAGE} etc.: the DaemonSet file,
        or the chart rendered by `helm template` (once per Subject)."""
        if self.spec.daemonset is not None:
            return self.path(self.spec.daemonset).read_text()
        from clusters import infra  # infra imports this module; helm is what it built

        c = self.spec.chart
        assert c is not None
        where = self.chart_dir()
        if not (where / "Chart.yaml").is_file():
            if c.go_module is not None:
                raise infra.InfraMissing(f"subject {self.name}: {c.go_module} is not in the "
                                         f"Go module cache ({where}); run `make infra "
                                         f"SUBJECT={self.source}`")  # fmt: skip
            raise SubjectError(f"{self.source}: chart.path: no chart (Chart.yaml) in {where}")
        try:
            return chart.template(infra.helm(), where, c.release or self.name, c.namespace,
                                  c.values, versions.kube_version())  # fmt: skip
        except chart.ChartError as e:
            raise SubjectError(f"{self.source}: chart: {e}") from None

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

    def trait(self, key: str) -> str:
        """An expectation's value, or a subject property's (`plugin`, `cdi`), as text."""
        have = getattr(self.expects, key) if hasattr(self.expects, key) else getattr(self, key)
        return str(have)

    @property
    def cdi(self) -> bool:
        """Allocate names CDI devices (the runtime makes the device nodes)."""
        return self.spec.device_ids.cdi is not None

    def needs_met(self, needs: tuple[str, ...]) -> bool:
        """Every named expectation (or subject property: `cdi`) is true (or, for
        `lost_gpu=that-device` style, equal)."""
        for need in needs:
            key, _, want = need.partition("=")
            have = self.trait(key)
            if (have != want) if want else have in ("False", "None", "none", "0", ""):
                return False
        return True

    def render(self, images: dict[str, str]) -> list[dict]:
        """The manifest with ${SUBJECT_IMAGE} and ${GPULAB_IMAGE} replaced, and their
        halves ${..._REPOSITORY} and ${..._TAG} (charts take an image in two values)."""
        text = self.manifest_text
        for key, image in images.items():
            repo, tag = chart.split_image(image)
            for k, v in ((f"{key}_REPOSITORY", repo), (f"{key}_TAG", tag), (key, image)):
                text = text.replace("${" + k + "}", v)
        docs = [d for d in yaml.safe_load_all(text) if d]
        for d in docs:
            if d.get("kind") == "DaemonSet" and self.spec.env:
                for c in d["spec"]["template"]["spec"]["containers"]:
                    env = [e for e in c.get("env", []) if e["name"] not in self.spec.env]
                    c["env"] = env + [{"name": k, "value": v} for k, v in self.spec.env.items()]
        return docs


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


def from_file(path: Path) -> list[Subject]:
    """The subjects a file describes: one, or one per pinned version."""
    data = yamlmodel.read(path, what="subject", error=SubjectError)
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
        out.append(subject)
    return out


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


def _check(v: str) -> str:
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
