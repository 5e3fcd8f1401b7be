"""A lab: a real kind cluster built from a lab spec, with fake GPUs and a plugin under test.

    with Lab("seed", subject="gpulab") as lab:     # reuses the cluster when it is up
        lab.core.list_node()                        # kubernetes client, lab's kubeconfig
        lab.fake_gpus("seed-worker").inject_xid(3, 79)

`up()` runs the ordered actions of clusters/actions.py (kind-style: one progress line each,
✓ or ✗ and seconds) over two seams: `lab.host` (clusters/host.py: kind, images, exec in
nodes) and `lab.kube` (clusters/kube.py: the API server). `down()` deletes the cluster and
the host-side state. Used by `make cluster`, the tests and the e2e fixtures. A lab only
*uses* the infrastructure `make infra` built (clusters/infra.py): when some of it is
missing, `up()` fails at once with one line naming that command.

Kind's Retain rule: when `up()` fails after it created the cluster, it deletes the
half-made cluster again, unless KEEP=1 (or retain=True) asks to keep it for a post-mortem.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from kubernetes import client
from rich.console import Console

from clusters import actions, dra, kindconfig, registration, spec
from clusters.host import Host
from clusters.kube import Kube, ready
from clusters.steps import StepError, poll
from clusters.subject import NONE, Subject
from clusters.subject import load as load_subject
from fakenvml import mig, paths
from fakenvml.node import NodeDir

# Lab state (kind configs, node state dirs): machine-wide where this process may write.
LABS_ROOT = Path(
    os.environ.get("GPULAB_LABS")
    or paths.user_or_system(Path("/var/lib/gpulab/labs"), paths.cache_dir() / "labs")
)
RESOURCE = "nvidia.com/gpu"


class Lab:
    def __init__(self, lab: str | Path | spec.Lab, subject: str | Path | Subject | None = None,
                 keep: bool = True, console: Console | None = None,
                 retain: bool | None = None) -> None:  # fmt: skip
        self.lab = lab if isinstance(lab, spec.Lab) else spec.load(lab)
        self.name = self.lab.spec.name
        chosen = subject or self.lab.spec.subject
        # None: fake GPUs and no plugin under test (subject `none`).
        self._subject = None if chosen == NONE else load_subject(chosen)
        self.keep = keep
        # Keep a cluster that failed to come up (kind's --retain); KEEP=1 by default.
        self.retain = os.environ.get("KEEP", "") not in ("", "0") if retain is None else retain
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.labs_root = LABS_ROOT
        self.dir = LABS_ROOT / self.name
        self.host = Host(self.name, self.dir)
        self.kubeconfig = self.host.kubeconfig
        self.kube = Kube(self.kubeconfig)
        self.images: dict[str, str] = {}
        self.created = False  # by this up(): a failure deletes it again
        self.plugin_mark: registration.Mark | None = None  # taken by the deploy action
        # How long a reused cluster may take to answer before it is made again.
        self.health_deadline_s = 120.0

    # -- context manager

    @property
    def subject(self) -> Subject:
        """The plugin under test (a lab with `subject: none` has none: a clear error)."""
        if self._subject is None:
            raise ValueError(f"lab {self.name} runs no plugin under test (subject: none)")
        return self._subject

    @property
    def serves_plugin(self) -> bool:
        """A device plugin under test serves the GPUs (not the DRA driver, not none)."""
        return self._subject is not None and not self.lab.spec.dra

    @property
    def serves(self) -> str:
        """What serves the lab's GPUs, in words."""
        if self.lab.spec.dra:
            return f"NVIDIA's DRA driver {dra.version()}"
        return f"subject {self._subject.name}" if self._subject else "no plugin (subject: none)"

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if not self.keep:
            self.down()

    # -- actions

    def run(self, todo: list[actions.Action]) -> None:
        """The actions in order, one progress line each (prefixed with the lab's name:
        labs may come up side by side)."""
        for action in todo:
            name = self._subject.name if self._subject else NONE
            title = f"{self.name}: " + action.title.format(lab=self.name, subject=name)
            t0 = time.monotonic()
            try:
                result = action.run(self)
            except BaseException as e:
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                self.console.print(f"[red]✗[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]: "
                                   f"{why}", highlight=False)  # fmt: skip
                raise
            if result is not actions.SKIP:
                self.console.print(f"[green]✓[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]",
                                   highlight=False)  # fmt: skip

    def up(self) -> Lab:
        """The lab running its plugin. Reuses the cluster when it is up; a cluster this call
        created is deleted again if a later action fails (unless retained)."""
        t0 = time.monotonic()
        self.created = False
        self.host.claim()
        try:
            self.run(actions.UP + self._serving())
        except BaseException:
            if self.created and not self.retain:
                self.console.print(f"[yellow]![/] deleting the half-made cluster {self.name} "
                                   "(KEEP=1 keeps it)")  # fmt: skip
                self.down()
            elif self.created:
                self.console.print(f"[yellow]![/] keeping the failed cluster {self.name} "
                                   f"(KEEP=1): export KUBECONFIG={self.kubeconfig}")  # fmt: skip
            raise
        gpus = sum(n.gpu_count for n in self.lab.gpu_nodes)
        self.console.print(
            f"[bold green]Lab {self.name} is up[/] in {time.monotonic() - t0:.0f}s: "
            f"{len(self.lab.nodes)} nodes, {gpus} fake GPUs, {self.serves}\n"
            f"  export KUBECONFIG={self.kubeconfig}"
        )
        return self

    def _serving(self) -> list[actions.Action]:
        if self.lab.spec.dra:
            return actions.DRA
        return actions.SUBJECT if self._subject else actions.NO_PLUGIN

    def use_subject(self, subject: str | Path | Subject) -> None:
        """Deploy fakenvml and the plugin under test (removing any other subject's
        DaemonSet) and wait until every GPU node reports its inventory as capacity and
        allocatable; `none`: fake GPUs only, every subject's DaemonSet removed."""
        if self.lab.spec.dra:
            raise ValueError(f"lab {self.name} runs NVIDIA's DRA driver, not a device plugin")
        self._subject = None if subject == NONE else load_subject(subject)
        self.run(self._serving())

    def exists(self) -> bool:
        return self.host.exists()

    def down(self) -> None:
        self.host.claim()
        self.host.delete()
        self.kube.reset()  # a cluster made again listens on another port
        self.console.print(f"[green]✓[/] Lab {self.name} deleted")
        self.host.release()

    # -- cluster access

    @property
    def core(self) -> client.CoreV1Api:
        return self.kube.core

    @property
    def apps(self) -> client.AppsV1Api:
        return self.kube.apps

    def fake_gpus(self, node: str) -> NodeDir:
        """The host side of a node's fake GPUs: inject here, the node's library sees it."""
        return NodeDir(kindconfig.state_dir(self.labs_root, self.lab, node))

    def ensure_namespace(self, name: str) -> None:
        self.kube.ensure_namespace(name)

    def node_exec(self, node: str, *cmd: str) -> str:
        return self.host.exec(node, *cmd)

    def node_read(self, node: str, path: str) -> str:
        """The text of a file inside a node container."""
        return self.host.read(node, path)

    # -- the plugin under test

    def plugin_pods(self, node: str | None = None) -> list[client.V1Pod]:
        """The subject DaemonSet's pods, on a DRA lab the driver's kubelet plugin pods (on
        `node` only, if given)."""
        if self.lab.spec.dra:
            return self.kube.pods(dra.NAMESPACE, dra.POD_LABELS, node)
        return self.kube.pods(self.subject.namespace, self.subject.selector, node)

    def pod_log(self, pod: client.V1Pod, timestamps: bool = False) -> str:
        return self.kube.pod_log(pod, timestamps)

    def plugin_log(self, node: str, timestamps: bool = False) -> str | None:
        """The log of the plugin on `node`; None when no plugin pod runs there."""
        pods = self.plugin_pods(node)
        return self.kube.pod_log(pods[0], timestamps) if pods else None

    def set_plugin_on(self, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop the plugin DaemonSet's pod on `node` (its gpulab.dev/plugin label)
        and wait until the pod is there and Ready, or gone."""
        self.kube.label_node(node, {f"{kindconfig.LABEL_PREFIX}/plugin": "true" if on else None})

        def there(pods: dict[str, client.V1Pod]) -> tuple[bool, str]:
            up = ready(list(pods.values()))
            return (len(up) == 1) if on else not pods, f"{len(pods)} pods, {len(up)} ready"

        s = self.subject
        self.kube.watch_until(
            f"{s.daemonset_name} {'on' if on else 'off'} {node}", self.core.list_namespaced_pod,
            there, deadline_s, namespace=s.namespace, label_selector=s.selector,
            field_selector=f"spec.nodeName={node}")  # fmt: skip

    def restart_plugin(self) -> None:
        """Delete the plugin's pods and wait for new ones and full capacity: NVIDIA's
        plugin only forgets an Unhealthy device when it restarts. On a DRA lab the
        driver's kubelet plugin pods, until every node's slices are published again (a
        restart is what clears v0.4.1's taints)."""
        if self.lab.spec.dra:
            self.kube.restart_pods(dra.NAMESPACE, dra.POD_LABELS, dra.DAEMONSET)
            dra.wait_slices(self)
            return
        since = self.mark_plugin()
        self.kube.restart_pods(self.subject.namespace, self.subject.selector,
                               self.subject.daemonset_name)  # fmt: skip
        self.wait_capacity(since=since)

    def wait_untainted(self, deadline_s: float = 120) -> None:
        """Until every GPU node publishes all its devices in the DRA driver's
        ResourceSlices, none of them tainted."""
        dra.wait_slices(self, deadline_s, untainted=True)

    def set_plugin_env(self, env: dict[str, str | None]) -> None:
        """Set (or with None, remove) env vars of the plugin container; waits for the
        rolled-out pods and full capacity."""
        name, ns = self.subject.daemonset_name, self.subject.namespace
        ds = self.apps.read_namespaced_daemon_set(name, ns)
        container = ds.spec.template.spec.containers[0]
        current = {e.name: e for e in container.env or []}
        for key, value in env.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = client.V1EnvVar(name=key, value=value)
        container.env = list(current.values())
        since = self.mark_plugin()
        self.apps.replace_namespaced_daemon_set(name, ns, ds)
        self.kube.wait_daemonset(name, ns)
        self.wait_capacity(since=since)

    # -- node status

    def capacity(self, node: str, resource: str | None = None) -> tuple[int, int]:
        """(capacity, allocatable) of `resource` (the subject's) on `node`, as the API
        server has them."""
        return node_gpus(self.core.read_node(node), resource or self.subject.spec.resource)

    def wait_nodes(self, what: str, names: set[str],
                   check: Callable[[dict[str, tuple[int, int]]], bool],
                   deadline_s: float, resource: str | None = None) -> int:  # fmt: skip
        """Watch Node objects until check({name: (capacity, allocatable)}) of `resource`
        (the subject's) holds for `names`; returns time.time_ns() of the update that
        satisfied it. A watch sees every status write as it lands, so fault latencies are
        not rounded up to a poll period."""
        resource = resource or self.subject.spec.resource

        def gpus(nodes: dict[str, client.V1Node]) -> tuple[bool, str]:
            seen = {n: node_gpus(nodes[n], resource) for n in names if n in nodes}
            shown = ", ".join(f"{n} {c}/{a}" for n, (c, a) in sorted(seen.items()))
            return check(seen), f"(capacity/allocatable) {shown or 'nothing'}"

        return self.kube.watch_until(what, self.core.list_node, gpus, deadline_s)

    def wait_allocatable(self, node: str, allocatable: int, capacity: int | None = None,
                         deadline_s: float = 60, resource: str | None = None) -> int:  # fmt: skip
        """Until `node` reports that allocatable (and capacity, if given) of `resource`
        (the subject's); the time.time_ns() at which the API server's update arrived."""

        def check(seen: dict[str, tuple[int, int]]) -> bool:
            cap, alloc = seen.get(node, (-1, -1))
            return alloc == allocatable and (capacity is None or cap == capacity)

        want = f"{allocatable}" + (f" of {capacity}" if capacity is not None else "")
        what = f"{node} {resource or self.subject.spec.resource} allocatable {want}"
        return self.wait_nodes(what, {node}, check, deadline_s, resource)

    def mark_plugin(self) -> registration.Mark:
        """Taken before the plugin is deployed, switched or restarted: `wait_capacity(since=)`
        then waits for each new plugin pod's registration before it trusts a Node's status."""
        nodes = [n.name for n in self.lab.gpu_nodes
                 if n.spec.plugin.start and self.expected_devices(n.name)]  # fmt: skip
        return registration.mark(self.core, self.plugin_pods(), self.subject.spec.resource,
                                 nodes)  # fmt: skip

    def wait_capacity(self, deadline_s: float = 300,
                      since: registration.Mark | None = None) -> None:  # fmt: skip
        """Until every GPU node whose plugin starts shows capacity = allocatable = its
        inventory (times the subject's time-slicing replicas); with `since`, only after
        every plugin pod started since that mark has registered with its kubelet."""
        if since is not None:
            # Bounded apart from the capacity wait, so that a plugin that never registers
            # is reported with its log and its kubelet's, then judged on capacity.
            try:
                # Every 0.5 s: each check scrapes ~240 KB of metrics per node.
                poll(f"{since.resource} plugins to register with their kubelets",
                     lambda: self._registered(since), min(deadline_s, 90),
                     interval_s=0.5)  # fmt: skip
            except StepError as e:
                self.console.print(f"[yellow]![/] {e}; waiting on capacity alone\n"
                                   f"{self._registration_diagnosis(since)}",
                                   highlight=False, markup=False)  # fmt: skip
        want = {n.name: self.expected_devices(n.name) for n in self.lab.gpu_nodes
                if n.spec.plugin.start}  # fmt: skip

        def check(seen: dict[str, tuple[int, int]]) -> bool:
            return all(seen.get(n) == (c, c) for n, c in want.items())

        what = f"{self.subject.spec.resource} capacity = allocatable = inventory on {sorted(want)}"
        self.wait_nodes(what, set(want), check, deadline_s)

    def _registered(self, since: registration.Mark) -> tuple[bool, str]:
        pending = since.pending(self.core, self.plugin_pods())
        return not pending, f"not yet registered on {', '.join(pending)}"

    def _registration_diagnosis(self, since: registration.Mark, lines: int = 8) -> str:
        """For a registration wait that timed out: each node's plugin log tail and its
        kubelet's device-manager lines (which side stopped short)."""
        out = []
        for node in since.seen:
            try:  # a diagnosis must not hide the failure it explains
                pods = self.plugin_pods(node)
                log = self.kube.log_tail(pods[0], lines) if pods else ["no plugin pod"]
            except Exception as e:
                log = [f"unreadable ({e.__class__.__name__})"]
            try:
                journal = self.node_exec(node, "journalctl", "-u", "kubelet", "-n", "3000",
                                         "--no-pager", "-o", "cat").splitlines()  # fmt: skip
                kubelet = [x[:300] for x in journal if "device plugin" in x.lower()][-lines:]
            except Exception as e:
                kubelet = [f"unreadable ({e.__class__.__name__})"]
            out.append(f"  {node} plugin: " + "\n    ".join(log)
                       + f"\n  {node} kubelet: " + "\n    ".join(kubelet))  # fmt: skip
        return "\n".join(out)

    def mig_resources(self, node: str) -> dict[str, list[mig.MigDevice]]:
        """The node's MIG devices by the resource the subject's MIG strategy names them
        (NVIDIA's: single -> nvidia.com/gpu, mixed -> nvidia.com/mig-<profile>)."""
        out: dict[str, list[mig.MigDevice]] = {}
        for d in mig.devices(self.fake_gpus(node)):
            single = self.subject.expects.mig == "single"
            name = "nvidia.com/gpu" if single else f"nvidia.com/mig-{d.profile}"
            out.setdefault(name, []).append(d)
        return out

    def expected_devices(self, node: str) -> int:
        """How many devices of its resource the subject should advertise on `node`: the
        inventory's GPUs (times time-slicing replicas), or for a MIG subject the node's MIG
        devices its strategy names so, from the node's fake state."""
        if self.subject.expects.mig != "none":
            return len(self.mig_resources(node).get(self.subject.spec.resource, []))
        spec = next(n for n in self.lab.gpu_nodes if n.name == node)
        return spec.gpu_count * self.subject.expects.replicas


def node_gpus(node: client.V1Node, resource: str) -> tuple[int, int]:
    status = node.status
    cap = int((status.capacity or {}).get(resource, 0)) if status else 0
    alloc = int((status.allocatable or {}).get(resource, 0)) if status else 0
    return cap, alloc
