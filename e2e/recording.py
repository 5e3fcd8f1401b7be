"""What an experiment run observed, and what follows from it.

A Recording is plain data (JSON in the report directory as recording.json), so reports
can be re-rendered and tested without a cluster. Every time is in seconds since t=0 on
the host's realtime clock: the fault journal's realtime_ns, containerd's log timestamps
(kind nodes share the host's clock) and the sampler's own clock all read it.

Layers of a fault, each found by its own rule:
- injected: the journal record's realtime (exact);
- plugin saw it: the plugin's Xid line (its subject's `logs.xid`; NVIDIA's and ours:
  "XidCriticalError: Xid=N on Device=<uuid>"), matched in order per GPU (one line per Xid
  acted on; ignored Xids have none);
- plugin update: the plugin's update line (`logs.unhealthy`, `logs.healthy`: "device
  marked (un)healthy: <uuid>", one per ListAndWatch update it sends), given to the earliest
  fault on that GPU within ATTRIBUTION_S before it that has none yet (and, for an Xid, whose
  Xid line it logged, where it states one), so a burst's absorbed Xids show no update;
- API: the first node sample after the update whose allocatable moved the expected way
  (down for a fault, up for a recovery); each change is given to one update only. Its
  resolution is the sampling interval.

On a DRA lab (NVIDIA's DRA driver) there is no ListAndWatch and no allocatable: the driver
saw an Xid when it logs "Sending XID=N health event for device <uuid>", and the API layer
is the first sample after the fault in which the GPU's device in the ResourceSlices got a
taint it did not have (or, for a recovery, lost its last one).
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from e2e import experiments as ex
from e2e.experiments import END
from fakenvml import faults
from fakenvml.journal import Kind

ATTRIBUTION_S = 5.0
XID = Kind.XID.spelling  # an Xid's fault is matched to the plugin's Xid lines by its code
# How each record kind a fault appends shows (fakenvml/faults.py): the GPU down, up again
# (a recover) or neither (a single-bit ECC error); and how reports name it.
SHOWN = {k.spelling: s for k, s in faults.shown().items()}
UNHEALTHY_KINDS = {k for k, s in SHOWN.items() if s.health == faults.DOWN}
HEALING_KINDS = {k for k, s in SHOWN.items() if s.health == faults.UP}
FAULT_NAMES = {k: s.label for k, s in SHOWN.items()}


@dataclass
class Fault:
    seq: int
    t: float
    node: str
    gpu: int
    uuid: str
    kind: str  # a fault kind's spelling (fakenvml/journal.py): xid, ecc-double, lost, ...
    data: int = 0  # Xid code, ECC count
    action: int = -1  # index into Recording.actions

    def label(self) -> str:
        name = FAULT_NAMES[self.kind]
        return f"{name} {self.data}" if self.kind == XID else name


@dataclass
class ActionRun:
    index: int
    do: str
    text: str
    at: float  # planned
    start: float
    end: float
    node: str = ""
    error: str = ""


@dataclass
class Sample:
    t: float
    nodes: dict[str, list]  # node -> [capacity, allocatable, resourceVersion]
    pods: dict[str, list]  # pod -> [phase, node]
    # DRA labs: node -> device -> its taints (key=value:effect); untainted devices left out
    taints: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # Experiments that use MIG: node -> the MIG devices in its fake state (the DRA driver's
    # names, clusters.labs.dra.made_mig_devices) -> their GPU's index
    mig: dict[str, dict[str, int]] = field(default_factory=dict)
    # When the pod list was asked for and when it came (s from the start): the phases held
    # at some moment between the two, which may be after `t` (CI: a pod deleted at 30 s
    # already Terminating in a sample stamped 29.95 s, its taints read before the pods).
    pods_at: list[float] | None = None

    def pods_between(self) -> tuple[float, float]:
        return (self.pods_at[0], self.pods_at[1]) if self.pods_at else (self.t, self.t)


@dataclass
class LogLine:
    t: float
    node: str
    event: str  # update | xid | registered | restart
    device: str = ""
    healthy: bool | None = None
    xid: int | None = None
    text: str = ""


@dataclass
class PodInfo:
    name: str
    created: float  # when its creation returned: in the API from here on
    node: str = ""
    phase: str = "Absent"
    reason: str = ""  # status.reason, or the last FailedScheduling message
    devices: list[str] = field(default_factory=list)  # its GPUs' UUIDs (Pods.devices)
    claimed: list[str] = field(default_factory=list)  # its claim's devices (DRA), by name
    deleted: float | None = None  # when a delete_pod action asked for its deletion


@dataclass
class MigChange:
    """A MIG device made or destroyed in a node's fake state (its journal's time)."""

    t: float
    node: str
    device: str  # the DRA driver's name (clusters.labs.dra.mig_device_name)
    gpu: int
    made: bool


@dataclass
class Recording:
    experiment: dict
    plugin: str
    started: str  # ISO time of t=0
    t0_ns: int
    nodes: dict[str, dict]  # node -> {gpus, product, uuids[, devices: {DRA device: GPU}]}
    actions: list[ActionRun] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    log: list[LogLine] = field(default_factory=list)
    pods: list[PodInfo] = field(default_factory=list)
    sample_errors: int = 0
    # How faults showed on the API server: "allocatable" or "taints" (Serving.signal); a
    # recording without it had taints where its nodes name devices apart from GPUs.
    signal: str = ""
    # The plugin's log lines its file does not state (`logs:`: xid, unhealthy, healthy,
    # registered, restart): the report says "not stated" where it would read them.
    unstated_logs: list[str] = field(default_factory=list)
    mig_changes: list[MigChange] = field(default_factory=list)  # where the run samples MIG

    # -- persistence

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> Recording:
        d = json.loads(path.read_text())
        return cls(
            **{
                k: v
                for k, v in d.items()
                if k not in ("actions", "faults", "samples", "log", "pods", "mig_changes")
            },
            actions=[ActionRun(**a) for a in d["actions"]],
            # Older recordings spelled some kinds differently (ecc_dbe): read them as now.
            faults=[Fault(**{**f, "kind": Kind.named(f["kind"]).spelling}) for f in d["faults"]],
            samples=[Sample(**s) for s in d["samples"]],
            log=[LogLine(**x) for x in d["log"]],
            pods=[PodInfo(**p) for p in d["pods"]],
            mig_changes=[MigChange(**c) for c in d.get("mig_changes", [])],
        )

    def stated(self, event: str) -> bool:
        """Whether the plugin's log lines of `event` (update | xid | registered | restart)
        are stated: an update is, where either of its lines (unhealthy, healthy) is."""
        keys = ("unhealthy", "healthy") if event == "update" else (event,)
        return any(k not in self.unstated_logs for k in keys)

    @property
    def spec(self) -> ex.Experiment:
        return ex.Experiment.model_validate(self.experiment)

    @property
    def end(self) -> float:
        return self.samples[-1].t if self.samples else 0.0

    @property
    def by_taints(self) -> bool:
        """Faults showed as device taints (a DRA driver's ResourceSlices), not as a Node's
        allocatable: what the report draws and tabulates."""
        if self.signal:
            return self.signal == "taints"
        return any("devices" in info for info in self.nodes.values())

    @property
    def measure(self) -> str:
        """What a node's series follows by default: allocatable, or where faults show as
        taints the number of tainted devices."""
        return "tainted" if self.by_taints else "allocatable"

    # -- reading the samples

    @staticmethod
    def value(s: Sample, node: str, what: str = "allocatable") -> int | None:
        """The node's capacity, allocatable, count of tainted devices or of MIG devices in
        one sample."""
        if what == "mig_devices":
            return len(s.mig[node]) if node in s.mig else None
        if node not in s.nodes:
            return None
        if what == "tainted":
            return len(s.taints.get(node, {}))
        return s.nodes[node][0 if what == "capacity" else 1]

    def series(self, node: str, what: str = "") -> list[tuple[float, int]]:
        """(t, value) at every sample where the node's value (`measure` unless named)
        changed (the first included)."""
        out: list[tuple[float, int]] = []
        for s in self.samples:
            v = self.value(s, node, what or self.measure)
            if v is not None and (not out or v != out[-1][1]):
                out.append((s.t, v))
        return out

    def device_taints(self, s: Sample, node: str, gpu: int) -> list[str]:
        """GPU `gpu`'s taints on a DRA lab (every device made of it: a MIG GPU has many)."""
        devices = self.nodes[node].get("devices", {})
        return [t for d, ts in s.taints.get(node, {}).items() if devices.get(d) == gpu for t in ts]

    def node_writes(self, node: str) -> int:
        """Updates of the Node object seen during the run (resourceVersion changes)."""
        rvs = [s.nodes[node][2] for s in self.samples if node in s.nodes]
        return sum(1 for a, b in itertools.pairwise(rvs) if a != b)

    def pod_phases(self, pod: str) -> list[tuple[float, str, str]]:
        """(t, phase, node) at every change; phase Absent where the pod did not exist."""
        out: list[tuple[float, str, str]] = []
        for s in self.samples:
            phase, node = s.pods.get(pod, ["Absent", ""])
            if not out or (phase, node) != out[-1][1:]:
                out.append((s.t, phase, node))
        return out

    def gpu_of(self, uuid: str) -> tuple[str, int] | None:
        base = uuid.split("::")[0]
        for node, info in self.nodes.items():
            if base in info["uuids"]:
                return node, info["uuids"].index(base)
        return None

    def pod_names(self) -> list[str]:
        names = [p.name for p in self.pods]
        for s in self.samples:
            names += [n for n in s.pods if n not in names]
        return names


# -- per-fault layers


@dataclass
class Trace:
    fault: Fault
    seen: float | None = None  # plugin's Xid line
    update: float | None = None  # plugin's ListAndWatch update line
    api: float | None = None  # allocatable changed in the API
    api_value: tuple[int, int] | None = None  # (before, after)
    taint: str = ""  # DRA: the taints the device got (or "none": all gone)

    @property
    def to_plugin(self) -> float | None:
        return None if self.update is None else self.update - self.fault.t

    @property
    def to_api(self) -> float | None:
        return None if self.api is None or self.update is None else self.api - self.update

    @property
    def total(self) -> float | None:
        return None if self.api is None else self.api - self.fault.t


def traces(rec: Recording) -> list[Trace]:
    # Time order: seq numbers are per node journal.
    out = [Trace(f) for f in sorted(rec.faults, key=lambda f: (f.t, f.node, f.seq))]
    by_gpu: dict[tuple[str, str], list[Trace]] = {}
    for tr in out:
        by_gpu.setdefault((tr.fault.node, tr.fault.uuid), []).append(tr)

    lines = sorted(rec.log, key=lambda x: x.t)
    for ln in lines:
        if ln.event != "xid":
            continue
        base = ln.device.split("::")[0]
        cands = [
            tr
            for tr in by_gpu.get((ln.node, base), [])
            if tr.fault.kind == XID
            and tr.fault.data == ln.xid
            and tr.seen is None
            and tr.fault.t <= ln.t + 0.005
        ]
        if cands:
            cands[0].seen = ln.t
    if rec.by_taints:
        _taint_layer(rec, out)
        return out
    xids = rec.stated("xid")  # an Xid's update follows its Xid line, where one is stated
    for ln in lines:
        if ln.event != "update" or ln.healthy is None:
            continue
        base = ln.device.split("::")[0]
        want = HEALING_KINDS if ln.healthy else UNHEALTHY_KINDS
        cands = [
            tr
            for tr in by_gpu.get((ln.node, base), [])
            if tr.fault.kind in want
            and tr.update is None
            and 0 <= ln.t - tr.fault.t + 0.005 <= ATTRIBUTION_S
            and (tr.fault.kind != XID or tr.seen is not None or not xids)
        ]
        if cands:
            cands[0].update = ln.t

    claimed: set[tuple[str, float]] = set()
    for tr in out:
        if tr.update is None:
            continue
        node, down = tr.fault.node, tr.fault.kind not in HEALING_KINDS
        before = rec_value(rec, node, tr.update)
        for t, v in rec.series(node):
            if t <= tr.update or (node, t) in claimed or before is None:
                continue
            if (v < before) if down else (v > before):
                tr.api, tr.api_value = t, (before, v)
                claimed.add((node, t))
            break
    return out


def _taint_layer(rec: Recording, out: list[Trace]) -> None:
    """A DRA lab's API layer: the first sample after each fault in which its GPU's device
    has a taint it did not have at the fault (a recovery: has none left). A change is
    given to one fault only, so of a burst only the first shows it."""
    claimed: set[tuple[str, int, float]] = set()
    for tr in out:
        f = tr.fault
        baseline: set[str] | None = None
        for s in rec.samples:
            if f.node not in s.nodes:
                continue
            now = set(rec.device_taints(s, f.node, f.gpu))
            if s.t <= f.t or baseline is None:
                baseline = now
                continue
            new = now - baseline
            hit = (baseline and not now) if f.kind in HEALING_KINDS else bool(new)
            if not hit:
                continue
            if (f.node, f.gpu, s.t) not in claimed:
                claimed.add((f.node, f.gpu, s.t))
                tr.api, tr.taint = s.t, ", ".join(sorted(new)) or "none"
                tr.api_value = (
                    rec_value(rec, f.node, f.t) or 0,
                    rec.value(s, f.node, "tainted") or 0,
                )
            break


@dataclass
class MigLife:
    """One claimed MIG device of a pod, timed from the node's journal: made after the pod
    was created, gone after its deletion was asked for (None: not in the run)."""

    pod: str
    device: str
    node: str
    created: float
    made: float | None
    running: float | None
    deleted: float | None
    gone: float | None


def mig_lives(rec: Recording) -> list[MigLife]:
    """Every MIG device a pod's claim was given, in pod order: made at its first making
    after the pod's creation and after the previous holder's device of that placement was
    gone (one placement, one holder at a time: under load a second pod was created before
    the first pod's device was made, and took that making for its own), gone at its first
    destruction after the pod's deletion was asked for."""
    out = []
    free_from: dict[tuple[str, str], float] = {}  # (node, device) -> its last holder's gone
    for p in rec.pods:  # in creation order (the runner records them as each one returns)
        phases = rec.pod_phases(p.name)
        node = next((n for _, _, n in phases if n), p.node)
        running = next((t for t, ph, _ in phases if ph == "Running"), None)
        for dev in p.claimed:
            if "-mig-" not in dev:
                continue
            changes = [c for c in rec.mig_changes if (c.node, c.device) == (node, dev)]
            since = max(p.created, free_from.get((node, dev), p.created))
            made = next((c.t for c in changes if c.made and c.t >= since), None)
            gone = None
            if p.deleted is not None:
                gone = next((c.t for c in changes if not c.made and c.t >= p.deleted), None)
            if gone is not None:
                free_from[(node, dev)] = gone
            out.append(MigLife(p.name, dev, node, p.created, made, running, p.deleted, gone))
    return out


def rec_value(rec: Recording, node: str, t: float, what: str = "") -> int | None:
    """The node's value (`rec.measure` unless named) in the last sample at or before t."""
    val = None
    for s in rec.samples:
        if s.t > t:
            break
        if (v := rec.value(s, node, what or rec.measure)) is not None:
            val = v
    return val


@dataclass
class Disruption:
    """A kubelet restart or plugin stop/start/restart: the node's allocatable in the API
    before it, at its first change after it, at its lowest, and where it settled."""

    action: ActionRun
    node: str
    before: int | None
    changed: tuple[float, int] | None = None
    low: int | None = None
    settled: tuple[float, int] | None = None
    registered: float | None = None


def disruptions(rec: Recording) -> list[Disruption]:
    kinds = ("restart_kubelet", "stop_plugin", "start_plugin", "restart_plugin")
    acts = [a for a in rec.actions if a.do in kinds]
    out = []
    for i, a in enumerate(acts):
        for node in [a.node] if a.node else list(rec.nodes):
            # Up to the next disruption of the same node: its changes are that one's.
            until = next((b.start for b in acts[i + 1 :] if not b.node or b.node == node),
                         float("inf"))  # fmt: skip
            d = Disruption(a, node, rec_value(rec, node, a.start))
            after = [(t, v) for t, v in rec.series(node) if a.start < t <= until]
            if after:
                d.changed, d.settled = after[0], after[-1]
                d.low = min(v for _, v in after)
            d.registered = next(
                (x.t for x in rec.log
                 if x.node == node and x.event == "registered" and a.start <= x.t <= until),
                None,
            )  # fmt: skip
            out.append(d)
    return out


Stats = tuple[int, float, float, float]  # n, min, median, max (ms)


def layer_stats(trs: list[Trace], by_taints: bool = False) -> dict[str, Stats | None]:
    """n, min, median, max in ms for each layer, over the faults that reached it."""
    out: dict[str, Stats | None] = {}
    layers = (
        ("injected → driver's Xid line", lambda t: None if t.seen is None else t.seen - t.fault.t),
        ("injected → device taint in API", lambda t: t.total),
    ) if by_taints else (
        ("injected → plugin update", lambda t: t.to_plugin),
        ("plugin update → API allocatable", lambda t: t.to_api),
        ("injected → API allocatable", lambda t: t.total),
    )  # fmt: skip
    for name, get in layers:
        xs = [v * 1000 for tr in trs if (v := get(tr)) is not None]
        out[name] = (len(xs), min(xs), statistics.median(xs), max(xs)) if xs else None
    return out


# -- expectations


@dataclass
class Outcome:
    passed: bool
    text: str
    observed: str


def _window(rec: Recording, e: ex._Check) -> tuple[float, float]:
    def t(x: float | str) -> float:
        if x == ex.CREATED and isinstance(e, ex.PodPhase):  # check_lab: the timeline makes it
            return next((p.created for p in rec.pods if p.name == e.name), rec.end)
        return rec.end if x == END else float(x)

    if e.during:
        return t(e.during[0]), t(e.during[1])
    at = END if e.at is None else e.at
    return t(at), t(at)


def _values(rec: Recording, e: ex._Check, get, pods: bool = False) -> list[tuple[float, object]]:  # type: ignore[no-untyped-def]
    """The values in force over the expectation's window: the one at its start, then
    every sample inside it. A window opened at a pod's creation starts at the first sample
    taken after it: one from before cannot have seen the pod. Pod phases (`pods`) count by
    the time their list was read: one read across an edge of the window is left out, as it
    may show the state on either side."""
    a, b = _window(rec, e)
    first = None
    inside = []
    at_creation = bool(e.during) and e.during[0] == ex.CREATED  # type: ignore[index]
    for s in rec.samples:
        sent, came = s.pods_between() if pods else (s.t, s.t)
        if sent < a and at_creation:
            continue
        if came <= a:
            first = (s.t, get(s))
        elif sent > a and came <= b:
            inside.append((s.t, get(s)))
    return ([first] if first else []) + inside


def evaluate(rec: Recording, expectations: list[ex.Expectation] | None = None) -> list[Outcome]:
    """Every expectation's outcome (or those given: a settle's, on the samples so far)."""
    return [_evaluate(rec, e) for e in (rec.spec.expect if expectations is None else expectations)]


def _evaluate(rec: Recording, e: ex.Expectation) -> Outcome:
    if isinstance(e, ex.Allocatable | ex.Capacity):
        i = 0 if isinstance(e, ex.Capacity) else 1
        return _equals(rec, e, lambda s: s.nodes.get(e.node, [None, None])[i])
    if isinstance(e, ex.Taints):
        return _equals(rec, e, lambda s: _tainted(rec, s, e))
    if isinstance(e, ex.MigDevices):
        return _equals(rec, e, lambda s: _mig_count(s, e))
    if isinstance(e, ex.Changes):
        series = rec.series(e.node, e.of)
        n = len(series) - 1
        vals = " → ".join(
            f"{v}" if i == 0 else f"{v} at {t:.2f}s" for i, (t, v) in enumerate(series)
        )
        obs = f"{max(n, 0)} ({vals})"
        if not e.holds(n):  # what a count taken from samples can miss: their gaps, the faults'
            gaps = ((b.t - a.t, a.t) for a, b in itertools.pairwise(rec.samples))
            gap, at = max(gaps, default=(0.0, 0.0))
            faults = ", ".join(f"{f.label()} on GPU {f.gpu} at {f.t:.2f}s"
                               for f in rec.faults if f.node == e.node)  # fmt: skip
            obs += f"; longest sample gap {gap:.2f}s from {at:.2f}s; faults: {faults or 'none'}"
        return Outcome(e.holds(n), e.describe(), obs)
    if isinstance(e, ex.PluginLog):
        if not rec.stated(e.event):
            return Outcome(False, e.describe(), "not stated: its subject file has no such "
                           "line (logs:)")  # fmt: skip
        n = sum(
            1 for x in rec.log if x.node == e.node and x.event == e.event and 0 <= x.t <= rec.end
        )
        return Outcome(e.holds(n), e.describe(), str(n))
    if isinstance(e, ex.PodPhase):
        vals = _values(rec, e, lambda s: tuple(s.pods.get(e.name, ["Absent", ""])), pods=True)
        if not vals:
            return Outcome(False, e.describe(), "no samples in that window")
        bad = [(t, v) for t, v in vals if v[0] != e.phase or (e.node and v[1] != e.node)]
        last = vals[-1][1]
        obs = f"{last[0]}" + (f" on {last[1]}" if last[1] else "")
        if bad:
            t, v = bad[0]
            obs = f"{v[0]}{' on ' + v[1] if v[1] else ''} at {t:.2f}s"
            info = next((p for p in rec.pods if p.name == e.name), None)
            if info and info.reason:
                obs += f" ({info.reason})"
        return Outcome(not bad, e.describe(), obs)
    if isinstance(e, ex.DevicesHealthy):
        return _devices_healthy(rec, e)
    raise TypeError(f"unknown expectation {e!r}")


def _equals(rec: Recording, e: ex.Allocatable | ex.Capacity | ex.Taints | ex.MigDevices,
            get: Callable[[Sample], int | None]) -> Outcome:  # fmt: skip
    """A node's value equals `e.equals` at every sample of the window."""
    vals = _values(rec, e, get)
    if not vals:
        return Outcome(False, e.describe(), "no samples in that window")
    bad = [(t, v) for t, v in vals if v != e.equals]
    seen = sorted({v for _, v in vals}, key=str)
    obs = ", ".join(map(str, seen))
    if bad and e.during:
        obs += f" (first {bad[0][1]} at {bad[0][0]:.2f}s)"
    return Outcome(not bad, e.describe(), obs)


def _tainted(rec: Recording, s: Sample, e: ex.Taints) -> int | None:
    """How many of the node's devices (or 1/0 for its GPU `e.gpu`) have a taint `e` counts."""
    if e.node not in s.nodes:
        return None
    if e.gpu is not None:
        return int(any(e.matches(t) for t in rec.device_taints(s, e.node, e.gpu)))
    return sum(any(e.matches(t) for t in ts) for ts in s.taints.get(e.node, {}).values())


def _mig_count(s: Sample, e: ex.MigDevices) -> int | None:
    if e.node not in s.mig:
        return None
    return sum(1 for gpu in s.mig[e.node].values() if e.gpu is None or gpu == e.gpu)


def _devices_healthy(rec: Recording, e: ex.DevicesHealthy) -> Outcome:
    """A GPU counts as faulty from the plugin's first Unhealthy update for it until a
    `recover` reaches its hardware. A plugin or kubelet restart does not make it healthy:
    the hardware is as broken as before, whatever a fresh plugin believes."""
    bad, checked = [], 0
    for p in rec.pods:
        if p.phase != "Running" or not p.devices:
            continue
        running = next((t for t, ph, _ in rec.pod_phases(p.name) if ph == "Running"), rec.end)
        checked += 1
        for dev in p.devices:
            base = dev.split("::")[0]
            where = rec.gpu_of(base)
            marked = [
                x.t
                for x in rec.log
                if x.event == "update"
                and x.healthy is False
                and x.device.split("::")[0] == base
                and x.t <= p.created
            ]
            if not marked or where is None:
                continue
            recovered = any(
                f.kind in HEALING_KINDS and (f.node, f.gpu) == where and marked[-1] < f.t <= running
                for f in rec.faults
            )
            if not recovered:
                bad.append(
                    f"{p.name} got {where[0]} GPU {where[1]}, Unhealthy since {marked[-1]:.2f}s"
                )
    if not checked:
        return Outcome(False, e.describe(), "no Running pod with devices to check")
    obs = "; ".join(bad) if bad else f"{checked} Running pods, none holds a faulty GPU"
    return Outcome(not bad, e.describe(), obs)
