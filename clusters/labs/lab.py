"""A lab: a real kind cluster built from a lab spec, with fake GPUs and a plugin under test.

    with Lab("seed", subject="gpulab") as lab:     # reuses the cluster when it is up
        lab.core.list_node()                        # kubernetes client, lab's kubeconfig
        lab.fake_gpus("seed-worker").inject_xid(3, 79)

`up()` runs the ordered actions of clusters/labs/actions.py and then those of what serves the
lab's GPUs (`lab.serving`: a device plugin under test, none, or NVIDIA's DRA driver;
clusters/labs/serving.py, clusters/labs/dra.py), kind-style: one progress line each, ✓ or ✗ and
seconds, each over the lab's Context (clusters/labs/context.py) with its two seams: `lab.host`
(clusters/labs/host.py: kind, images, exec in nodes) and `lab.kube` (clusters/kube.py: the API
server). Capacity waits are clusters/labs/capacity.py's. `down()` deletes the cluster and
the host-side state. Used by `make cluster`, the tests and the e2e fixtures. A lab only
*uses* the infrastructure `make infra` built (clusters/infra/infra.py): when some of it is
missing, `up()` fails at once with one line naming that command.

Kind's Retain rule: when `up()` fails after it created the cluster, it deletes the
half-made cluster again, unless KEEP=1 (or retain=True) asks to keep it for a post-mortem.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

from kubernetes import client
from rich.console import Console

from clusters.kube import Kube
from clusters.labs import actions, fleet, registration, servers, serving, spec
from clusters.labs import capacity as waits  # Lab.wait_allocatable has a `capacity` parameter
from clusters.labs.context import Context
from clusters.labs.host import Host
from clusters.labs.serving import DevicePlugin, Healed, Serving
from clusters.subjects.subject import Subject
from fakenvml import mig, paths
from fakenvml.node import NodeDir

# Lab state (kind configs, node state dirs): machine-wide where this process may write.
LABS_ROOT = Path(
    os.environ.get("GPULAB_LABS")
    or paths.user_or_system(Path("/var/lib/gpulab/labs"), paths.cache_dir() / "labs")
)
RESOURCE = serving.RESOURCE


class Lab:
    def __init__(self, lab: str | Path | spec.Lab, subject: str | Path | Subject | None = None,
                 keep: bool = True, console: Console | None = None,
                 retain: bool | None = None) -> None:  # fmt: skip
        self.lab = lab if isinstance(lab, spec.Lab) else spec.load(lab)
        self.name = self.lab.spec.name
        chosen = subject or self.lab.spec.subject
        self.serving: Serving = servers.choose(self.lab, lambda: serving.for_subject(chosen))
        self.keep = keep
        # Keep a cluster that failed to come up (kind's --retain); KEEP=1 by default.
        self.retain = os.environ.get("KEEP", "") not in ("", "0") if retain is None else retain
        self.labs_root = LABS_ROOT
        self.dir = LABS_ROOT / self.name
        self.ctx = Context.of(self.lab, LABS_ROOT, console or Console(stderr=True, soft_wrap=True))

    # -- what the actions share (the Context)

    @property
    def console(self) -> Console:
        return self.ctx.console

    @console.setter
    def console(self, console: Console) -> None:
        self.ctx.console = console

    @property
    def host(self) -> Host:
        return self.ctx.host

    @property
    def kube(self) -> Kube:
        return self.ctx.kube

    @property
    def kubeconfig(self) -> Path:
        return self.ctx.kubeconfig

    @property
    def images(self) -> dict[str, str]:
        return self.ctx.images

    @images.setter
    def images(self, images: dict[str, str]) -> None:
        self.ctx.images = images

    @property
    def created(self) -> bool:
        return self.ctx.created

    @property
    def health_deadline_s(self) -> float:
        """How long a reused cluster may take to answer before it is made again."""
        return self.ctx.health_deadline_s

    @health_deadline_s.setter
    def health_deadline_s(self, seconds: float) -> None:
        self.ctx.health_deadline_s = seconds

    @property
    def subject(self) -> Subject:
        """The plugin under test (a clear error where a lab serves its GPUs otherwise)."""
        if not isinstance(self.serving, DevicePlugin):
            raise ValueError(f"lab {self.name} runs no plugin under test ({self.serves})")
        return self.serving.subject

    @property
    def plugin(self) -> DevicePlugin:
        self.subject  # noqa: B018 -- the error above where there is none
        assert isinstance(self.serving, DevicePlugin)
        return self.serving

    @property
    def serves_plugin(self) -> bool:
        """A device plugin under test serves the GPUs (not the DRA driver, not none)."""
        return isinstance(self.serving, DevicePlugin)

    @property
    def serves(self) -> str:
        """What serves the lab's GPUs, in words."""
        return self.serving.words

    # -- context manager

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
            title = f"{self.name}: " + action.title.format(lab=self.name)
            t0 = time.monotonic()
            try:
                result = action.run(self.ctx)
            except BaseException as e:
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                self.console.print(f"[red]✗[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]: "
                                   f"{why}", highlight=False)  # fmt: skip
                raise
            if result is not actions.SKIP:
                self.console.print(f"[green]✓[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]",
                                   highlight=False)  # fmt: skip

    def up(self, with_fleet: bool = True) -> Lab:
        """The lab running what serves its GPUs, and its spec's fleet (`with_fleet`). Reuses
        the cluster when it is up; a cluster this call created is deleted again if a later
        action fails (unless retained)."""
        t0 = time.monotonic()
        self.ctx.created = False
        self.host.claim()
        try:
            self.run(self.actions(with_fleet))
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
        copies = sum(f.copies for f in self.lab.fleet.values()) if with_fleet else 0
        self.console.print(
            f"[bold green]Lab {self.name} is up[/] in {time.monotonic() - t0:.0f}s: "
            f"{len(self.lab.nodes)} nodes"
            + (f" and {copies} KWOK copies" if copies else "")
            + f", {gpus} fake GPUs, {self.serves}\n"
            f"  export KUBECONFIG={self.kubeconfig}"
        )
        return self

    def actions(self, with_fleet: bool = True) -> list[actions.Action]:
        """Everything `up()` runs: the cluster's actions, what serves the GPUs', then the
        spec's fleet (its copies are of nodes that serve)."""
        todo = [*actions.UP, serving.clear_faults(self.serving), *self.serving.actions()]
        if with_fleet and self.lab.fleet:
            said = ", ".join(f"{f.copies} of {n}" + (f" ({f.live} live)" if f.live else "")
                             for n, f in self.lab.fleet.items())  # fmt: skip
            todo.append(actions.Action(f"Make its fleet: KWOK copies, {said}", fleet.up_spec))
        return todo

    def use_subject(self, subject: str | Path | Subject) -> None:
        """Deploy fakenvml and the plugin under test (removing any other subject's
        DaemonSet) and wait until every GPU node reports its inventory as capacity and
        allocatable; `none`: fake GPUs only, every subject's DaemonSet removed."""
        if not self.serving.switches:
            raise ValueError(f"lab {self.name} runs {self.serves}, not a device plugin")
        self.serving = serving.for_subject(subject)
        self.run(self.serving.actions())

    def exists(self) -> bool:
        return self.host.exists()

    def down(self) -> None:
        self.host.claim()
        self.ctx.delete()
        self.host.release()

    # -- cluster access

    @property
    def core(self) -> client.CoreV1Api:
        return self.ctx.core

    @property
    def apps(self) -> client.AppsV1Api:
        return self.ctx.apps

    def fake_gpus(self, node: str) -> NodeDir:
        """The host side of a node's fake GPUs: inject here, the node's library sees it."""
        return self.ctx.fake_gpus(node)

    def ensure_namespace(self, name: str) -> None:
        self.kube.ensure_namespace(name)

    def node_exec(self, node: str, *cmd: str) -> str:
        return self.ctx.node_exec(node, *cmd)

    def node_read(self, node: str, path: str) -> str:
        """The text of a file inside a node container."""
        return self.host.read(node, path)

    # -- what serves the GPUs

    def plugin_pods(self, node: str | None = None) -> list[client.V1Pod]:
        """The pods of what serves the GPUs: the subject's DaemonSet, the DRA driver's
        kubelet plugins (on `node` only, if given)."""
        return self.serving.pods(self.ctx, node)

    def pod_log(self, pod: client.V1Pod, timestamps: bool = False) -> str:
        return self.kube.pod_log(pod, timestamps)

    def plugin_log(self, node: str, timestamps: bool = False) -> str | None:
        """The log of the plugin on `node`; None when no plugin pod runs there."""
        pods = self.plugin_pods(node)
        return self.kube.pod_log(pods[0], timestamps) if pods else None

    def set_plugin_on(self, node: str, on: bool, deadline_s: float = 120) -> None:
        """Start or stop what serves the GPUs on `node` (a device plugin's pod, the DRA
        driver's kubelet plugin) and wait for it."""
        self.serving.set_on(self.ctx, node, on, deadline_s)

    def restart_plugin(self) -> None:
        """What serves the GPUs restarted, back when its health signal shows every device
        (NVIDIA's plugin only forgets an Unhealthy device when it restarts; the DRA driver
        v0.4.1 only lifts a taint so)."""
        self.serving.restart(self.ctx)

    def heal(self, since: dict[str, int] | None = None) -> Healed:
        """Every faulted GPU recovered and what serves them healthy again (serving.heal)."""
        return serving.heal(self.ctx, self.serving, since)

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
        # Every node's pod at once: a rolling update one node at a time (the default
        # maxUnavailable of 1) made each change as many plugin restarts in a row as the
        # lab has GPU nodes. The plugin's start is what a suite waits for, not the order.
        strategy = ds.spec.update_strategy
        if strategy is not None and strategy.type == "RollingUpdate":
            strategy.rolling_update = client.V1RollingUpdateDaemonSet(max_unavailable="100%")
        since = self.mark_plugin()
        self.apps.replace_namespaced_daemon_set(name, ns, ds)
        self.kube.wait_daemonset(name, ns)
        self.wait_capacity(since=since)

    # -- node status (clusters/labs/capacity.py)

    def capacity(self, node: str, resource: str | None = None) -> tuple[int, int]:
        """(capacity, allocatable) of `resource` (the subject's) on `node`, as the API
        server has them."""
        return waits.node_gpus(self.core.read_node(node), resource or self.subject.spec.resource)

    def wait_allocatable(self, node: str, allocatable: int, capacity: int | None = None,
                         deadline_s: float = 60, resource: str | None = None) -> int:  # fmt: skip
        """Until `node` reports that allocatable (and capacity, if given) of `resource`
        (the subject's); the time.time_ns() at which the API server's update arrived."""
        return waits.wait_allocatable(self.ctx, node, allocatable, capacity, deadline_s,
                                      resource or self.subject.spec.resource)  # fmt: skip

    def mark_plugin(self) -> registration.Mark:
        return self.plugin.mark_plugin(self.ctx)

    def wait_capacity(self, deadline_s: float = 300,
                      since: registration.Mark | None = None) -> None:  # fmt: skip
        self.plugin.wait_capacity(self.ctx, deadline_s, since)

    def mig_resources(self, node: str) -> dict[str, list[mig.MigDevice]]:
        return waits.mig_resources(self.ctx, self.subject, node)

    def expected_devices(self, node: str) -> int:
        return waits.expected_devices(self.ctx, self.subject, node)
