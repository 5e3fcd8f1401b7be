"""Pods for the suites: apply a spec, wait with a deadline, read what the container got.

Every wait names the condition it waited for and what it saw instead, e.g.
    waited 60s for pod test-gpu-8 Running; last saw: Pending (Unschedulable: 0/3 nodes ...)
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from clusters.kube import absent_ok, or_none
from clusters.labs import capacity
from clusters.subjects.subject import DeviceIds
from e2e import checkpoint
from fakenvml import mig
from fakenvml.mig import MigDevice
from fakenvml.model import Gpu

if TYPE_CHECKING:
    from clusters.labs.lab import Lab

SPECS = Path(__file__).resolve().parent / "specs"


def device_health(pod: client.V1Pod, resource: str) -> dict[str, str]:
    """{device id: Healthy|Unhealthy|Unknown} of `resource` in the pod's
    status.containerStatuses[].allocatedResourcesStatus (KEP-4680); {} where the kubelet
    reports none (before 1.36 the gate is alpha and off)."""
    out: dict[str, str] = {}
    for cs in pod.status.container_statuses or []:
        for rs in cs.allocated_resources_status or []:
            if rs.name == resource:
                out.update({r.resource_id: r.health for r in rs.resources or []})
    return out


def restarts(pod: client.V1Pod) -> tuple[int, str]:
    """Its containers' restarts, and in words with how each restarted one last ended (its
    reason, exit code and message), so that a failed "no restart" says why."""
    count, why = 0, []
    for c in pod.status.container_statuses or []:
        count += c.restart_count
        if c.restart_count and c.last_state and (t := c.last_state.terminated):
            said = f": {t.message.strip()[-300:]}" if t.message else ""
            why.append(f"{c.name} {t.reason} exit {t.exit_code} at {t.finished_at}{said}")
    return count, f"{count} restarts" + (f" ({'; '.join(why)})" if why else "")


class PodWaitError(AssertionError):
    """A pod did not reach the awaited state; the message says what was seen."""


def load_spec(name: str, image: str, **overrides: object) -> dict:
    """e2e/specs/<name>.yaml with the workload image filled in."""
    doc = yaml.safe_load((SPECS / f"{name}.yaml").read_text().replace("WORKLOAD_IMAGE", image))
    doc["metadata"].update(overrides)
    return doc


GPU = "nvidia.com/gpu"  # what the shipped pod specs ask for
DEVICE_ENV = "NVIDIA_VISIBLE_DEVICES"


# A node's GPUs and MIG devices, by node name: what the plugin's device ids name.
NodeGpus = Callable[[str], tuple[Sequence[Gpu], Sequence[MigDevice]]]
# A node -> the kubelet's Allocate answers for the resource: (device ids, device node paths).
Answers = Callable[[str], list[tuple[list[str], list[str]]]]
DEVICE_NODE = re.compile(r"^nvidia(\d+)$")


class Pods:
    """Pods in one namespace. Specs ask for nvidia.com/gpu; with a subject whose resource
    is another, `create` asks for that one, so a suite runs unchanged against any plugin.
    GPUs are named by UUID whatever the plugin calls them: `devices` reads what the
    container got (the device-id env var, or the device nodes CDI or device specs made)
    and `gpus_of` names the plugin's own ids (the kubelet's checkpoint, a pod's status),
    both through the subject's `device_ids` and the node's GPUs (`node_gpus`).

    `grace_s` is the grace period `delete` asks for. 0 (force) suits device plugins. A
    DRA lab needs 1: a force-deleted pod leaves the API before its node unprepared its
    claim, the scheduler hands the device to the next claim, the driver refuses to prepare
    it ("already allocated to different claim") and the kubelet retries only after about
    70 s (docs/dra-driver.md). With a grace period the pod stays until the kubelet is done."""

    def __init__(self, core: client.CoreV1Api, namespace: str, image: str,
                 resource: str = GPU, ids: DeviceIds | None = None,
                 node_gpus: NodeGpus | None = None, grace_s: int = 0,
                 answers: Answers | None = None,
                 plugin_log: Callable[[str], list[str]] | None = None,
                 scheduler_name: str | None = None) -> None:  # fmt: skip
        self.core, self.ns, self.image, self.grace_s = core, namespace, image, grace_s
        self.scheduler_name = scheduler_name  # what `create` names, unless the spec does
        self.plugin_log = plugin_log  # a node -> the last lines of what serves its GPUs
        self.resource = resource
        self.ids = ids or DeviceIds(env=DEVICE_ENV)
        self.node_gpus = node_gpus
        self.answers = answers

    def gpu_pod(self, name: str, gpus: int, node: str | None = None) -> dict:
        """A workload pod asking for `gpus` (scheduled by the scheduler, onto `node` if
        given): the subject's resource once `create` sends it."""
        spec: dict = {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": self.image, "imagePullPolicy": "Never",
                "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}},
            }],
        }  # fmt: skip
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    @classmethod
    def of(cls, lab: Lab, namespace: str) -> Pods:
        """Pods in `namespace` of `lab`, asking for and reading what serves its GPUs."""
        s = lab.serving

        def node_gpus(node: str) -> tuple[Sequence[Gpu], Sequence[MigDevice]]:
            d = lab.fake_gpus(node)
            return d.node().gpus, mig.devices(d)

        def answers(node: str) -> list[tuple[list[str], list[str]]]:
            got = checkpoint.allocated_nodes(lab, node)
            return [v for (_, _, resource), v in got.items() if resource == s.resource]

        def plugin_log(node: str) -> list[str]:
            """The plugin pod's restarts and last lines, and the kubelet's device-plugin
            lines: which side let go of the devices (a pod refused at admission)."""
            found = s.pods(lab.ctx, node)
            out = []
            if found:
                restarts = sum(c.restart_count for c in found[0].status.container_statuses or [])
                out.append(f"pod {found[0].metadata.name}, restarts {restarts}:")
                if restarts:  # how its run before ended (a start that died after registering)
                    out += ["(before)", *lab.kube.log_tail(found[0], 6, previous=True), "(now)"]
                out += lab.kube.log_tail(found[0], 8)
            return out + ["kubelet: " + x for x in capacity.kubelet_plugin_lines(lab.ctx, node, 6)]

        return cls(lab.core, namespace, lab.images["workload"], s.resource, s.device_ids,
                   node_gpus, grace_s=lab.serving.grace_s,
                   answers=answers if s.device_ids.opaque else None,
                   plugin_log=plugin_log, scheduler_name=s.scheduler_name)  # fmt: skip

    # -- lifecycle

    def create(self, spec: str | dict, **meta: object) -> str:
        doc = load_spec(spec, self.image, **meta) if isinstance(spec, str) else copy.deepcopy(spec)
        pod = doc["spec"]
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            for amounts in (c.get("resources") or {}).values():
                if GPU in amounts and self.resource != GPU:
                    amounts[self.resource] = amounts.pop(GPU)
        if self.scheduler_name:  # a plugin that needs its scheduler (a subject's `scheduler`)
            pod.setdefault("schedulerName", self.scheduler_name)
        self.core.create_namespaced_pod(self.ns, doc)
        return doc["metadata"]["name"]

    def delete(self, name: str, wait_s: float = 60) -> None:
        if self._ask_delete(name):
            self._wait_gone(name, wait_s)

    def delete_all(self, wait_s: float = 90) -> None:
        """Every pod of the namespace, asked to go together and then waited for: one after
        the other, a DRA lab's graceful deletes (its node unprepares each claim) cost ~3 s
        each, 6 s of a two-pod test's teardown."""
        names = [p.metadata.name for p in self.core.list_namespaced_pod(self.ns).items]
        for name in [n for n in names if self._ask_delete(n)]:
            self._wait_gone(name, wait_s)

    def _ask_delete(self, name: str) -> bool:
        """False where the pod is already gone."""
        return absent_ok(self.core.delete_namespaced_pod, name, self.ns,
                         grace_period_seconds=self.grace_s)  # fmt: skip

    def _wait_gone(self, name: str, wait_s: float) -> None:
        self._wait(f"pod {name} deleted", lambda: (self.find(name) is None, "still there"), wait_s)

    # -- reading

    def find(self, name: str) -> client.V1Pod | None:
        """The pod, or None where it does not exist."""
        return or_none(self.core.read_namespaced_pod, name, self.ns)

    def get(self, name: str) -> client.V1Pod:
        pod = self.find(name)
        if pod is None:
            raise PodWaitError(f"pod {name} does not exist")
        return pod

    def describe(self, name: str) -> str:
        pod = self.find(name)
        if pod is None:
            return "no such pod"
        st = pod.status
        conds = "; ".join(f"{c.reason}: {c.message}" for c in (st.conditions or []) if c.message)
        if st.reason:  # the kubelet's verdict on the pod, e.g. UnexpectedAdmissionError
            conds = f"{st.reason}: {st.message}" + (f"; {conds}" if conds else "")
        waiting = [
            f"{c.name}: {c.state.waiting.reason}"
            for c in (st.container_statuses or []) + (st.init_container_statuses or [])
            if c.state and c.state.waiting
        ]
        return f"{st.phase}" + (f" ({conds})" if conds else "") + (f" {waiting}" if waiting else "")

    def events(self, name: str) -> list[client.CoreV1Event]:
        return self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name},involvedObject.kind=Pod"
        ).items

    def exec(self, name: str, command: list[str], done: Callable[[str], bool],
             container: str | None = None, deadline_s: float = 30) -> str:  # fmt: skip
        """`command`'s output in the container, retried until `done(output)`: output that is
        not the command's is the kubelet's error (e.g. just restarted)."""

        def read() -> tuple[bool, str]:
            try:
                out = stream(self.core.connect_get_namespaced_pod_exec, name, self.ns,
                             container=container, command=command, stderr=True, stdin=False,
                             stdout=True, tty=False)  # fmt: skip
            except ApiException as e:
                return False, f"exec refused ({e.status} {e.reason})"
            return done(out), out

        return self._wait(f"`{' '.join(command)}` in pod {name}", read, deadline_s)

    def env(
        self, name: str, container: str | None = None, deadline_s: float = 30
    ) -> dict[str, str]:
        """The container's environment, read by exec'ing `env` in it (every environment has
        PATH)."""
        out = self.exec(name, ["env"], lambda out: "PATH=" in out, container, deadline_s)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def visible_devices(self, name: str, gpus: int, node: str | None = None) -> list[str]:
        """A pod `name` asking for `gpus` (on `node`, if given), once Running: the ids in
        its DEVICE_ENV. Every pod of the namespace is deleted before and after."""
        self.delete_all()
        try:
            self.create(self.gpu_pod(name, gpus, node))
            self.wait_running(name)
            return self.env(name).get(DEVICE_ENV, "").split(",")
        finally:
            self.delete_all()

    def device_nodes(self, name: str, container: str | None = None) -> list[str]:
        """The container's /dev entries (every container has /dev/null)."""
        out = self.exec(name, ["ls", "/dev"], lambda out: "null" in out.split(), container)
        return out.split()

    def devices(self, name: str, container: str | None = None) -> list[str]:
        """The UUIDs of the GPUs the plugin gave the container, in the order it shows
        them: the device ids in its device-id env var (KeyError if unset; read as
        `env_id` says where the env names GPUs its own way), or the GPUs whose device
        nodes it has (CDI, device specs). One that names no GPU of the pod's node stays in
        the list as `<what> (names no GPU of <node>)`."""
        node = self.get(name).spec.node_name
        if self.ids.env is not None:
            entries = self.env(name, container)[self.ids.env].split(",")
            if self.ids.env_id is None:
                return self.gpus_of(node, entries)
            gpus, slices = self._gpus(node)  # the env names GPUs its own way (env_id)
            named = ((e, self.ids.env_form.gpu_of(e, gpus, slices)) for e in entries)
            return [gpu or f"{e} (names no GPU of {node})" for e, gpu in named]
        return self.gpus_of_nodes(node, self.device_nodes(name, container))

    def _gpus(self, node: str) -> tuple[Sequence[Gpu], Sequence[MigDevice]]:
        if self.node_gpus is None:
            raise ValueError("naming devices by GPU needs node_gpus (Pods.of gives it)")
        return self.node_gpus(node)

    def gpus_of(self, node: str, ids: Iterable[str]) -> list[str]:
        """The GPUs (UUIDs; a MIG device's own) the plugin's device ids name on `node`: what
        the kubelet's checkpoint or a pod's status holds, compared with `devices`. Opaque
        ids are named through the plugin's Allocate answers (checkpoint.solve): one by one
        where they tell, else as the group one answer handed together."""
        ids = list(ids)
        if self.ids.opaque:
            return self._opaque_gpus(node, ids)
        gpus, slices = self._gpus(node)
        named = ((i, self.ids.gpu_of(i, gpus, slices)) for i in ids)
        return [gpu or f"{i} (names no GPU of {node})" for i, gpu in named]

    def _opaque_gpus(self, node: str, ids: list[str]) -> list[str]:
        if self.answers is None:
            raise ValueError("opaque ids are named through Allocate answers (Pods.of gives them)")
        answers = [(got, self.gpus_at(node, paths)) for got, paths in self.answers(node)]
        solved = checkpoint.solve(answers)
        if not all(i in solved for i in ids):
            for got, gpus in answers:
                if sorted(got) == sorted(ids):
                    return gpus
        return [solved.get(i) or f"{i} (no Allocate answer tells its GPU)" for i in ids]

    def gpus_at(self, node: str, paths: Iterable[str]) -> list[str]:
        """The GPUs device node paths name, as the subject's device nodes do (/dev/nvidia<minor>);
        paths of no GPU are left out."""
        form = self.ids.nodes
        assert form is not None  # not an env subject
        gpus, _ = self._gpus(node)
        named = [p for p in paths if form.parse(p)]
        return [form.gpu_of(p, gpus) or f"{p} (names no GPU of {node})" for p in named]

    def gpus_of_nodes(self, node: str, entries: Iterable[str]) -> list[str]:
        """The GPUs whose device nodes are among a container's /dev `entries`, as the
        subject's device nodes name them (/dev/nvidia<minor>); other entries are not GPUs."""
        return self.gpus_at(node, (f"/dev/{e}" for e in entries))

    def health(self, pod: client.V1Pod) -> dict[str, str]:
        """device_health of the subject's resource, each device id named as its GPU."""
        ids = device_health(pod, self.resource)
        return dict(zip(self.gpus_of(pod.spec.node_name, ids), ids.values(), strict=True))

    # -- waits

    def _wait(self, what: str, check: Callable[[], tuple[bool, str]], deadline_s: float) -> str:
        t0 = time.monotonic()
        while True:
            done, seen = check()
            if done:
                return seen
            if time.monotonic() - t0 > deadline_s:
                raise PodWaitError(f"waited {deadline_s:.0f}s for {what}; last saw: {seen}")
            time.sleep(0.5)

    def wait_running(self, name: str, deadline_s: float = 90) -> client.V1Pod:
        """Until the pod is Running and ready; at once a PodWaitError where it ended
        (Failed, e.g. rejected at admission by an Allocate that failed, or Succeeded): it
        will never run, and waiting out the deadline made a failing plugin's run take
        many times a passing one's (issue 40: 21 of 28 minutes)."""

        def check() -> tuple[bool, str]:
            pod = self.find(name)
            if pod is not None and pod.status.phase in ("Failed", "Succeeded"):
                raise PodWaitError(f"pod {name} will never be Running: {self.describe(name)}"
                                   + self._plugin_tail(pod.spec.node_name))  # fmt: skip
            ready = bool(pod and pod.status.phase == "Running" and all(
                c.ready for c in pod.status.container_statuses or []))  # fmt: skip
            return ready, self.describe(name)

        self._wait(f"pod {name} Running and ready", check, deadline_s)
        return self.get(name)

    def _plugin_tail(self, node: str | None) -> str:
        lines = self.plugin_log(node) if self.plugin_log and node else []
        if not lines:
            return ""
        return f"\n  what serves {node}'s GPUs last said:" + "".join(f"\n    {x}" for x in lines)

    def wait_failed_scheduling(self, name: str, text: str, deadline_s: float = 60) -> str:
        """Wait for a FailedScheduling event containing `text`; returns its message."""

        def check() -> tuple[bool, str]:
            msgs = [e.message or "" for e in self.events(name) if e.reason == "FailedScheduling"]
            hit = next((m for m in msgs if text in m), None)
            return hit is not None, hit or (msgs[-1] if msgs else self.describe(name))

        return self._wait(f"pod {name} FailedScheduling with {text!r}", check, deadline_s)
