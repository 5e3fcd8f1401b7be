"""`make bench-kueue`: Kueue admitting GPU jobs within a quota on a KWOK fleet, the rest queued.

On the `hetero` lab (an A100, an H100 and a T4 node, gpulab's device plugin, NFD and GFD):
KWOK copies of each GPU node (clusters/labs/fleet.py: their capacity and GFD's labels as
the model shows them), Kueue from its own chart and module (clusters/labs/kueue.py), a
ResourceFlavor per GPU product read from GFD's labels on the fleet, and a ClusterQueue whose
quota is `--share` of each product's GPUs there, as most Kueue users set up GPUs. Then
`--jobs` one-GPU Jobs (`nvidia.com/gpu: 1`) are created at once in one LocalQueue:

1. Kueue admits them within the quota and leaves the rest queued: the Workloads admitted
   and not finished, per flavor, never exceed its quota (read from one watch, in the API
   server's order);
2. the kube-scheduler binds each admitted Job's pod to a fleet node of its flavor's product,
   KWOK runs it and completes it (a Job's pod, KWOK's stage-fast), its quota comes back and
   the next is admitted, until every Job finished;
3. afterwards every pod's node is checked against its Workload's flavor.

Figures: Jobs admitted per second, p50 / p99 from create to admitted and to finished,
queued when the last Job was created, peak use of each flavor against its quota. A table
and JSON (`--out`). Kueue is built by `make infra` (its `kueue` group).

    python -m bench.kueue_bench [--copies 50] [--jobs 1000] [--share 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubernetes import client
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.rows import pct
from bench.scale_bench import SETTLE_S, STALL_S, THREADS, RawWatch, delete_namespace
from clusters import steps
from clusters.labs import fleet, kueue
from clusters.labs.lab import Lab

LAB = "hetero"  # three GPU products, each labelled by GFD
NAMESPACE = "bench-kueue"
QUEUE, CLUSTER_QUEUE = "gpus", "bench-gpus"


@dataclass
class Flavor:
    product: str
    gpus: int  # in the fleet
    quota: int
    peak: int = 0  # admitted and not finished at once, at most


@dataclass
class Result:
    copies: int  # of each GPU node
    nodes: int
    jobs: int
    flavors: dict[str, Flavor] = field(default_factory=dict)
    created_s: float = 0.0  # the first create to the last
    queued_at_last_create: int = 0  # Workloads not admitted when the last Job was created
    admitted: int = 0
    finished: int = 0
    admitted_per_s: float = 0.0
    admit_p50_s: float = 0.0
    admit_p99_s: float = 0.0
    finish_p50_s: float = 0.0
    finish_p99_s: float = 0.0
    wall_s: float = 0.0  # the first create to the last finish
    over_quota: int = 0  # admissions that took a flavor past its quota
    wrong_node: int = 0  # pods on a node whose product is not their flavor's


class Workloads(RawWatch):
    """Each Workload's admission (time and flavor) and finish, from one raw watch, in the
    API server's order, with each flavor's use (admitted, not finished) at its peak."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str) -> None:
        self.custom, self.namespace = custom, namespace
        self.admitted: dict[str, tuple[float, str]] = {}  # Job -> (when, flavor)
        self.finished: dict[str, float] = {}
        self.use: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.over: list[str] = []  # "job on flavor: use > quota"
        self.quota: dict[str, int] = {}
        super().__init__()

    def list(self, **kw: object) -> dict:
        return self.custom.list_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, self.namespace, "workloads", **kw)  # fmt: skip

    def object_seen(self, w: dict, now: float) -> None:
        job = owner_job(w)
        flavor = kueue.admitted_flavor(w)
        if flavor and job not in self.admitted:
            self.admitted[job] = (now, flavor)
            self.use[flavor] = self.use.get(flavor, 0) + 1
            self.peak[flavor] = max(self.peak.get(flavor, 0), self.use[flavor])
            if self.use[flavor] > self.quota.get(flavor, 0):
                self.over.append(f"{job} on {flavor}: {self.use[flavor]} > "
                                 f"{self.quota.get(flavor, 0)}")  # fmt: skip
        if kueue.condition(w, "Finished") and job not in self.finished:
            self.finished[job] = now
            if job in self.admitted:
                self.use[self.admitted[job][1]] -= 1

    def moved(self) -> int:
        """Admissions and finishes seen so far: a run moves while this grows."""
        return len(self.admitted) + len(self.finished)


def owner_job(workload: dict) -> str:
    """The Job a Workload is Kueue's for (its owner), else the Workload's own name."""
    for ref in workload["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Job":
            return ref["name"]
    return workload["metadata"]["name"]


def summarize(r: Result, sent: dict[str, float], seen: Workloads) -> Result:
    t0 = min(sent.values())
    admit = [seen.admitted[j][0] - sent[j] for j in sent if j in seen.admitted]
    finish = [seen.finished[j] - sent[j] for j in sent if j in seen.finished]
    r.admitted, r.finished = len(admit), len(finish)
    if admit:
        last = max(seen.admitted[j][0] for j in sent if j in seen.admitted)
        r.admitted_per_s = len(admit) / max(last - t0, 1e-9)
        r.admit_p50_s, r.admit_p99_s = pct(admit, 50), pct(admit, 99)
    if finish:
        r.wall_s = max(seen.finished[j] for j in sent if j in seen.finished) - t0
        r.finish_p50_s, r.finish_p99_s = pct(finish, 50), pct(finish, 99)
    for name, f in r.flavors.items():
        f.peak = seen.peak.get(name, 0)
    r.over_quota = len(seen.over)
    return r


def wrong_nodes(pods: Sequence[client.V1Pod], products: dict[str, str],
                flavors: dict[str, str]) -> list[str]:  # fmt: skip
    """Pods bound to a node whose GPU product is not the one of their Job's flavor.
    `products`: node -> product; `flavors`: Job -> flavor."""
    wrong = []
    for p in pods:
        job = (p.metadata.labels or {}).get("job-name", "")
        node = p.spec.node_name
        if not node or job not in flavors:
            continue
        if kueue.flavor_name(products.get(node, "")) != flavors[job]:
            wrong.append(f"{p.metadata.name} on {node} ({products.get(node)}), "
                         f"flavor {flavors[job]}")  # fmt: skip
    return wrong


def stalled(pods: Sequence[client.V1Pod]) -> str:
    """The pods by phase, and what the scheduler said of one that is Pending."""
    phases: dict[str, int] = {}
    said = ""
    for p in pods:
        phase = p.status.phase if p.status else "?"
        phases[phase] = phases.get(phase, 0) + 1
        for c in (p.status.conditions or []) if phase == "Pending" and not said else []:
            if c.type == "PodScheduled" and c.status == "False":
                said = f"; {p.metadata.name}: {c.message}"
    counts = ", ".join(f"{n} {k}" for k, n in sorted(phases.items())) or "no pods"
    return counts + said


def measure(lab: Lab, image: str, copies: int, jobs: int, share: float,
            console: Console) -> Result:  # fmt: skip
    ctx, core = lab.ctx, lab.core
    nodes = [n for n in core.list_node(label_selector=fleet.FLEET_LABEL).items]
    found = kueue.products(nodes)
    if not found:
        raise steps.StepError(f"no fleet node of lab {lab.name} has GFD's {kueue.PRODUCT}")
    r = Result(copies, len(nodes), jobs)
    r.flavors = {kueue.flavor_name(p): Flavor(p, g, max(1, int(g * share)))
                 for p, g in sorted(found.items())}  # fmt: skip
    delete_namespace(core, NAMESPACE)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    for f in r.flavors.values():
        kueue.create(ctx, kueue.resource_flavor(f.product))
    quotas = {f.product: f.quota for f in r.flavors.values()}
    kueue.create(ctx, kueue.cluster_queue(CLUSTER_QUEUE, quotas))
    kueue.create(ctx, kueue.local_queue(QUEUE, NAMESPACE, CLUSTER_QUEUE))
    seen = Workloads(kueue.custom(ctx), NAMESPACE)
    seen.quota = {name: f.quota for name, f in r.flavors.items()}
    batch = client.BatchV1Api(ctx.kube.api)
    names = [f"j-{i:05d}" for i in range(jobs)]
    sent: dict[str, float] = {}
    work = lab.images["workload"]

    def create(name: str) -> None:
        sent[name] = time.monotonic()
        batch.create_namespaced_job(NAMESPACE, kueue.job(name, QUEUE, work))

    columns = (TextColumn(f"{jobs} jobs on {len(nodes)} nodes"), BarColumn(),
               MofNCompleteColumn(), TextColumn("finished"), TimeElapsedColumn())  # fmt: skip
    seen.start()
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("", total=jobs)
            with ThreadPoolExecutor(THREADS) as pool:
                for _ in pool.map(create, names):
                    bar.update(task, completed=len(seen.finished))
            r.created_s = time.monotonic() - min(sent.values())
            r.queued_at_last_create = jobs - len(seen.admitted)
            # Ends when all finished, or nothing moved (no Workload admitted or finished)
            # for STALL_S: admitting a queue this long takes longer than that.
            last, moved = time.monotonic(), seen.moved()
            while len(seen.finished) < jobs and time.monotonic() - last < STALL_S:
                time.sleep(0.5)
                if seen.moved() != moved:
                    last, moved = time.monotonic(), seen.moved()
                bar.update(task, completed=len(seen.finished))
    finally:
        seen.close()
    if seen.error:
        console.print(f"[yellow]the watch broke once and went on: {seen.error}")
    pods = core.list_namespaced_pod(NAMESPACE).items
    if len(seen.finished) < jobs:
        console.print(f"[yellow]nothing moved for {STALL_S:.0f} s: {stalled(pods)}")
    summarize(r, sent, seen)
    for line in seen.over[:5]:
        console.print(f"[red]over quota: {line}")
    products = {n.metadata.name: (n.metadata.labels or {}).get(kueue.PRODUCT, "") for n in nodes}
    flavors = {j: f for j, (_, f) in seen.admitted.items()}
    wrong = wrong_nodes(pods, products, flavors)
    r.wrong_node = len(wrong)
    for line in wrong[:5]:
        console.print(f"[red]wrong node: {line}")
    return r


def table(r: Result) -> Table:
    """Each flavor's quota and peak use; the run's figures under it (`summary`)."""
    t = Table(title=f"Kueue: {r.jobs} one-GPU jobs on {r.nodes} KWOK nodes "
                    f"({r.copies} copies of each GPU node)", box=box.SIMPLE_HEAD)  # fmt: skip
    for col in ("flavor", "GPUs", "quota", "peak use"):
        t.add_column(col, justify="left" if col == "flavor" else "right")
    for name, f in r.flavors.items():
        t.add_row(name, str(f.gpus), str(f.quota), str(f.peak))
    return t


def summary(r: Result) -> list[str]:
    return [f"queued when the last job was created ({r.created_s:.1f} s after the first): "
            f"{r.queued_at_last_create}",
            f"admitted {r.admitted}, finished {r.finished} in {r.wall_s:.1f} s: "
            f"{r.admitted_per_s:.1f} admitted/s",
            f"create to admitted: p50 {r.admit_p50_s:.1f} s, p99 {r.admit_p99_s:.1f} s; "
            f"to finished: p50 {r.finish_p50_s:.1f} s, p99 {r.finish_p99_s:.1f} s",
            f"admissions past a flavor's quota: {r.over_quota}; pods on another product's "
            f"node: {r.wrong_node}"]  # fmt: skip


def ok(r: Result) -> bool:
    """Every Job admitted and finished, none past its flavor's quota or on another product."""
    return r.admitted == r.finished == r.jobs and not r.over_quota and not r.wrong_node


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=50,
                    help="KWOK copies of each GPU node (default %(default)s)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=1000, help="default %(default)s")
    ap.add_argument("--share", type=float, default=0.5,
                    help="each product's quota: its GPUs' share (default %(default)s)")  # fmt: skip
    ap.add_argument("--qps", type=int, default=None,
                    help="Kueue's client requests a second (default: its config's 50)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("build/bench-kueue.json"))
    args = ap.parse_args(argv)
    if args.copies < 1 or args.jobs < 1:
        ap.error(f"--copies {args.copies}, --jobs {args.jobs}: 1 or more")
    if not 0 < args.share <= 1:
        ap.error(f"--share {args.share}: more than 0, at most 1")
    if args.qps is not None and args.qps < 1:
        ap.error(f"--qps {args.qps}: 1 or more")
    console = Console() if Console().is_terminal else Console(width=120)
    lab = Lab(LAB).up()
    image = kueue.image(lab.ctx)
    try:
        with console.status(f"{args.copies} KWOK copies of each GPU node, then {SETTLE_S:.0f} s"):
            for n in lab.lab.gpu_nodes:
                fleet.up(lab.ctx, n.name, args.copies)
            time.sleep(SETTLE_S)
        with console.status(f"Kueue {image}"):
            kueue.install(lab.ctx, image, args.qps)
        r = measure(lab, image, args.copies, args.jobs, args.share, console)
    finally:
        with console.status("the jobs, Kueue and the fleet deleted"):
            delete_namespace(lab.core, NAMESPACE)
            kueue.uninstall(lab.ctx, image)
            fleet.down(lab.ctx)
    console.print(table(r))
    for line in summary(r):
        console.print(line, highlight=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "time": time.time(),
            "threads": THREADS, "share": args.share, "kueue": image,
            "kueue_qps": args.qps or 50}  # fmt: skip
    args.out.write_text(json.dumps({"meta": meta, "result": asdict(r)}, indent=2))
    console.print(f"wrote {args.out}")
    return 0 if ok(r) else 1


if __name__ == "__main__":
    raise SystemExit(main())
