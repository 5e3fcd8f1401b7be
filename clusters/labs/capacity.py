"""Capacity: what a device plugin's GPUs look like on the API server, and the waits on it.

A Node's capacity and allocatable of the plugin's resource are the device-plugin signal
(a DRA driver's is its ResourceSlices' device taints: clusters/labs/dra.py). Every wait watches
Node objects, so it sees each status write as it lands: fault latencies are not rounded up
to a poll period. `wait_capacity` first waits for every plugin pod started since a
`registration.Mark` to have registered with its kubelet (clusters/labs/registration.py: why).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from kubernetes import client

from clusters.kube import GiveUp
from clusters.labs import registration
from clusters.labs.context import Context
from clusters.steps import StepError, poll
from clusters.subjects.subject import Subject
from fakenvml import mig
from fakenvml.model import Gpu

Pods = Callable[[str | None], list[client.V1Pod]]  # node (None: all) -> the plugin's pods


def node_gpus(node: client.V1Node, resource: str) -> tuple[int, int]:
    status = node.status
    cap = int((status.capacity or {}).get(resource, 0)) if status else 0
    alloc = int((status.allocatable or {}).get(resource, 0)) if status else 0
    return cap, alloc


def wait_nodes(ctx: Context, what: str, names: set[str],
               check: Callable[[dict[str, tuple[int, int]]], bool],
               deadline_s: float, resource: str,
               give_up: GiveUp | None = None) -> int:  # fmt: skip
    """Watch Node objects until check({name: (capacity, allocatable)}) of `resource` holds
    for `names`; returns time.time_ns() of the update that satisfied it. `give_up`: as
    Kube.watch_until's."""

    def gpus(nodes: dict[str, client.V1Node]) -> tuple[bool, str]:
        seen = {n: node_gpus(nodes[n], resource) for n in names if n in nodes}
        shown = ", ".join(f"{n} {c}/{a}" for n, (c, a) in sorted(seen.items()))
        return check(seen), f"(capacity/allocatable) {shown or 'nothing'}"

    return ctx.kube.watch_until(what, ctx.core.list_node, gpus, deadline_s, give_up)


# The kubelet's words when a ListAndWatch answer is past its gRPC receive limit (grpc-go's
# "received message larger than max (<size> vs. <limit>)", in its "ListAndWatch ended
# unexpectedly" line): the plugin's devices never reach the node, however long one waits.
TOO_LARGE = re.compile(r"received message larger than max \((\d+) vs\. (\d+)\)")
# A plugin container in CrashLoopBackOff after this many restarts (three runs ended in a
# row, some 15 s after it started) is not coming up by waiting.
CRASH_LOOP_RESTARTS = 2


def hopeless(ctx: Context, subject: Subject, pods: Pods, nodes: list[str],
             since: float) -> GiveUp:  # fmt: skip
    """Why a capacity wait cannot end well any more, asked between watches: a plugin pod
    that crash-loops (with its last run's log), or a kubelet that refused the plugin's
    device list as larger than its gRPC limit since `since` (with the size and the limit)."""

    def why() -> str | None:
        for node in nodes:
            for pod in pods(node):
                if pod.metadata.deletion_timestamp:  # on its way out (a restart's old pod)
                    continue
                for c in pod.status.container_statuses or []:
                    waiting = c.state.waiting if c.state else None
                    if (waiting and waiting.reason == "CrashLoopBackOff"
                            and c.restart_count >= CRASH_LOOP_RESTARTS):  # fmt: skip
                        said = " | ".join(ctx.kube.log_tail(pod, 4, c.name, previous=True))
                        return (f"plugin pod {pod.metadata.name} on {node} crash-loops "
                                f"({c.restart_count} restarts); its last run said: "
                                f"{said}")  # fmt: skip
            for line in kubelet_plugin_lines(ctx, node, 20, since=since):
                if subject.spec.resource in line and (m := TOO_LARGE.search(line)):
                    size, limit = int(m[1]), int(m[2])
                    return (f"{node}'s kubelet refused the plugin's ListAndWatch answer: "
                            f"{size:,} bytes ({expected_devices(ctx, subject, node):,} "
                            f"devices), past its gRPC limit of {limit:,} bytes ({limit >> 20} "
                            "MiB): advertise fewer devices")  # fmt: skip
        return None

    return why


def wait_allocatable(ctx: Context, node: str, allocatable: int, capacity: int | None,
                     deadline_s: float, resource: str) -> int:  # fmt: skip
    """Until `node` reports that allocatable (and capacity, if given) of `resource`; the
    time.time_ns() at which the API server's update arrived."""
    want = f"{allocatable}" + (f" of {capacity}" if capacity is not None else "")
    what = f"{node} {resource} allocatable {want}"

    def check(seen: dict[str, tuple[int, int]]) -> bool:
        cap, alloc = seen.get(node, (-1, -1))
        if capacity is not None and cap > capacity:
            # No fault adds a device: a plugin advertising more than the node has (an id it
            # could not read, say) will not come back by itself. Say so now rather than at
            # the deadline.
            raise StepError(f"waiting for {what}: capacity {cap}, more devices than the "
                            f"node has ({capacity}): the plugin advertises a device "
                            "that is not there")  # fmt: skip
        return alloc == allocatable and (capacity is None or cap == capacity)

    return wait_nodes(ctx, what, {node}, check, deadline_s, resource)


def mig_resources(ctx: Context, subject: Subject, node: str) -> dict[str, list[mig.MigDevice]]:
    """The node's MIG devices by the resource the subject's MIG strategy names them
    (NVIDIA's: single -> nvidia.com/gpu, mixed -> nvidia.com/mig-<profile>)."""
    out: dict[str, list[mig.MigDevice]] = {}
    single = subject.expects.mig == "single"
    for d in mig.devices(ctx.fake_gpus(node)):
        out.setdefault("nvidia.com/gpu" if single else f"nvidia.com/mig-{d.profile}", []).append(d)
    return out


def memory_units(gpu: Gpu, unit_mib: int) -> int:
    """A GPU's memory in a sharing plugin's units (whole units: NVML's total in MiB)."""
    return gpu.memory_total // (1 << 20) // unit_mib


def expected_devices(ctx: Context, subject: Subject, node: str) -> int:
    """How many devices of its resource the subject should advertise on `node`: the
    inventory's GPUs (times time-slicing replicas), for a MIG subject the node's MIG
    devices its strategy names so, for a sharing one the GPUs' memory in its units, from
    the node's fake state."""
    if subject.expects.mig != "none":
        return len(mig_resources(ctx, subject, node).get(subject.spec.resource, []))
    if (unit := subject.spec.expects.memory_unit_mib) is not None:
        return sum(memory_units(g, unit) for g in ctx.fake_gpus(node).node().gpus)
    spec = next(n for n in ctx.lab.gpu_nodes if n.name == node)
    return spec.gpu_count * subject.expects.replicas


def mark(ctx: Context, subject: Subject, pods: Pods) -> registration.Mark:
    """Taken before the plugin is deployed, switched or restarted: `wait_capacity(since=)`
    then waits for each new plugin pod's registration before it trusts a Node's status."""
    nodes = [n.name for n in ctx.lab.gpu_nodes
             if n.spec.plugin.start and expected_devices(ctx, subject, n.name)]  # fmt: skip
    return registration.mark(ctx.core, pods(None), subject.spec.resource, nodes)


def wait_capacity(ctx: Context, subject: Subject, pods: Pods, deadline_s: float = 300,
                  since: registration.Mark | None = None) -> None:  # fmt: skip
    """Until every GPU node whose plugin starts shows capacity = allocatable = its
    inventory (times the subject's time-slicing replicas); with `since`, only after every
    plugin pod started since that mark has registered with its kubelet."""
    if since is not None:
        # Bounded apart from the capacity wait, so that a plugin that never registers is
        # reported with its log and its kubelet's, then judged on capacity.
        try:
            # Every 0.5 s: each check scrapes ~240 KB of metrics per node.
            poll(f"{since.resource} plugins to register with their kubelets",
                 lambda: _registered(ctx, since, pods), min(deadline_s, 90),
                 interval_s=0.5)  # fmt: skip
        except StepError as e:
            ctx.console.print(f"[yellow]![/] {e}; waiting on capacity alone\n"
                              f"{_registration_diagnosis(ctx, since, pods)}",
                              highlight=False, markup=False)  # fmt: skip
    want = {n.name: expected_devices(ctx, subject, n.name) for n in ctx.lab.gpu_nodes
            if n.spec.plugin.start}  # fmt: skip

    def check(seen: dict[str, tuple[int, int]]) -> bool:
        return all(seen.get(n) == (c, c) for n, c in want.items())

    what = f"{subject.spec.resource} capacity = allocatable = inventory on {sorted(want)}"
    started = since.at if since is not None else time.time()
    give_up = hopeless(ctx, subject, pods, sorted(want), started)
    wait_nodes(ctx, what, set(want), check, deadline_s, subject.spec.resource, give_up)


def _registered(ctx: Context, since: registration.Mark, pods: Pods) -> tuple[bool, str]:
    pending = since.pending(ctx.core, pods(None))
    return not pending, f"not yet registered on {', '.join(pending)}"


def kubelet_plugin_lines(ctx: Context, node: str, lines: int = 8,
                         since: float | None = None) -> list[str]:  # fmt: skip
    """The last `lines` of `node`'s kubelet log about device plugins (registrations, streams
    that ended; since the epoch time `since` where given), for a diagnosis: never raises."""
    window = ["--since", f"@{int(since)}"] if since is not None else []
    try:
        journal = ctx.node_exec(node, "journalctl", "-u", "kubelet", "-n", "3000", *window,
                                "--no-pager", "-o", "cat").splitlines()  # fmt: skip
    except Exception as e:  # a diagnosis must not hide the failure it explains
        return [f"unreadable ({e.__class__.__name__})"]
    return [x[:300] for x in journal if "device plugin" in x.lower()][-lines:]


def registrations_since(ctx: Context, node: str, resource: str,
                        since: float) -> tuple[int, list[str]]:  # fmt: skip
    """`node`'s kubelet since the epoch time `since`: how often `resource` asked to register,
    and the lines showing it dropped the newest registration (registration.newest; [] when
    it stands or the log is unreadable)."""
    return registration.newest(kubelet_plugin_lines(ctx, node, 400, since), resource)


def _registration_diagnosis(ctx: Context, since: registration.Mark, pods: Pods,
                            lines: int = 8) -> str:  # fmt: skip
    """For a registration wait that timed out: each node's plugin log tail and its
    kubelet's device-manager lines (which side stopped short)."""
    out = []
    for node in since.seen:
        try:  # a diagnosis must not hide the failure it explains
            found = pods(node)
            log = ctx.kube.log_tail(found[0], lines) if found else ["no plugin pod"]
        except Exception as e:
            log = [f"unreadable ({e.__class__.__name__})"]
        kubelet = kubelet_plugin_lines(ctx, node, lines)
        out.append(f"  {node} plugin: " + "\n    ".join(log)
                   + f"\n  {node} kubelet: " + "\n    ".join(kubelet))  # fmt: skip
    return "\n".join(out)
