"""Run an experiment on a lab: reset, sample, play the timeline, collect, reset.

    lab = Lab("hetero", subject="gpulab").up()
    rec = Runner(experiments.load("xid-storm"), lab).run()

The timeline plays in this thread at its offsets; a sampler thread reads every GPU
node's capacity/allocatable and the experiment's pods from the API every
`sample_interval`. Plugin logs are read with containerd's timestamps, before a plugin pod
goes away and at the end. Before and after, every GPU faulted is recovered, plugins are
back on their nodes and the experiment's pods are gone, so runs do not leak into each
other.

What serves the lab's GPUs (`lab.serving`, clusters/labs/serving.py) is asked, never branched
on: how a pod asks for GPUs (NVIDIA's DRA driver: a claim from a ResourceClaimTemplate per
create_pod), what it was given, where faults show (a driver whose signal is taints: the
sampler reads its ResourceSlices too) and how the lab heals (clusters/labs/serving.py `heal`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from clusters.labs import dra
from clusters.labs.lab import RESOURCE, Lab
from clusters.steps import StepError
from clusters.subjects.subject import LOG_RESOURCE, Logs
from clusters.subjects.subject import load as load_subject
from e2e import experiments as ex
from e2e.pods import Pods, load_spec
from e2e.recording import (
    ActionRun,
    Fault,
    LogLine,
    MigChange,
    PodInfo,
    Recording,
    Sample,
    evaluate,
)
from fakenvml.journal import Record

# The order a line is tried in (one line is one event): updates, then Xids, then the rest.
ORDER = ("unhealthy", "healthy", "xid", "registered", "restart")


def parse_log(
    text: str, node: str, t0_ns: int, logs: Logs, resource: str = RESOURCE
) -> list[LogLine]:
    """The lines that mark a layer, from `kubectl logs --timestamps` output, as `logs` (what
    serves the GPUs states them: a subject's `logs:`, the DRA driver's) says they read; a
    registration counts only for `resource` where the line names one."""
    rules = [(k, p) for k in ORDER if (p := logs.pattern(k)) is not None]
    out = []
    for raw in text.splitlines():
        stamp, _, line = raw.partition(" ")
        t_ns = _stamp_ns(stamp)
        if t_ns is None:
            continue
        t = (t_ns - t0_ns) / 1e9
        found = next(((k, m) for k, p in rules if (m := p.search(line))), None)
        if found is None:
            continue
        key, m = found
        said = line.strip()
        if key in ("unhealthy", "healthy"):
            out.append(LogLine(t, node, "update", m["dev"], key == "healthy", text=said))
        elif key == "xid":
            out.append(LogLine(t, node, "xid", m["dev"], xid=int(m["xid"]), text=said))
        elif key == "registered":
            if m.groupdict().get(LOG_RESOURCE) in (None, resource):
                out.append(LogLine(t, node, "registered", text=said))
        else:
            out.append(LogLine(t, node, "restart", text=said))
    return out


def _stamp_ns(stamp: str) -> int | None:
    """RFC 3339 with nanoseconds (containerd's) -> epoch ns; None for anything else."""
    if len(stamp) < 20 or stamp[-1] != "Z":
        return None
    try:
        secs = datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    frac = stamp[20:-1] if stamp[19] == "." else ""
    return int(secs.timestamp()) * 10**9 + int((frac + "000000000")[:9] or 0)


class Sampler(threading.Thread):
    """Polls the API (its own client: the kubernetes client is not shared across threads)."""

    def __init__(self, lab: Lab, nodes: list[str], namespace: str, interval: float, t0_ns: int,
                 mig_of: list[str] | None = None) -> None:  # fmt: skip
        super().__init__(name="sampler", daemon=True)
        # The nodes whose fake MIG state each sample reads too (files on this host).
        self.mig_of = {n: lab.fake_gpus(n) for n in mig_of or []}
        self.api = config.new_client_from_config(str(lab.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.serving = lab.serving
        self.nodes, self.ns, self.interval, self.t0_ns = set(nodes), namespace, interval, t0_ns
        self.resource = lab.serving.resource
        self.samples: list[Sample] = []
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            self._sample()
            next_at += self.interval
            # A slow API must not make samples pile up: skip the slots already missed.
            next_at = max(next_at, time.monotonic())
            self.stop.wait(next_at - time.monotonic())

    def _sample(self) -> None:
        """One read of the timed layer first, then the rest. Where the signal is the
        nodes' allocatable, the node list times it, stamped at its request's middle. Where
        it is taints, their read does, stamped when its answer arrived: under load a sample
        can take longer than its interval, and a slice list read after the stamp showed a
        taint "before" its fault (CI: a GPU-lost taint stamped 0.3 s before the loss). The
        MIG state is read before that stamp (a device is never seen early), and a taint-less
        sample that reads it is stamped after it too."""
        try:
            by_taints = self.serving.signal == "taints"
            found = self.serving.taints(self.api) if by_taints else {}
            made = {n: dra.made_mig_devices(d) for n, d in self.mig_of.items()}
            stamp = time.time_ns() if by_taints or made else 0
            a = time.time_ns()
            nodes = self.core.list_node(_request_timeout=5).items
            b = time.time_ns()
            pods = self.core.list_namespaced_pod(self.ns, _request_timeout=5).items
            c = time.time_ns()
        except Exception:  # an API hiccup is a gap in the samples, not a failed run
            self.errors += 1
            return
        seen = {}
        for n in nodes:
            if n.metadata.name in self.nodes:
                cap = int((n.status.capacity or {}).get(self.resource, 0))
                alloc = int((n.status.allocatable or {}).get(self.resource, 0))
                seen[n.metadata.name] = [cap, alloc, n.metadata.resource_version]
        phases = {}
        for p in pods:
            phase = "Terminating" if p.metadata.deletion_timestamp else p.status.phase
            phases[p.metadata.name] = [phase, p.spec.node_name or ""]
        taints = {n: d for n, d in found.items() if n in self.nodes}

        def rel(ns: float) -> float:
            return round((ns - self.t0_ns) / 1e9, 4)

        self.samples.append(Sample(rel(stamp or (a + b) / 2), seen, phases, taints, made,
                                   pods_at=[rel(b), rel(c)]))  # fmt: skip


class Runner:
    def __init__(
        self, exp: ex.Experiment, lab: Lab, console: Console | None = None, reset_after: bool = True
    ) -> None:
        self.exp, self.lab = exp, lab
        self.console = console or Console(stderr=True)
        self.reset_after = reset_after
        self.gpu_nodes = [n.name for n in lab.lab.gpu_nodes]
        self.pods = Pods.of(lab, exp.namespace)
        self.logs: dict[str, tuple[str, str]] = {}  # pod uid -> (node, text)
        self.created: dict[str, float] = {}
        self.deleted: dict[str, float] = {}  # pod -> when delete_pod asked
        self.claimed: dict[str, list[str]] = {}  # pod -> its claim's devices, read at delete
        self.t0_ns = 0
        self._stop = threading.Event()
        self.serving = lab.serving

    # -- the run

    def run(self) -> Recording:
        exp = self.exp
        if self.serving.switches and self.serving.name != load_subject(exp.subject).name:
            self.lab.use_subject(exp.subject)
            self.serving = self.lab.serving
        self._say(f"Experiment {exp.name} on {self.lab.name} with {self.serving.words}")
        self._reset("before the run")
        rec = Recording(exp.model_dump(mode="json"), self.serving.recorded, "", 0,
                        self._inventories(), signal=self.serving.signal,
                        unstated_logs=self.serving.logs.unstated)  # fmt: skip
        self.t0_ns = time.time_ns()
        rec.t0_ns = self.t0_ns
        rec.started = datetime.fromtimestamp(self.t0_ns / 1e9, UTC).isoformat(timespec="seconds")
        sampler = Sampler(self.lab, self.gpu_nodes, exp.namespace, exp.sample_interval,
                          self.t0_ns, self.gpu_nodes if exp.uses_mig else None)  # fmt: skip
        sampler.start()
        self.sampler = sampler
        try:
            for i, action in enumerate(exp.actions()):
                self._until(action.at)
                rec.actions.append(self._play(i, action, rec))
            self._until(exp.duration)
            self._settle(rec)
        finally:
            sampler.stop.set()
            sampler.join(timeout=10)
        rec.samples, rec.sample_errors = sampler.samples, sampler.errors
        self._say(f"t={self._now():.1f}s: collecting plugin logs and pods")
        self._snapshot_logs()
        rec.log = sorted(
            (
                ln
                for node, text in self.logs.values()
                for ln in parse_log(
                    text, node, self.t0_ns, self.serving.logs, self.serving.resource
                )
                if ln.t >= 0
            ),
            key=lambda x: x.t,
        )
        rec.pods = self._pod_infos()
        rec.mig_changes = [
            MigChange(round((t_ns - self.t0_ns) / 1e9, 4), node, name, gpu, made)
            for node, d in sampler.mig_of.items()
            for t_ns, name, gpu, made in dra.mig_device_changes(d, self.t0_ns)
        ]
        if self.reset_after:
            self._reset("after the run")
        return rec

    def _settle(self, rec: Recording) -> None:
        """Past `duration`, sample on until the end expectations hold (exp.settle)."""
        exp, waits = self.exp, self.exp.settles_on()
        if not exp.settle:
            return

        def left(samples: list[Sample]) -> str:
            rec.samples = samples
            return "; ".join(o.text for o in evaluate(rec, waits) if not o.passed)

        if still := self._sampled_until(left, exp.duration + exp.settle):
            self._say(f"t={self._now():.1f}s: settle over, still not: {still}")
        else:
            self._say(f"t={self._now():.1f}s: the end state holds")

    def _wait_running(self, pod: str) -> None:
        """Until the sampler last saw `pod` Running, at most exp.settle."""

        def left(samples: list[Sample]) -> str:
            running = samples and samples[-1].pods.get(pod, [""])[0] == "Running"
            return "" if running else f"pod {pod} Running"

        if self._sampled_until(left, self._now() + self.exp.settle):
            self._say(f"t={self._now():.1f}s: {pod} not Running after {self.exp.settle:g}s; "
                      "going on")  # fmt: skip

    def _sampled_until(self, left: Callable[[list[Sample]], str], until: float) -> str:
        """Until `left(the samples so far)` says nothing is left, or the clock reaches
        `until` (the run's time); what was still left then. Says what it waits for."""
        said = ""
        while (still := left(list(self.sampler.samples))) and self._now() < until:
            if still != said:
                said = still
                self._say(f"t={self._now():.1f}s: waiting (until {until:g}s) for {said}")
            self._stop.wait(self.exp.sample_interval)
        return still

    def _now(self) -> float:
        return (time.time_ns() - self.t0_ns) / 1e9

    def _until(self, at: float) -> None:
        """Wait for a point on the timeline (a schedule, not a condition)."""
        self._stop.wait(max(0.0, at - self._now()))

    def _say(self, msg: str) -> None:
        self.console.print(f"[bold]•[/] {msg}")

    # -- actions

    def _play(self, i: int, a: ex.Action, rec: Recording) -> ActionRun:
        start = self._now()
        late = start - a.at
        self._say(
            f"t={start:6.2f}s {a.describe()}"
            + (f" [yellow](+{late:.1f}s late)[/]" if late > 0.5 else "")
        )
        run = ActionRun(i, a.do, a.describe(), a.at, start, start, getattr(a, "node", "") or "")
        try:
            self._do(a, i, rec)
        except (ApiException, StepError, OSError, ValueError) as e:
            run.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self.console.print(f"[red]✗[/] {a.describe()}: {run.error}")
        run.end = self._now()
        return run

    def _do(self, a: ex.Action, i: int, rec: Recording) -> None:
        if isinstance(a, ex.FaultAction):
            self._inject(a, i, rec)
        elif isinstance(a, ex.CreatePod):
            self.serving.ask(self.lab.ctx, self.exp.namespace, a.name, a.selector, a.gpus or 1,
                             a.mig)  # fmt: skip
            for name in a.names:
                self.pods.create(self._pod_doc(a, name))
                self.created[name] = self._now()  # it exists from here, however slow the API
        elif isinstance(a, ex.DeletePod):
            if a.once_running:
                self._wait_running(a.once_running)
            # What its claim holds is gone from the API with it: read it first.
            if (pod := self.pods.find(a.name)) is not None:
                self.claimed[a.name] = self.serving.claimed(self.lab.ctx, self.exp.namespace, pod)
            self.deleted[a.name] = self._now()
            self.lab.core.delete_namespaced_pod(a.name, self.exp.namespace,
                                                grace_period_seconds=self.pods.grace_s)  # fmt: skip
        elif isinstance(a, ex.RestartKubelet):
            self.lab.node_exec(a.node, "systemctl", "restart", "kubelet")
        elif isinstance(a, ex.PluginOnNode):
            if not a.on:
                self._snapshot_logs(a.node)  # the pod's log goes with it
            self.lab.set_plugin_on(a.node, a.on)
        elif isinstance(a, ex.RestartPlugin):
            self._snapshot_logs()  # the old pods' logs go with them
            self.lab.restart_plugin()

    def _inject(self, a: ex.FaultAction, i: int, rec: Recording) -> None:
        """The fault through NodeDir.inject (fakenvml/faults.py); a storm's `count` spread
        evenly over `over`. Each injection's own record is the recording's fault."""
        d = self.lab.fake_gpus(a.node)
        count, over = getattr(a, "count", 1), getattr(a, "over", 0.0)
        count = count if a.do in ex.BURSTS else 1  # an ECC's `count` is its error count
        start = time.monotonic()
        step = over / (count - 1) if count > 1 else 0.0
        for k in range(count):
            self._stop.wait(max(0.0, start + k * step - time.monotonic()))
            r = d.inject(a.do, a.gpu, **a.args())[0]
            rec.faults.append(self._fault(r, a.node, i, rec))

    def _fault(self, r: Record, node: str, i: int, rec: Recording) -> Fault:
        uuid = rec.nodes[node]["uuids"][r.gpu]
        return Fault(
            r.seq,
            (r.realtime_ns - self.t0_ns) / 1e9,
            node,
            r.gpu,
            uuid,
            r.kind.spelling,
            r.data,
            i,
        )

    def _pod_doc(self, a: ex.CreatePod, name: str) -> dict:
        image = self.lab.images["workload"]
        if a.spec is not None:
            doc = load_spec(a.spec, image)
        elif a.pod is None:
            doc = self.pods.gpu_pod(name, 1 if a.gpus is None else a.gpus)
        else:
            import yaml

            doc = yaml.safe_load(yaml.safe_dump(a.pod).replace("WORKLOAD_IMAGE", image))
        doc.setdefault("metadata", {})["name"] = name
        if a.node:
            doc["spec"].setdefault("nodeSelector", {})["kubernetes.io/hostname"] = a.node
        doc = self.serving.request(doc, a.name, a.gpus)
        # The kubernetes client validates quantities as strings; YAML authors write `2`.
        for c in doc["spec"].get("containers", []) + doc["spec"].get("initContainers", []):
            for k, v in (c.get("resources") or {}).items():
                if k in ("limits", "requests"):  # not `claims`, a list
                    c["resources"][k] = {r: str(q) for r, q in (v or {}).items()}
        return doc

    # -- collection

    def _snapshot_logs(self, node: str | None = None) -> None:
        for p in self.lab.plugin_pods(node):
            try:
                text = self.lab.pod_log(p, timestamps=True)
            except ApiException:
                continue  # not started yet: nothing logged
            self.logs[p.metadata.uid] = (p.spec.node_name, text)

    def _pod_infos(self) -> list[PodInfo]:
        out = []
        for name, created in self.created.items():
            info = PodInfo(name, round(created, 4), claimed=self.claimed.get(name, []))
            if name in self.deleted:
                info.deleted = round(self.deleted[name], 4)
            try:
                pod = self.pods.get(name)
            except AssertionError:
                out.append(info)
                continue
            info.node, info.phase = pod.spec.node_name or "", pod.status.phase
            info.reason = pod.status.reason or ""
            if pod.status.phase == "Pending":
                info.reason = self._why_pending(name, bool(info.node)) or info.reason
            given = None
            if pod.status.phase == "Running":
                given = self.serving.given(self.lab.ctx, self.exp.namespace, pod)
                info.claimed = info.claimed or self.serving.claimed(
                    self.lab.ctx, self.exp.namespace, pod)  # fmt: skip
            if given is not None:
                info.devices = given
            elif pod.status.phase == "Running":
                try:
                    info.devices = [d for d in self.pods.devices(name) if d]
                except KeyError:
                    info.devices = []  # no device-id env var: no devices
                except (ApiException, OSError, AssertionError) as e:
                    info.reason = f"devices not readable: {e}"
            out.append(info)
        return out

    def _why_pending(self, name: str, placed: bool) -> str:
        """Unplaced: the scheduler's verdict, without its preemption epilogue. Placed: the
        node's last warning (e.g. a claim its driver failed to prepare, which the kubelet
        retries 10-15 s later), or the container's waiting reason."""
        events = sorted(self.pods.events(name), key=lambda e: (
            e.last_timestamp or e.event_time or e.metadata.creation_timestamp))  # fmt: skip
        if not placed:
            msgs = [e.message or "" for e in events if e.reason == "FailedScheduling"]
            return msgs[-1].split(". ")[0] if msgs else ""
        warned = [f"{e.reason}: {e.message}" for e in events
                  if e.type == "Warning" and e.reason != "FailedScheduling"]  # fmt: skip
        return warned[-1][:300] if warned else self.pods.describe(name)

    def _inventories(self) -> dict[str, dict]:
        out = {}
        for n in self.lab.lab.gpu_nodes:
            gpus = self.lab.fake_gpus(n.name).node().gpus
            uuids = [g.uuid for g in gpus]
            out[n.name] = {"gpus": len(gpus), "product": n.gpu_product, "uuids": uuids}
            devices = self.serving.devices(self.lab.ctx, n.name, uuids)
            if devices is not None:  # device name -> GPU index (a MIG device: its parent's)
                out[n.name]["devices"] = devices
        return out

    # -- reset

    def _reset(self, when: str) -> None:
        """No experiment pods (nor what they left: claims), every GPU healthy and what
        serves them showing every device again (clusters/labs/serving.py `heal`)."""
        t0 = time.monotonic()
        self.lab.ensure_namespace(self.exp.namespace)
        self.pods.delete_all()
        self.serving.clean(self.lab.ctx, self.exp.namespace)
        healed = self.lab.heal()
        if healed.restart:
            self.console.print(f"[yellow]![/] {healed.restart}", highlight=False, markup=False)
        self.console.print(
            f"[green]✓[/] Lab reset {when}: {healed.recovered} GPUs recovered "
            f"[dim]({time.monotonic() - t0:.1f}s)[/]"
        )
