"""Fault-injection experiments: a scripted scenario on a lab, as a validated YAML file.

    name: xid-storm
    lab: hetero
    subject: gpulab                    # the plugin under test; `--subject` overrides it
    duration: 20s                      # sampling runs from t=0 to here
    settle: 30s                        # then at most this long, until `at: end` holds
    timeline:                          # actions at offsets from t=0
      - {at: 0s, do: create_pod, spec: experiments/gpu-1, name: bystander, node: hetero-worker2}
      - {at: 5s, do: xid, node: hetero-worker, gpu: 3, code: 79, count: 300, over: 1s}
    expect:                            # checked against what was recorded
      - {check: allocatable, node: hetero-worker, equals: 7}            # at: end
      - {check: allocatable, node: hetero-worker2, equals: 4, during: [0s, end]}
      - {check: changes, node: hetero-worker, of: allocatable, equals: 1}
      - {check: plugin_log, node: hetero-worker, event: update, max: 1}
      - {check: pod, name: bystander, phase: Running, during: [4s, end]}

Actions (`do:`): the faults of fakenvml/faults.py (xid, ecc, lost, fallen-off-bus,
recover; their arguments as keys; xid also as a storm, `count` over `over`), create_pod,
delete_pod, restart_kubelet, stop_plugin / start_plugin (on a node), restart_plugin.
Checks (`check:`): allocatable, capacity, changes, plugin_log, pod, devices_healthy,
taints, mig_devices.

A lab with `dra:` (clusters/labs/dra.yaml) runs NVIDIA's DRA driver instead of a device plugin
(`subject:` is not used): `create_pod` makes a ResourceClaimTemplate of `gpus` GPUs (1 by
default) matching the CEL `selector:`, or with `mig: <profile>` (`1g.10gb`) of `gpus` MIG
devices of that profile, and the pod uses a claim from it; `restart_plugin`
restarts the driver's kubelet plugins; the sampler reads every device's taints from the
ResourceSlices, which `taints` (and `changes` `of: tainted`) check. Checks on extended
resources (allocatable, capacity, plugin_log, devices_healthy) have nothing to read there
and are refused. Times are durations in the one
grammar of fakenvml/yamlmodel.py (`500ms`, `2s`, `1.5m` or a number of seconds);
expectations take `at: <time>|end` or `during: [<time>, <time>|end]`; `end` is `duration`,
or with `settle:` the first sample after it where the end state holds (or its bound). A
pod check's window may open at `created`, when its pod's creation returned (the API
server's time, not the timeline's).

`load()` (the shared YAML loader) turns every problem into one ExperimentError line naming
the file and the key; `check_lab()` then checks node names, GPU indexes and pod specs
against the lab spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AliasChoices, Field, create_model, field_validator, model_validator

from clusters.labs import servers
from clusters.labs import spec as labspec
from clusters.labs.serving import NoPlugin
from clusters.subjects.subject import SubjectName
from e2e.pods import SPECS
from fakenvml import faults, mig, yamlmodel
from fakenvml.yamlmodel import Duration, LoadError, Strict, seconds

EXPERIMENTS = Path(__file__).resolve().parent / "experiments"
END = "end"
# A pod check's window may open when its pod's creation returned, not at a time: a pod
# made at 5 s existed at 8 s when the API server was slow (CI of 2026-12-03, dynmig).
CREATED = "created"


class ExperimentError(LoadError):
    """An experiment file that cannot run; one line naming the file and the key."""


def _time_or_end(v: object) -> float | str:
    return END if v == END else seconds(v)


def _bound(v: object) -> float | str:
    """A window's first bound: a time, `end`, or `created` (a pod check's own pod)."""
    return CREATED if v == CREATED else _time_or_end(v)


# -- actions


class _Action(Strict):
    at: Duration

    def describe(self) -> str:
        raise NotImplementedError


class _OnGpu(_Action):
    node: str
    gpu: int = Field(ge=0)


class FaultAction(_OnGpu):
    """A fault of the table (fakenvml/faults.py), `do: <its name>` with its arguments as
    keys; `fault_action` makes one class per row."""

    do: str

    @property
    def fault(self) -> faults.Fault:
        return faults.BY_NAME[self.do]

    def args(self) -> dict[str, object]:
        """What NodeDir.inject takes besides the GPU."""
        return {p.name: getattr(self, p.name) for p in self.fault.params}

    @model_validator(mode="after")
    def _only(self) -> FaultAction:
        try:
            faults.arguments(self.fault, self.args())
        except faults.OnlyWith as e:  # in a file's words: xid: false only with double: true
            value, why = e.param.only[1:]
            mine = _yaml(getattr(self, e.param.name))
            raise ValueError(
                f"{e.param.name}: {mine} only with {e.other.name}: {_yaml(value)} ({why})"
            ) from None
        return self

    def describe(self) -> str:
        text = self.fault.says(self.args()).format(where=f"{self.node} GPU {self.gpu}")
        if self.do in BURSTS and self.count > 1:  # type: ignore[attr-defined]
            return f"{self.count}x {text} over {self.over * 1000:.0f} ms"  # type: ignore[attr-defined]
        return text


class Burst(Strict):
    """`count` of the fault spread evenly over `over` (a storm), or one."""

    count: int = Field(default=1, ge=1, le=100_000)
    over: Duration = 0.0


# Faults an experiment may repeat as a storm (their own params have no `count`).
BURSTS = {"xid"}


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def fault_action(f: faults.Fault) -> type[FaultAction]:
    """The `do: <f.name>` action: FaultAction plus f's params as keys (`Param.aliases`
    read too), and a burst's `count`/`over` where BURSTS says."""
    fields: dict[str, Any] = {"do": (Literal[f.name], ...)}  # type: ignore[valid-type]
    for p in f.params:
        kind = bool if "/" in p.cli or p.cli.startswith("--no-") else int
        default = ... if p.default is faults.REQUIRED else p.default
        limits = {} if kind is bool else {"ge": p.least, "lt": faults.U32}
        alias = AliasChoices(p.name, *p.aliases) if p.aliases else None
        kind = kind if default is not None else kind | None  # type: ignore[assignment]
        fields[p.name] = (kind, Field(default=default, validation_alias=alias, **limits))
    if f.name in BURSTS:
        fields.update({k: (v.annotation, v) for k, v in Burst.model_fields.items()})
    name = "".join(w.title() for w in f.name.split("-"))
    return create_model(name, __base__=FaultAction, __module__=__name__, **fields)


FAULT_ACTIONS: dict[str, type[FaultAction]] = {f.name: fault_action(f) for f in faults.FAULTS}
FAULTS = tuple(FAULT_ACTIONS.values())
Ecc = FAULT_ACTIONS["ecc"]  # the class by the name it had before the table


class CreatePod(_Action):
    """A pod from e2e/specs/<spec>.yaml, inline (`pod:`) or, with neither, a workload pod
    asking for `gpus` (1 unless given); optionally pinned to a node and with its first
    container's GPU count replaced; `count` creates name-1..name-N."""

    do: Literal["create_pod"]
    name: str
    spec: str | None = None
    pod: dict | None = None
    node: str | None = None
    gpus: int | None = Field(default=None, ge=0)
    count: int = Field(default=1, ge=1, le=100)
    selector: str | None = Field(default=None, min_length=1)  # CEL, on a DRA lab's claim
    mig: str | None = Field(default=None, min_length=1)  # MIG devices of this profile (DRA)

    @model_validator(mode="after")
    def _one_source(self) -> CreatePod:
        if self.spec is not None and self.pod is not None:
            raise ValueError("give one of `spec:` (a file under e2e/specs) or `pod:`, not both")
        return self

    @property
    def names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(1, self.count + 1)]

    def describe(self) -> str:
        n = 1 if self.gpus is None else self.gpus
        gpus = f" ({self.gpus} GPUs)" if self.gpus is not None else ""
        if self.mig:
            gpus = f" ({n}x MIG {self.mig})"
        where = f" on {self.node}" if self.node else ""
        which = f" where {self.selector}" if self.selector else ""
        return f"create pod {', '.join(self.names)}{gpus}{where}{which}"


class DeletePod(_Action):
    do: Literal["delete_pod"]
    name: str
    # Not before `at`, and not before this pod runs (at most `settle` later): a step that
    # must follow another pod's start, whose time is the machine's, waits for it.
    once_running: str | None = None

    def describe(self) -> str:
        after = f", once {self.once_running} runs" if self.once_running else ""
        return f"delete pod {self.name}{after}"


class RestartKubelet(_Action):
    do: Literal["restart_kubelet"]
    node: str

    def describe(self) -> str:
        return f"restart kubelet on {self.node}"


class PluginOnNode(_Action):
    """Stop or start the plugin's pod on one node (two verbs: YAML 1.1 reads `on:` as true)."""

    do: Literal["stop_plugin", "start_plugin"]
    node: str

    @property
    def on(self) -> bool:
        return self.do == "start_plugin"

    def describe(self) -> str:
        return f"plugin {'started' if self.on else 'stopped'} on {self.node}"


class RestartPlugin(_Action):
    do: Literal["restart_plugin"]

    def describe(self) -> str:
        return "restart the plugin's pods"


Action = Annotated[
    Union[*FAULTS, CreatePod, DeletePod, RestartKubelet, PluginOnNode, RestartPlugin],
    Field(discriminator="do"),
]


# -- expectations


class _Check(Strict):
    at: float | str | None = None  # a time or `end`; neither at nor during: at the end
    during: tuple[float | str, float | str] | None = None

    @field_validator("at", mode="before")
    @classmethod
    def _at(cls, v: object) -> float | str | None:
        return None if v is None else _time_or_end(v)

    @field_validator("during", mode="before")
    @classmethod
    def _during(cls, v: object) -> tuple[float | str, float | str] | None:
        if v is None:
            return None
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise ValueError(f"{v!r}: expected [from, to], e.g. [0s, end]")
        return _bound(v[0]), _time_or_end(v[1])

    @model_validator(mode="after")
    def _one_window(self) -> _Check:
        if self.during and self.at is not None:
            raise ValueError("give `at:` or `during:`, not both")
        a, b = self.during or (0.0, 0.0)
        if a == CREATED and not isinstance(self, PodPhase):
            raise ValueError("during: [created, ...] opens at a pod's creation: `check: pod` only")
        if a == END or (CREATED not in (a, b) and b != END and float(a) > float(b)):
            raise ValueError(f"during: [{a}, {b}] ends before it starts")
        return self

    @property
    def at_end(self) -> bool:
        return self.during is None and self.at in (None, END)

    def when(self) -> str:
        if self.during:
            a, b = (x if isinstance(x, str) else f"{x:g}s" for x in self.during)
            return f"during [{a}, {b}]"
        return "at end" if self.at in (None, END) else f"at {self.at:g}s"


class _Count(Strict):
    equals: int | None = Field(default=None, ge=0)
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bound(self) -> _Count:
        if self.equals is None and self.min is None and self.max is None:
            raise ValueError("give `equals:`, `min:` or `max:`")
        return self

    def bound(self) -> str:
        if self.equals is not None:
            return f"= {self.equals}"
        parts = ([f"≥ {self.min}"] if self.min is not None else []) + (
            [f"≤ {self.max}"] if self.max is not None else []
        )
        return " and ".join(parts)

    def holds(self, n: int) -> bool:
        return (
            (self.equals is None or n == self.equals)
            and (self.min is None or n >= self.min)
            and (self.max is None or n <= self.max)
        )


class Allocatable(_Check):
    check: Literal["allocatable"]
    node: str
    equals: int = Field(ge=0)

    def describe(self) -> str:
        return f"allocatable of {self.node} = {self.equals} {self.when()}"


class Capacity(_Check):
    check: Literal["capacity"]
    node: str
    equals: int = Field(ge=0)

    def describe(self) -> str:
        return f"capacity of {self.node} = {self.equals} {self.when()}"


class Changes(_Count):
    """How many times the node's value changed in the API during the run."""

    check: Literal["changes"]
    node: str
    of: Literal["allocatable", "capacity", "tainted", "mig_devices"] = "allocatable"

    def describe(self) -> str:
        of = {"tainted": "tainted devices", "mig_devices": "MIG devices"}.get(self.of, self.of)
        return f"{of} of {self.node} changes {self.bound()} times"


class PluginLog(_Count):
    """Lines of the plugin on `node` during the run: `update` (a ListAndWatch update:
    "device marked (un)healthy"), `xid` (an Xid acted on), `registered` (with kubelet)."""

    check: Literal["plugin_log"]
    node: str
    event: Literal["update", "xid", "registered"]

    def describe(self) -> str:
        return f"plugin on {self.node} logs {self.bound()} `{self.event}` lines"


class PodPhase(_Check):
    check: Literal["pod"]
    name: str
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Absent"]
    node: str | None = None

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"pod {self.name} {self.phase}{where} {self.when()}"


class DevicesHealthy(Strict):
    """No pod Running at the end holds a GPU that the plugin had marked Unhealthy before
    the pod was created and that was not recovered before the pod ran."""

    check: Literal["devices_healthy"]

    def describe(self) -> str:
        return "no Running pod holds a GPU that was faulty when it was placed"


class Taints(_Check):
    """How many of `node`'s devices have a taint in the DRA driver's ResourceSlices: all
    its devices, or GPU `gpu`'s; any taint, or only `key`'s (`gpu.nvidia.com/xid`, or its
    last part: `xid`, `gpu-lost`)."""

    check: Literal["taints"]
    node: str
    gpu: int | None = Field(default=None, ge=0)
    key: str | None = Field(default=None, min_length=1)
    equals: int = Field(ge=0)

    def matches(self, taint: str) -> bool:
        """`taint` as clusters.labs.dra.taint_text writes it: key=value:effect."""
        if self.key is None:
            return True
        key = taint.split(":")[0].split("=")[0]
        return key == self.key or key.rsplit("/", 1)[-1] == self.key

    def describe(self) -> str:
        what = f"GPU {self.gpu}" if self.gpu is not None else "devices"
        key = f" ({self.key})" if self.key else ""
        return f"tainted {what} of {self.node}{key} = {self.equals} {self.when()}"


class MigDevices(_Check):
    """How many MIG devices exist on `node` (on its GPU `gpu`, if given) in its fake state:
    what the MIG mode and the GPU and compute instances made through NVML add up to."""

    check: Literal["mig_devices"]
    node: str
    gpu: int | None = Field(default=None, ge=0)
    equals: int = Field(ge=0)

    def describe(self) -> str:
        where = f"{self.node} GPU {self.gpu}" if self.gpu is not None else self.node
        return f"MIG devices on {where} = {self.equals} {self.when()}"


Expectation = Annotated[
    Allocatable | Capacity | Changes | PluginLog | PodPhase | DevicesHealthy | Taints | MigDevices,
    Field(discriminator="check"),
]
# The checks of one moment's samples: an end state a settle can wait for.
SAMPLED = (Allocatable, Capacity, PodPhase, Taints, MigDevices)


class Experiment(Strict):
    name: str
    description: str = ""
    lab: str = "hetero"
    subject: SubjectName = "gpulab"
    duration: Duration
    # An end state reached through a chain whose time is the machine's (a restart, the
    # scheduler's requeue, the kubelet's retry after a failed prepare): after `duration`
    # the run samples on, at most `settle`, until every end expectation read from the
    # samples holds, and ends there. A fixed end either waited out the slowest machine on
    # every run or failed on a loaded one (dra-taints, CI of 2026-12-03).
    settle: Duration = 0.0
    sample_interval: Duration = 0.15
    namespace: str = "gpulab-exp"
    timeline: list[Action] = Field(min_length=1)
    expect: list[Expectation] = Field(default_factory=list)

    @field_validator("sample_interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not 0.05 <= v <= 2.0:
            raise ValueError(f"{v:g}s: sample every 50ms to 2s")
        return v

    @model_validator(mode="after")
    def _fits(self) -> Experiment:
        for i, a in enumerate(self.timeline):
            if a.at > self.duration:
                raise ValueError(f"timeline[{i}] at {a.at:g}s is after duration {self.duration:g}s")
        for i, e in enumerate(self.expect):
            times = [*(e.during or ())] if isinstance(e, _Check) and e.during else []
            times += [e.at] if isinstance(e, _Check) and e.at is not None else []
            if any(not isinstance(t, str) and t > self.duration for t in times):
                raise ValueError(f"expect[{i}] looks past duration {self.duration:g}s")
        if not self.settle and any(isinstance(a, DeletePod) and a.once_running
                                   for a in self.timeline):  # fmt: skip
            raise ValueError("once_running: give `settle:`, the most it may wait")
        if self.settle and not self.settles_on():
            raise ValueError("settle: no expectation at the end reads the samples, so "
                             "nothing to wait for")  # fmt: skip
        names = [n for a in self.timeline if isinstance(a, CreatePod) for n in a.names]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"pod names created twice: {', '.join(dup)}")
        return self

    def settles_on(self) -> list[Expectation]:
        """The expectations a settle waits for: at the end, on what the samples read (the
        counts of a whole run, changes and log lines, are not an end state)."""
        return [e for e in self.expect if isinstance(e, SAMPLED) and e.at_end]

    def actions(self) -> list[Action]:
        """The timeline in time order (stable for equal times)."""
        return sorted(self.timeline, key=lambda a: a.at)

    @property
    def uses_mig(self) -> bool:
        """It asks for MIG devices or checks them: the run samples the fake MIG state."""
        return any(isinstance(a, CreatePod) and a.mig for a in self.timeline) or any(
            isinstance(e, MigDevices) or (isinstance(e, Changes) and e.of == "mig_devices")
            for e in self.expect
        )


def from_dict(data: object, source: str = "experiment") -> Experiment:
    return yamlmodel.validate(Experiment, data, source, error=ExperimentError)


def load(path: str | Path) -> Experiment:
    """An experiment by path, or by name under e2e/experiments/."""
    return yamlmodel.load(Experiment, path, [EXPERIMENTS], what="experiment", error=ExperimentError)


def check_lab(exp: Experiment, source: str = "experiment") -> labspec.Lab:
    """The experiment's lab spec, after checking every node, GPU and pod spec it names."""
    try:
        lab = labspec.load(exp.lab)
    except labspec.SpecError as e:
        raise ExperimentError(f"{source}: lab: {e}") from None
    gpus = {n.name: n.gpu_count for n in lab.gpu_nodes}
    nodes = {n.name for n in lab.nodes}

    def fail(where: str, msg: str) -> None:
        raise ExperimentError(f"{source}: {where}: {msg}")

    def gpu_node(where: str, node: str) -> None:
        if node not in gpus:
            fail(
                where,
                f"node {node!r} has no fake GPUs in lab {exp.lab} "
                f"(GPU nodes: {', '.join(sorted(gpus))})",
            )

    profiles = {mig.short(p.name) for n in lab.gpu_nodes for g in n.gpu_node.gpus  # type: ignore[union-attr]
                for p in g.mig_profiles}  # fmt: skip
    for i, a in enumerate(exp.timeline):
        where = f"timeline[{i}] ({a.do})"
        if isinstance(a, CreatePod) and a.mig and a.mig not in profiles:
            fail(where, f"no GPU of lab {exp.lab} has MIG profile {a.mig!r} "
                        f"({', '.join(sorted(profiles)) or 'none is MIG-capable'})")  # fmt: skip
        if isinstance(a, FAULTS):
            gpu_node(where, a.node)
            if a.gpu >= gpus[a.node]:
                fail(where, f"GPU {a.gpu} not in inventory of node {a.node} (0-{gpus[a.node] - 1})")
        elif isinstance(a, RestartKubelet | PluginOnNode):
            gpu_node(where, a.node)
        elif isinstance(a, CreatePod):
            if a.spec is not None and not (SPECS / f"{a.spec}.yaml").is_file():
                fail(where, f"no pod spec e2e/specs/{a.spec}.yaml")
            if a.node is not None and a.node not in nodes:
                fail(where, f"no node {a.node!r} in lab {exp.lab} ({', '.join(sorted(nodes))})")
    _check_driver(exp, lab, fail)
    created = {n for a in exp.timeline if isinstance(a, CreatePod) for n in a.names}
    for i, a in enumerate(exp.timeline):
        if isinstance(a, DeletePod) and a.name not in created:
            fail(f"timeline[{i}] (delete_pod)", f"pod {a.name!r} is not created by the timeline")
        if isinstance(a, DeletePod) and a.once_running and a.once_running not in created:
            fail(f"timeline[{i}] (delete_pod)", f"once_running: pod {a.once_running!r} is "
                 "not created by the timeline")  # fmt: skip
    for i, e in enumerate(exp.expect):
        where = f"expect[{i}] ({e.check})"
        if isinstance(e, Allocatable | Capacity | Changes | PluginLog | Taints | MigDevices):
            gpu_node(where, e.node)
        if isinstance(e, Taints | MigDevices) and e.gpu is not None and e.gpu >= gpus[e.node]:
            fail(where, f"GPU {e.gpu} not in inventory of node {e.node} (0-{gpus[e.node] - 1})")
        elif isinstance(e, PodPhase) and e.name not in created:
            fail(
                where,
                f"pod {e.name!r} is not created by the timeline "
                f"({', '.join(sorted(created)) or 'none'})",
            )
    return lab


# What an experiment may use on a lab with a device plugin, and on one with a DRA driver.
PLUGIN_ONLY = (Allocatable, Capacity, PluginLog, DevicesHealthy, PluginOnNode)
DRA_ONLY = (Taints,)


def _check_driver(exp: Experiment, lab: labspec.Lab, fail: Callable[[str, str], None]) -> None:
    """Refuse what the lab's kind of driver cannot show: a DRA lab has no extended resource
    (nothing in allocatable, no plugin DaemonSet per node), a device-plugin lab no
    ResourceSlices (no taints, no claims to select with)."""
    server = servers.choose(lab, NoPlugin)  # what serves its GPUs: its signal decides
    by_taints = server.signal == "taints"
    for at, item in [*((f"timeline[{i}]", a) for i, a in enumerate(exp.timeline)),
                    *((f"expect[{i}]", e) for i, e in enumerate(exp.expect))]:  # fmt: skip
        name = getattr(item, "do", None) or getattr(item, "check", "")
        where = f"{at} ({name})"
        if by_taints and isinstance(item, PLUGIN_ONLY):
            fail(where, f"lab {exp.lab} runs {server.words}: no device plugin and no "
                        "extended resource to read (check `taints` or `pod`)")  # fmt: skip
        elif by_taints and isinstance(item, CreatePod) and item.gpus == 0:
            fail(where, "`gpus: 0` on a DRA lab: a claim asks for 1 GPU or more")
        elif by_taints and isinstance(item, Changes) and item.of in ("allocatable", "capacity"):
            fail(where, f"lab {exp.lab} runs {server.words}: count changes `of: tainted` "
                        "or `of: mig_devices`")  # fmt: skip
        elif not by_taints and isinstance(item, DRA_ONLY):
            fail(where, f"lab {exp.lab} runs a device plugin: no device taints (a `dra:` lab has)")
        elif not by_taints and isinstance(item, Changes) and item.of == "tainted":
            fail(where, f"lab {exp.lab} runs a device plugin: no device taints to count")
        elif not by_taints and isinstance(item, CreatePod) and (item.selector or item.mig):
            key = "selector" if item.selector else "mig"
            fail(where, f"lab {exp.lab} runs a device plugin: `{key}:` needs a `dra:` lab")
