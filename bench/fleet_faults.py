"""`make bench-faults`: GPUs failing on part of a fleet at once, and the scheduler around them.

On the `dra` lab: KWOK copies of its 8-GPU A100 node (clusters/labs/fleet.py), live ones
among them (each with NVIDIA's DRA driver of its own on fake GPUs of its own):

1. a first wave of one-GPU claim pods fills half the fleet's GPUs; KWOK runs them;
2. at once, on `--share` of the live copies (at least two): every GPU of the first half of
   them gets an Xid 79, one GPU of each of the others is lost, each in its own fake GPUs;
3. each faulted copy's driver taints its devices (`xid=79`; `gpu-lost` on all its devices,
   NVML's event wait naming no GPU): the time from the injection to each copy's taints;
4. a second wave asks for every GPU still free on healthy copies, and EXTRA pods more,
   which must stay Pending: no new pod on a faulted copy;
5. afterwards: every first-wave pod still bound where it was, its claim still allocated
   (no pod or claim lost); no device given twice.

A table, JSON (`--out`) and a timeline (the same name, .png): devices tainted and
second-wave pods bound, by seconds from the injection.

    python -m bench.fleet_faults [--copies 100] [--live 100] [--share 0.05]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.rows import pct
from bench.scale_bench import (
    NAMESPACE,
    THREADS,
    Bindings,
    allocations,
    claims,
    delete_namespace,
)
from clusters import steps
from clusters.labs import dra, fleet
from clusters.labs.lab import Lab

LAB = "dra"
TEMPLATE = "one-gpu"
EXTRA = 8  # second-wave pods beyond the healthy free GPUs: each must stay Pending
TAINT_S = 120.0  # for every faulted copy's taints
BIND_S = 300.0  # for a wave to bind
POLL_S = 0.25


@dataclass
class Result:
    copies: int
    live: int
    gpus: int  # in the fleet
    fleet_s: float = 0.0  # to make it: Ready, every live copy's slices published
    xid_nodes: list[str] = field(default_factory=list)
    lost_nodes: list[str] = field(default_factory=list)
    first_wave: int = 0
    first_bound_s: float = 0.0
    taint_s: dict[str, float] = field(default_factory=dict)  # copy -> its taints seen
    tainted_devices: int = 0
    elsewhere: list[str] = field(default_factory=list)  # tainted devices outside the faulted
    second_wave: int = 0
    second_bound: int = 0
    second_bound_s: float = 0.0
    on_faulted: int = 0  # second-wave pods bound to a faulted copy
    pending: int = 0  # second-wave pods never bound
    first_moved_or_lost: int = 0  # first-wave pods no longer bound where they were
    claims_lost: int = 0  # first-wave claims no longer allocated
    given_twice: int = 0
    timeline: dict[str, list[float]] = field(default_factory=dict)  # series -> seconds


def faulted(live: Sequence[str], share: float) -> tuple[list[str], list[str]]:
    """The live copies that fail: `share` of them, at least two, the first half (rounded
    up) with Xids, the rest with a lost GPU."""
    n = min(len(live), max(2, math.ceil(len(live) * share)))
    half = math.ceil(n / 2)
    return list(live[:half]), list(live[half:n])


def tainted(slices: Sequence[dict]) -> dict[str, set[str]]:
    """node -> its devices that have any taint (raw ResourceSlice JSON)."""
    out: dict[str, set[str]] = {}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d.get("taints"):
                out.setdefault(s["spec"]["nodeName"], set()).add(d["name"])
    return out


def checks(r: Result) -> list[str]:
    """What the run must show; empty when it did."""
    bad = []
    if set(r.taint_s) != set(r.xid_nodes + r.lost_nodes):
        bad.append(f"taints seen on {sorted(r.taint_s)}, faulted {r.xid_nodes + r.lost_nodes}")
    if r.elsewhere:
        bad.append(f"devices tainted off the faulted copies: {r.elsewhere[:5]}")
    if r.on_faulted:
        bad.append(f"{r.on_faulted} second-wave pods bound to a faulted copy")
    if r.second_bound != r.second_wave - EXTRA or r.pending != EXTRA:
        bad.append(f"second wave: {r.second_bound} bound, {r.pending} pending; want "
                   f"{r.second_wave - EXTRA} and {EXTRA}")  # fmt: skip
    if r.first_moved_or_lost or r.claims_lost or r.given_twice:
        bad.append(f"first wave: {r.first_moved_or_lost} pods moved or lost, {r.claims_lost} "
                   f"claims lost; {r.given_twice} devices given twice")  # fmt: skip
    return bad


def _wave(lab: Lab, model: str, names: Sequence[str], watch: Bindings, want: int,
          console: Console, what: str) -> float:  # fmt: skip
    """Creates the pods; seconds until `want` of them are bound (or BIND_S)."""
    image = lab.images["workload"]
    t0 = time.monotonic()

    def create(name: str) -> None:
        lab.core.create_namespaced_pod(
            NAMESPACE, fleet.on_fleet(dra.pod(name, image, TEMPLATE), model))  # fmt: skip

    with console.status(f"{what}: {len(names)} pods"), ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(create, names))
    steps.poll(f"{what}: {want} pods bound",
               lambda: (sum(n in watch.bound for n in names) >= want,
                        f"{sum(n in watch.bound for n in names)} bound"), BIND_S)  # fmt: skip
    return time.monotonic() - t0


def run(lab: Lab, copies: int, live: int, share: float, console: Console) -> Result:
    model = max(lab.lab.gpu_nodes, key=lambda n: n.gpu_count).name
    per = next(n.gpu_count for n in lab.lab.gpu_nodes if n.name == model)
    t = time.monotonic()
    with console.status(f"{copies} KWOK copies of {model}, {live} live"):
        made = fleet.up(lab.ctx, model, copies, live=live)
    r = Result(copies, live, copies * per, fleet_s=round(time.monotonic() - t, 1))
    r.xid_nodes, r.lost_nodes = faulted(made[:live], share)
    core = lab.core
    delete_namespace(core, NAMESPACE)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    dra.create_template(lab, NAMESPACE, TEMPLATE)
    watch = Bindings(core, NAMESPACE)
    watch.start()
    try:
        first = [f"a-{i:05d}" for i in range(r.gpus // 2)]
        r.first_wave = len(first)
        took = _wave(lab, model, first, watch, len(first), console, "first wave")
        r.first_bound_s = round(took, 2)
        where = {n: watch.bound[n][1] for n in first}
        before = {c["metadata"]["name"]: c["status"]["allocation"] for c in claims(lab)}
        # The fault, on every chosen copy at once (one journal append each).
        t0 = time.monotonic()
        for node in r.xid_nodes:
            for gpu in range(per):
                fleet.live_state(lab.ctx, model, node).inject_xid(gpu, 79)
        for node in r.lost_nodes:
            fleet.live_state(lab.ctx, model, node).lose(0)
        want = set(r.xid_nodes + r.lost_nodes)
        seen: dict[str, set[str]] = {}
        with console.status("the drivers tainting their devices"):
            while time.monotonic() - t0 < TAINT_S:
                seen = tainted(fleet.slices(lab.ctx))
                for node in want & set(seen):
                    if len(seen[node]) == per and node not in r.taint_s:
                        r.taint_s[node] = round(time.monotonic() - t0, 2)
                if set(r.taint_s) == want:
                    break
                time.sleep(POLL_S)
        r.tainted_devices = sum(len(v) for v in seen.values())
        r.elsewhere = sorted(f"{n}/{d}" for n, ds in seen.items() if n not in want for d in ds)
        # Every GPU free on a healthy copy, and EXTRA more.
        busy = sum(1 for n in first if where[n] not in want)
        free = r.gpus - per * len(want) - busy
        second = [f"b-{i:05d}" for i in range(free + EXTRA)]
        r.second_wave = len(second)
        t1 = time.monotonic()
        r.second_bound_s = round(_wave(lab, model, second, watch, free, console, "second wave"), 2)
        time.sleep(5)  # any pod that would still bind (it must not)
        bound = {n: watch.bound[n] for n in second if n in watch.bound}
        r.second_bound, r.pending = len(bound), len(second) - len(bound)
        r.on_faulted = sum(1 for _, node in bound.values() if node in want)
        listed = core.list_namespaced_pod(NAMESPACE).items
        pods = {p.metadata.name: p.spec.node_name for p in listed}
        r.first_moved_or_lost = sum(1 for n in first if pods.get(n) != where[n])
        after = {c["metadata"]["name"]: (c.get("status") or {}).get("allocation")
                 for c in claims(lab)}  # fmt: skip
        r.claims_lost = sum(1 for name, a in before.items() if after.get(name) != a)
        r.given_twice, _ = allocations(claims(lab), dict(watch.bound))
        r.timeline = {
            "taints": sorted(r.taint_s.values()),
            "second wave bound": sorted(round(t - t0, 2) for t, _ in bound.values()),
            "second wave created": [round(t1 - t0, 2)],
        }
    finally:
        watch.close()
        with console.status("the fleet and its pods deleted"):
            delete_namespace(core, NAMESPACE)
            fleet.down(lab.ctx)
    return r


def table(r: Result) -> Table:
    t = Table(title=f"A fault on part of a fleet: {r.copies} copies of the A100 node "
                    f"({r.gpus} GPUs), {r.live} live")  # fmt: skip
    t.add_column("what")
    t.add_column("measured", justify="right")
    taints = list(r.taint_s.values())
    rows = [
        ("the fleet made (live copies' slices published)", f"{r.fleet_s:.0f} s"),
        ("first wave (half the GPUs) bound", f"{r.first_wave} in {r.first_bound_s:.1f} s"),
        ("copies faulted: Xid 79 on every GPU / one GPU lost",
         f"{len(r.xid_nodes)} / {len(r.lost_nodes)}"),
        ("their taints seen, after the injection (p50 / max)",
         f"{pct(taints, 50):.2f} / {max(taints):.2f} s" if taints else "none"),
        ("devices tainted (elsewhere)", f"{r.tainted_devices} ({len(r.elsewhere)})"),
        ("second wave: bound / Pending (of)",
         f"{r.second_bound} / {r.pending} ({r.second_wave}) in {r.second_bound_s:.1f} s"),
        ("second-wave pods on a faulted copy", str(r.on_faulted)),
        ("first wave: pods moved or lost / claims lost",
         f"{r.first_moved_or_lost} / {r.claims_lost}"),
        ("devices given twice", str(r.given_twice)),
    ]  # fmt: skip
    for row in rows:
        t.add_row(*row)
    return t


def plot(r: Result, out: Path) -> None:
    """Devices tainted and second-wave pods bound, cumulative, by seconds from the fault."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    per = r.gpus // max(r.copies, 1)
    taints = sorted(r.taint_s.values())
    bound = r.timeline.get("second wave bound", [])
    end = max([*taints, *bound, 1.0])  # each line drawn on to the end
    counts = [per * i for i in range(len(taints) + 1)]
    ax.step([0, *taints, end], [*counts, counts[-1]], where="post", linewidth=2,
            label="devices tainted (all of a faulted copy's)")  # fmt: skip
    ax.step([0, *bound, end], [*range(len(bound) + 1), len(bound)], where="post",
            label="second-wave pods bound")  # fmt: skip
    ax.axvline(0, color="red", linestyle=":", label="faults injected")
    for t in r.timeline.get("second wave created", []):
        ax.axvline(t, color="gray", linestyle="--", label="second wave created")
    ax.set(xlabel="seconds from the injection", ylabel="count",
           title=f"{len(r.xid_nodes) + len(r.lost_nodes)} of {r.live} live copies failing "
                 f"({r.copies} copies)")  # fmt: skip
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=100, help="KWOK copies (default %(default)s)")
    ap.add_argument("--live", type=int, default=100,
                    help="of them live, a DRA driver each: at most about 100, the "
                    "model node's kubelet runs 110 pods (default %(default)s)")  # fmt: skip
    ap.add_argument("--share", type=float, default=0.05,
                    help="of the live copies failing, at least two (default "
                    "%(default)s)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("build/bench-faults.json"))
    args = ap.parse_args(argv)
    if args.copies < 2 or not 2 <= args.live <= args.copies:
        ap.error(f"--copies {args.copies} --live {args.live}: 2 or more live, at most the copies")
    if not 0 < args.share <= 1:
        ap.error(f"--share {args.share}: more than 0, at most 1")
    console = Console() if Console().is_terminal else Console(width=120)
    r = run(Lab(LAB).up(), args.copies, args.live, args.share, console)
    console.print(table(r))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "time": time.time(), "lab": LAB}
    args.out.write_text(json.dumps({"meta": meta, "result": asdict(r)}, indent=2))
    png = args.out.with_suffix(".png")
    plot(r, png)
    console.print(f"wrote {args.out} and {png}")
    if bad := checks(r):
        for line in bad:
            console.print(f"[red]{line}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
