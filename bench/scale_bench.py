"""`make bench-scale`: the real kube-scheduler placing GPU pods across a KWOK fleet of copies
of one real GPU node (clusters/labs/fleet.py), at 100, 500 and 1,000 nodes.

For each fleet size and each workload: a fresh namespace; as many pods as fill the fleet,
created as fast as a few client threads can, each asking for one device; every pod's time
from its create call to its binding, taken from one watch (the moment its spec.nodeName
appears); the control plane's processes sampled each second from the host's /proc (CPU,
resident memory). Afterwards the claims are read back: each bound pod holds one device of
its own node's pool, and no device was given twice. Pods that never bind are counted (a
run ends when no pod has bound for STALL_S).

Workloads (WORKLOADS), each on its lab's GPU node with the most GPUs as the model (NVIDIA's
DRA driver publishes its slices; every copy publishes the same):
  claim     `dra` lab, the 8-GPU A100 node: a claim per pod from a ResourceClaimTemplate,
            one whole GPU of the driver's class
  extended  the same node: `nvidia.com/gpu: 1` in the pod's limits; the driver's DeviceClass
            names that extended resource, so the scheduler makes the claim
  cel       the same node: a claim whose CEL selects the model's product and at least its
            memory, as the model's slice states them
  mig       `dra-dynmig` lab, two H100s with DynamicMIG: a claim for one 1g.10gb device;
            every placement draws on its GPU's shared counters (14 pods fill a copy)
and, after them, Kubernetes' own scheduler_perf DRA workload (bench/scheduler_perf.py).

The client that creates the pods runs on the same cores as the control plane: its create
rate is in the JSON beside the scheduling rate, so a run limited by it shows it.

    python -m bench.scale_bench [--nodes 100,500,1000] [--workloads claim,extended,cel,mig]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench import scheduler_perf
from bench.rows import pct
from clusters import steps
from clusters.kube import absent_ok, or_none
from clusters.labs import dra, fleet, spec
from clusters.labs.lab import Lab

SIZES = (100, 500, 1000)
NAMESPACE = "bench-scale"
THREADS = 4  # client threads creating pods (more only queue on the same 2 cores)
STALL_S = 60.0  # a run ends when no pod has bound for this long
SAMPLE_S = 1.0
IDLE_S = 10.0  # the fleet sampled with no pod first: what KWOK's nodes cost by themselves
# New copies settle before the first run at a size: KWOK's first heartbeats and leases for
# hundreds of new nodes loaded the API server (the first workload at 500 nodes bound 13
# pods/s, the next two 18-21, their idle API server 0.42 cores against 0.21-0.26).
SETTLE_S = 60.0
# The control plane's processes, by their command name (/proc/PID/comm, 15 characters at
# most): the table shows the first two, the JSON all.
PROCESSES = ("kube-apiserver", "kube-scheduler", "kube-controller", "etcd", "kwok")


Template = tuple[str | None, str]  # a claim template's CEL selector (None: any) and class


@dataclass(frozen=True)
class Workload:
    name: str
    lab: str  # whose GPU node with the most GPUs is the model
    says: str
    # Claim templates the pods use, by name, from the lab and its model node.
    templates: Callable[[Lab, str], dict[str, Template]]
    pod: Callable[[str, str], dict]  # (pod name, image) -> pod spec
    # How many of its pods fill one copy of the model (from what the model publishes).
    per_node: Callable[[Lab, str], int]


def _claim_pod(template: str) -> Callable[[str, str], dict]:
    return lambda name, image: dra.pod(name, image, template)


def _extended_pod(name: str, image: str) -> dict:
    doc = dra.pod(name, image, "unused")
    doc["spec"].pop("resourceClaims")
    doc["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return doc


def _published(lab: Lab, model: str, kind: str, profile: str | None = None) -> int:
    """The model's devices of one type (`gpu`, `mig`), and of one MIG profile if given."""
    return sum(1 for d in dra.devices(lab, model).values()
               if dra.attribute(d, "type") == kind
               and (profile is None or dra.attribute(d, "profile") == profile))  # fmt: skip


def gpus(lab: Lab, model: str) -> int:
    return _published(lab, model, "gpu")


def cel_selector(lab: Lab, model: str) -> str:
    """The model's product, and at least its memory, as its slice states them."""
    device = next(d for d in dra.devices(lab, model).values() if dra.attribute(d, "type") == "gpu")
    product = dra.attribute(device, "productName")
    memory = (device.capacity or {})["memory"].value
    at_least = f"device.capacity['{dra.DRIVER}'].memory.compareTo(quantity('{memory}')) >= 0"
    return f"device.attributes['{dra.DRIVER}'].productName == '{product}' && {at_least}"


MIG_PROFILE = "1g.10gb"  # the smallest H100 slice: 7 a GPU, the counters' tightest fit

_WORKLOADS = (
    Workload("claim", "dra", "a claim per pod from a template: one whole GPU",
             lambda lab, model: {"whole": (None, dra.DEVICE_CLASS)}, _claim_pod("whole"), gpus),
    Workload("extended", "dra", "nvidia.com/gpu: 1 (the driver class's extended resource)",
             lambda lab, model: {}, _extended_pod, gpus),
    Workload("cel", "dra", "a claim selecting product and memory by CEL",
             lambda lab, model: {"by-cel": (cel_selector(lab, model), dra.DEVICE_CLASS)},
             _claim_pod("by-cel"), gpus),
    # DynamicMIG: each GPU published whole and as every MIG placement, all drawing on the
    # GPU's shared counters, so the scheduler checks counters for every placement it tries.
    Workload("mig", "dra-dynmig", f"a claim per pod for one {MIG_PROFILE} MIG device "
             "(DynamicMIG: placements and shared counters)",
             lambda lab, model: {"mig": (dra.profile_selector(MIG_PROFILE), dra.MIG_CLASS)},
             _claim_pod("mig"),
             lambda lab, model: _published(lab, model, "mig", MIG_PROFILE)),
)  # fmt: skip
WORKLOADS = {w.name: w for w in _WORKLOADS}


# -- the control plane's processes, from the host's /proc


def cpu_ticks(stat: str) -> int:
    """utime + stime from /proc/PID/stat (fields 14 and 15; the command name, field 2, may
    hold spaces and parentheses, so fields are counted after its last ')')."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


def rss_kib(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0  # a kernel thread or a process exiting


def container_pids(container_id: str, names: Sequence[str],
                   proc: Path = Path("/proc")) -> dict[str, int]:  # fmt: skip
    """The host PIDs of the processes named `names` in the container (kind's node: its
    cgroup path holds the container's id, the pods' processes nested under it)."""
    found: dict[str, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            mine = comm in names and comm not in found
            if mine and container_id in (entry / "cgroup").read_text():
                found[comm] = int(entry.name)
        except OSError:
            continue  # gone since the listing
    return found


@dataclass
class Usage:
    cpu_s: float = 0.0
    peak_rss_mib: float = 0.0


class Sampler(threading.Thread):
    """Each process's CPU seconds over the run and its peak resident memory, sampled."""

    def __init__(self, pids: dict[str, int], proc: Path = Path("/proc")) -> None:
        super().__init__(daemon=True)
        self.pids, self.proc = pids, proc
        self.hz = os.sysconf("SC_CLK_TCK")
        self.stop = threading.Event()
        self.first: dict[str, int] = {}
        self.usage = {name: Usage() for name in pids}

    def sample(self) -> None:
        for name, pid in self.pids.items():
            try:
                ticks = cpu_ticks((self.proc / str(pid) / "stat").read_text())
                rss = rss_kib((self.proc / str(pid) / "status").read_text()) / 1024
            except OSError:
                continue
            self.first.setdefault(name, ticks)
            u = self.usage[name]
            u.cpu_s = (ticks - self.first[name]) / self.hz
            u.peak_rss_mib = max(u.peak_rss_mib, rss)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_S)
        self.sample()


# -- bindings, from one watch


class RawWatch(threading.Thread):
    """One watch of a list, as raw JSON lines (the client's typed models cost a core at
    thousands of objects a minute), resumed from the last version it saw when it breaks.
    A subclass says what to list (`list`, which also takes the watch's arguments) and what
    each object seen means (`object_seen`)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.version = self.list()["metadata"]["resourceVersion"]
        self.stop = threading.Event()
        self.resp = None
        self.error = ""

    def list(self, **kw: object) -> dict:
        raise NotImplementedError

    def object_seen(self, obj: dict, now: float) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                # A read may wait as long as the server holds the watch open (the client's
                # 30 s would break it whenever nothing changed for that long).
                self.resp = self.list(watch=True, resource_version=self.version,
                                      timeout_seconds=600, _request_timeout=(10, 660),
                                      _preload_content=False)  # fmt: skip
                for line in iter_resp_lines(self.resp):
                    self.seen(json.loads(line))
            except Exception as e:  # closed by close(), or the watch broke
                if not self.stop.is_set():
                    self.error = f"{type(e).__name__}: {e}"
                    time.sleep(1)

    def seen(self, event: dict, now: float | None = None) -> None:
        if event["type"] == "ERROR":  # expired version: on from the newest
            self.version = self.list()["metadata"]["resourceVersion"]
            return
        self.version = event["object"]["metadata"]["resourceVersion"]
        self.object_seen(event["object"], time.monotonic() if now is None else now)

    def close(self) -> None:
        """Ends the watch now. close() alone waited for the reader thread's blocked read
        (a bench at 1,000 nodes hung in it until the server ended the quiet watch, up to
        its 600 s): shutdown() ends that read first (urllib3's way to unblock it). The
        response is closed once the reader has ended: closed while the reader's failed read
        was closing it too, close() raised "I/O operation on closed file" (CI, once)."""
        self.stop.set()
        resp = self.resp
        if resp is not None:
            resp.shutdown()
        self.join(timeout=10)
        if resp is not None:
            resp.close()


class Bindings(RawWatch):
    """When each pod of the namespace was first seen bound, and to which node."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.bound: dict[str, tuple[float, str]] = {}
        super().__init__()

    def list(self, **kw: object) -> dict:
        if kw.get("watch"):
            return self.core.list_namespaced_pod(self.namespace, **kw)
        resp = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        return json.loads(resp.data)

    def object_seen(self, obj: dict, now: float) -> None:
        name, node = obj["metadata"]["name"], obj["spec"].get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = (now, node)


# -- one run


@dataclass
class Run:
    workload: str
    nodes: int  # KWOK copies of the model
    pods: int
    bound: int = 0
    creates_per_s: float = 0.0
    pods_per_s: float = 0.0
    p50_s: float = 0.0
    p90_s: float = 0.0
    p99_s: float = 0.0
    wall_s: float = 0.0
    given_twice: int = 0  # devices allocated to more than one claim
    off_node: int = 0  # claims whose device is not of their pod's node
    usage: dict[str, Usage] = field(default_factory=dict)
    idle_cores: dict[str, float] = field(default_factory=dict)  # before the first pod


def summarize(run: Run, sent: dict[str, float], bound: dict[str, tuple[float, str]],
              created_by: float) -> Run:  # fmt: skip
    """Rates and percentiles from when each create was sent and each binding seen."""
    t0 = min(sent.values())
    lat = [bound[n][0] - sent[n] for n in sent if n in bound]
    run.bound = len(lat)
    run.creates_per_s = len(sent) / max(created_by - t0, 1e-9)
    if lat:
        last = max(t for t, _ in bound.values())
        run.wall_s = last - t0
        run.pods_per_s = len(lat) / max(run.wall_s, 1e-9)
        run.p50_s, run.p90_s, run.p99_s = (pct(lat, p) for p in (50, 90, 99))
    return run


def allocations(claims: Iterable[dict], bound: dict[str, tuple[float, str]]) -> tuple[int, int]:
    """Devices given to more than one claim, and claims whose device is not on the node
    their pod was bound to."""
    seen: dict[tuple[str, str], int] = {}
    off = 0
    for c in claims:
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        pods = [r["name"] for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        for r in results:
            key = (r["pool"], r["device"])
            seen[key] = seen.get(key, 0) + 1
            off += any(p in bound and bound[p][1] != r["pool"] for p in pods)
    return sum(1 for n in seen.values() if n > 1), off


def claims(lab: Lab) -> list[dict]:
    """The bench namespace's ResourceClaims, raw JSON."""
    return client.CustomObjectsApi(lab.kube.api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", NAMESPACE, "resourceclaims")["items"]  # fmt: skip


def delete_namespace(core: client.CoreV1Api, name: str, deadline_s: float = 600) -> None:
    """`name` deleted with everything in it (pods force-deleted: no kubelet on a KWOK node
    lets them go)."""
    if absent_ok(core.delete_collection_namespaced_pod, name, grace_period_seconds=0):
        absent_ok(core.delete_namespace, name)

    def gone() -> tuple[bool, str]:
        if or_none(core.read_namespace, name) is None:
            return True, "gone"
        return False, f"namespace {name} still terminating"

    steps.poll(f"namespace {name} gone", gone, deadline_s)


def measure(lab: Lab, model: str, nodes: int, work: Workload, pods: int, console: Console) -> Run:
    core = lab.core
    delete_namespace(core, NAMESPACE)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    for name, (selector, device_class) in work.templates(lab, model).items():
        dra.create_template(lab, NAMESPACE, name, selector, device_class=device_class)
    cp = lab.lab.control_plane.name
    import docker

    pids = container_pids(docker.from_env().containers.get(cp).id, PROCESSES)
    idle = Sampler(pids)
    idle.start()
    time.sleep(IDLE_S)
    idle.stop.set()
    idle.join()
    sampler = Sampler(pids)
    watch = Bindings(core, NAMESPACE)
    names = [f"p-{i:05d}" for i in range(pods)]
    sent: dict[str, float] = {}
    image = lab.images["workload"]

    def create(name: str) -> None:
        sent[name] = time.monotonic()
        core.create_namespaced_pod(NAMESPACE, fleet.on_fleet(work.pod(name, image), model))

    run = Run(work.name, nodes, pods)
    watch.start()
    sampler.start()
    columns = (TextColumn(f"{work.name} x {nodes} nodes"), BarColumn(), MofNCompleteColumn(),
               TextColumn("bound"), TimeElapsedColumn())  # fmt: skip
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("", total=pods)
            with ThreadPoolExecutor(THREADS) as pool:
                for _ in pool.map(create, names):
                    bar.update(task, completed=len(watch.bound))
            created_by = time.monotonic()
            last, count = time.monotonic(), len(watch.bound)
            while count < pods and time.monotonic() - last < STALL_S:
                time.sleep(0.5)
                if len(watch.bound) != count:
                    last, count = time.monotonic(), len(watch.bound)
                bar.update(task, completed=count)
    finally:
        watch.close()
        sampler.stop.set()
        sampler.join()
    if watch.error:
        console.print(f"[yellow]the watch broke once and went on: {watch.error}")
    summarize(run, sent, dict(watch.bound), created_by)
    run.given_twice, run.off_node = allocations(claims(lab), watch.bound)
    run.usage = sampler.usage
    run.idle_cores = {k: round(u.cpu_s / IDLE_S, 3) for k, u in idle.usage.items()}
    return run


def lab_spec(name: str, node_lease_s: int | None) -> spec.Lab:
    """The lab's spec, its fleet nodes' Lease `node_lease_s` long where given (a changed
    lease is a changed kind config: a running lab of the other is made again)."""
    return spec.load(name, None if node_lease_s is None else {"fleet_node_lease": node_lease_s})


def model_node(lab: Lab) -> str:
    """The lab's GPU node with the most GPUs (the first of them)."""
    if not lab.lab.gpu_nodes:
        raise steps.StepError(f"lab {lab.name} has no GPU node to copy")
    return max(lab.lab.gpu_nodes, key=lambda n: n.gpu_count).name


def on_lab(lab: Lab, works: Sequence[Workload], sizes: Sequence[int], fill: float,
           console: Console) -> tuple[list[Run], str]:  # fmt: skip
    """Each workload at each fleet size, on copies of the lab's biggest GPU node; the fleet
    deleted afterwards (the lab stays up). A fleet that does not get Ready ends the lab's
    curve there (a bigger one would not either): the runs so far, and why it stopped."""
    model, runs, stopped = model_node(lab), [], ""
    try:
        for n in sizes:
            with console.status(f"{n} KWOK copies of {model}, then {SETTLE_S:.0f} s to settle"):
                try:
                    fleet.up(lab.ctx, model, n)
                except steps.StepError as e:
                    stopped = f"{lab.name} at {n} copies: {e}"
                    console.print(f"[red]{stopped}")
                    break
                time.sleep(SETTLE_S)
            for w in works:
                pods = max(1, round(n * w.per_node(lab, model) * fill))
                r = measure(lab, model, n, w, pods, console)
                idle = ", ".join(f"{k} {v:.2f}" for k, v in r.idle_cores.items())
                console.print(f"{w.name} x {n} nodes: {r.bound}/{r.pods} bound, "
                              f"{r.pods_per_s:.1f}/s, p99 {r.p99_s:.2f} s; "
                              f"cores with the fleet idle: {idle}")  # fmt: skip
                runs.append(r)
    finally:
        with console.status("the fleet and its pods deleted"):
            delete_namespace(lab.core, NAMESPACE)
            fleet.down(lab.ctx)
    return runs, stopped


def table(runs: Sequence[Run]) -> Table:
    """A row per run, narrow enough for a terminal (p90, the create rate and every process
    are in the JSON). CPU is in cores: its seconds over the run's."""
    t = Table(title="the kube-scheduler on a KWOK fleet: one pod per GPU", box=box.SIMPLE_HEAD)
    heads = ("workload", "nodes", "pods", "left", "pods/s", "p50 s", "p99 s",
             "api cores", "api MiB", "sched cores", "sched MiB", "wrong")  # fmt: skip
    for col in heads:
        t.add_column(col, justify="left" if col == "workload" else "right", no_wrap=True)
    for r in runs:
        api, sched = (r.usage.get(p, Usage()) for p in PROCESSES[:2])
        cores = [f"{u.cpu_s / max(r.wall_s, 1e-9):.2f}" for u in (api, sched)]
        t.add_row(r.workload, str(r.nodes), str(r.pods), str(r.pods - r.bound),
                  f"{r.pods_per_s:.1f}", f"{r.p50_s:.1f}", f"{r.p99_s:.1f}",
                  cores[0], f"{api.peak_rss_mib:.0f}", cores[1], f"{sched.peak_rss_mib:.0f}",
                  str(r.given_twice + r.off_node))  # fmt: skip
    t.caption = ("left: never bound; wrong: devices given twice or off their pod's node; "
                 "pods/s: bound over first create to last binding")  # fmt: skip
    return t


def beside(runs: Sequence[Run], perf: dict[str, float]) -> str:
    """scheduler_perf's throughput, and gpulab's claim workload's at its size beside it."""
    p50, p90 = perf.get("Perc50", 0), perf.get("Perc90", 0)
    said = (f"scheduler_perf {scheduler_perf.WORKLOAD}: {perf['Average']:.1f} pods/s on "
            f"average (p50 {p50:.0f}, p90 {p90:.0f})")  # fmt: skip
    near = [r for r in runs if r.workload == "claim" and r.pods_per_s]
    if near:
        r = min(near, key=lambda r: abs(r.nodes - scheduler_perf.NODES))
        said += (f"; gpulab's claim workload on {r.nodes} KWOK nodes: "
                 f"{r.pods_per_s:.1f} pods/s, {r.pods_per_s / perf['Average']:.2f}x")  # fmt: skip
    return said


def plot(runs: Sequence[Run], out: Path, perf: dict[str, float] | None = None) -> None:
    """Pods bound per second and p99 create-to-bound by fleet size, a line per workload;
    scheduler_perf's average throughput a point at its size (its percentiles are of
    throughput, not of a pod's wait: no point on the right)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt

    fig, (rate, tail) = plt.subplots(1, 2, figsize=(10, 4))
    for w in dict.fromkeys(r.workload for r in runs):
        mine = sorted((r for r in runs if r.workload == w), key=lambda r: r.nodes)
        rate.plot([r.nodes for r in mine], [r.pods_per_s for r in mine], marker="o", label=w)
        tail.plot([r.nodes for r in mine], [r.p99_s for r in mine], marker="o", label=w)
    if perf:
        rate.plot([scheduler_perf.NODES], [perf["Average"]], marker="*", markersize=12,
                  linestyle="none", color="black", label="scheduler_perf")  # fmt: skip
    rate.set(xlabel="KWOK nodes", ylabel="pods bound per second", ylim=(0, None))
    tail.set(xlabel="KWOK nodes", ylabel="p99 create to bound (s)", ylim=(0, None))
    rate.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=",".join(map(str, SIZES)),
                    help="fleet sizes, comma-separated (default %(default)s)")  # fmt: skip
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="of " + ", ".join(WORKLOADS) + " (default all)")  # fmt: skip
    ap.add_argument("--fill", type=float, default=1.0,
                    help="share of the fleet's devices the pods ask for (default 1)")  # fmt: skip
    ap.add_argument("--no-scheduler-perf", action="store_true",
                    help="leave out Kubernetes' own scheduler_perf DRA workload")  # fmt: skip
    ap.add_argument("--node-lease", type=int, default=None, metavar="SECONDS",
                    help="the labs' fleet_node_lease for this run (their spec's by default: "
                    "40, a kubelet's); longer for fleets of thousands on few cores")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("build/bench-scale.json"))
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(n) for n in args.nodes.split(",")})
    except ValueError:
        ap.error(f"--nodes {args.nodes!r}: whole numbers, comma-separated")
    if min(sizes) < 1:
        ap.error(f"--nodes {args.nodes!r}: 1 or more")
    if not 0 < args.fill <= 1:
        ap.error(f"--fill {args.fill}: more than 0, at most 1")
    if unknown := [w for w in args.workloads.split(",") if w not in WORKLOADS]:
        ap.error(f"--workloads: no workload {', '.join(unknown)} (of {', '.join(WORKLOADS)})")
    works = [WORKLOADS[w] for w in args.workloads.split(",")]
    try:  # every lab's spec for the run, checked before anything is built or brought up
        specs = {w.lab: lab_spec(w.lab, args.node_lease) for w in works}
    except spec.SpecError as e:  # only --node-lease overrides a spec: name it where given
        ap.error(str(e) if args.node_lease is None else f"--node-lease {args.node_lease}: {e}")
    # Its table is 12 columns: a log (no terminal, 80 columns by default) gets them whole.
    console = Console() if Console().is_terminal else Console(width=120)
    if not args.no_scheduler_perf:  # built first: a build would load the runs
        with console.status("Kubernetes' scheduler_perf DRA benchmarks (built once, cached)"):
            scheduler_perf.build()
    runs: list[Run] = []
    stopped: list[str] = []
    for name, lab in specs.items():  # one lab at a time, in workload order
        mine = [w for w in works if w.lab == name]
        got, why = on_lab(Lab(lab, console=console).up(), mine, sizes, args.fill, console)
        runs += got
        stopped += [why] if why else []
    console.print(table(runs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "time": time.time(),
            "threads": THREADS, "fill": args.fill, "node_lease_s": args.node_lease,
            "workloads": {w.name: f"{w.lab} lab: {w.says}" for w in works}}  # fmt: skip
    doc: dict = {"meta": meta, "runs": [asdict(r) for r in runs], "stopped": stopped,
                 "scheduler_perf": None}  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=2))  # the runs kept whatever follows
    png = args.out.with_suffix(".png")
    plot(runs, png)
    console.print(f"wrote {args.out} and {png}")
    for why in stopped:  # said again last, where a reader of the log looks
        console.print(f"[red]stopped: {why}")
    if args.no_scheduler_perf:
        return 1 if stopped else 0
    try:
        with console.status(f"Kubernetes' scheduler_perf {scheduler_perf.WORKLOAD}"):
            perf = scheduler_perf.run(args.out.parent / "scheduler-perf")
    except steps.StepError as e:
        console.print(f"[red]{e}")
        doc["scheduler_perf"] = {"workload": scheduler_perf.WORKLOAD, "error": str(e)}
        args.out.write_text(json.dumps(doc, indent=2))
        return 1
    console.print(beside(runs, perf))
    doc["scheduler_perf"] = {"workload": scheduler_perf.WORKLOAD, **perf}
    args.out.write_text(json.dumps(doc, indent=2))
    plot(runs, png, perf)
    return 1 if stopped else 0


if __name__ == "__main__":
    raise SystemExit(main())
