"""An experiment's report directory, from its Recording:

report.md       verdict, expectations, per-layer latencies, faults, pods, MIG devices
                made and destroyed per claim, actions
timeline.png    one time axis: faults and plugin updates per node, allocatable per
                node as step lines, pod phases as bars
faults.csv      every injected fault with its layers (bursts are one row in report.md)
recording.json  the raw observations (`gpulab experiment report DIR` re-renders)
"""

from __future__ import annotations

import csv
from itertools import groupby
from pathlib import Path

from e2e.recording import (
    FAULT_NAMES,
    Disruption,
    MigLife,
    Outcome,
    Recording,
    Trace,
    disruptions,
    evaluate,
    layer_stats,
    mig_lives,
    traces,
)
from fakenvml import faults
from fakenvml.journal import Kind

PHASE_COLORS = {
    "Unschedulable": "#f0ad4e",
    "Pending": "#f7df8c",
    "Running": "#5cb85c",
    "Succeeded": "#5bc0de",
    "Failed": "#d9534f",
    "Terminating": "#bbbbbb",
}
# Marker and color per record kind (fakenvml/faults.py's `shows`); a kind not here yet
# gets OTHER_STYLE, so a new fault needs no edit here to be drawn.
FAULT_STYLE = {
    Kind.XID.spelling: ("x", "#c9302c"),
    Kind.ECC_DOUBLE.spelling: ("D", "#8e44ad"),
    Kind.ECC_SINGLE.spelling: ("d", "#c39bd3"),
    Kind.LOST.spelling: ("X", "#222222"),
    Kind.FALLEN_OFF_BUS.spelling: ("X", "#555555"),
    Kind.RECOVER.spelling: ("P", "#2e8b57"),
}
OTHER_STYLE = ("*", "#d35400")
NODE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def write(rec: Recording, out: Path) -> list[Outcome]:
    """Write the report files; returns the expectations' outcomes."""
    out.mkdir(parents=True, exist_ok=True)
    rec.save(out / "recording.json")
    outcomes = evaluate(rec)
    trs = traces(rec)
    _csv(trs, out / "faults.csv")
    timeline_png(rec, trs, outcomes, out / "timeline.png")
    (out / "report.md").write_text(markdown(rec, trs, outcomes))
    return outcomes


# -- formatting


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1000:.0f} ms" if abs(s) < 1 else f"{s:.2f} s"


def _t(s: float | None) -> str:
    return "—" if s is None else f"{s:.3f}"


# A cell the plugin's log would fill, where its subject file states no such line (`logs:`).
NOT_STATED = "not stated"


def _said(rec: Recording, event: str, cell: str) -> str:
    """`cell`, or NOT_STATED where the subject states no log line of `event` (a DRA
    driver's report reads its Xid line only, and says nothing of the others)."""
    return cell if rec.by_taints or rec.stated(event) else NOT_STATED


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _served(rec: Recording) -> str:
    """What served the GPUs: `gpulab plugin`, or a driver's own name (NVIDIA's DRA driver)."""
    return rec.plugin if rec.by_taints else f"{rec.plugin} plugin"


def _short(node: str, rec: Recording) -> str:
    """hetero-worker2 -> worker2: the lab name is in the title already."""
    lab = rec.experiment.get("lab", "")
    return node.removeprefix(f"{lab}-") if lab else node


# -- markdown


def markdown(rec: Recording, trs: list[Trace], outcomes: list[Outcome]) -> str:
    exp = rec.spec
    passed = sum(o.passed for o in outcomes)
    ok = passed == len(outcomes)
    verdict = f"{'✅ PASS' if ok else '❌ FAIL'} ({passed}/{len(outcomes)} expectations)"
    inv = ", ".join(f"{n} {i['gpus']}x {i['product']}" for n, i in rec.nodes.items())
    interval = exp.sample_interval * 1000
    parts = [
        f"# {exp.name} · {_served(rec)} · {verdict}",
        "",
        *([f"> {' '.join(exp.description.split())}", ""] if exp.description else []),
        f"Lab **{exp.lab}** ({inv}) · t=0 at {rec.started} · {rec.end:.1f} s, "
        f"{len(rec.samples)} API samples every {interval:.0f} ms"
        + (f" ({rec.sample_errors} failed)" if rec.sample_errors else ""),
        "",
        "![timeline](timeline.png)",
        "",
        "## Expectations",
        "",
        _table(
            ["", "expectation", "observed"],
            [["✅" if o.passed else "❌", o.text, o.observed] for o in outcomes],
        ),
        "",
        "## Latency per layer",
        "",
        (
            "From the fault's journal record to the driver's Xid log line and to the "
            "device's taint in its ResourceSlice, over the faults that reached each layer "
            if rec.by_taints
            else "From the fault's journal record to the plugin's ListAndWatch update (its "
            "log line) to the node's allocatable in the API server, over the faults that "
            "reached each layer "
        )
        + (
            "(API times are when the first slice list that showed the change arrived: "
            f"late by up to a {interval:.0f} ms interval and the list's own time, never early)."
            if rec.by_taints
            else f"(API times are the first sample that showed the change: ±{interval:.0f} ms)."
        ),
        "",
        _stats(trs, rec.by_taints),
        "",
        "## Faults",
        "",
        _faults(rec, trs),
        "",
        "## Driver and API activity per node"
        if rec.by_taints
        else "## Plugin and API activity per node",
        "",
        _activity(rec, trs),
    ]
    if ds := disruptions(rec):
        parts += [
            "",
            "## Node disruptions",
            "",
            f"The node's {'count of tainted devices' if rec.by_taints else 'allocatable'} in the "
            "API after the action: its first change, its lowest value and where it settled "
            "(its last change in the run).",
            "",
            _disruptions(rec, ds),
        ]
    if rec.pods or any(s.pods for s in rec.samples):
        parts += ["", "## Pods", "", _pods(rec)]
    if lives := mig_lives(rec):
        parts += [
            "",
            "## MIG devices per claim",
            "",
            "Each MIG device a claim was given, in the node's fake state: made after the pod "
            "was created (where the driver makes them when it prepares the claim: DynamicMIG) "
            "and gone after its deletion was asked for. Times are the node's journal records "
            "of the change (the library's clock, when the driver's NVML call made it).",
            "",
            _mig(rec, lives),
        ]
    parts += ["", "## Actions", "", _actions(rec), "", _method(rec), ""]
    return "\n".join(parts)


def _stats(trs: list[Trace], by_taints: bool = False) -> str:
    rows = []
    for name, st in layer_stats(trs, by_taints).items():
        if st is None:
            rows.append([name, "0", "—", "—", "—"])
        else:
            n, lo, med, hi = st
            rows.append([name, str(n), f"{lo:.0f} ms", f"{med:.0f} ms", f"{hi:.0f} ms"])
    return _table(["layer", "faults", "min", "median", "max"], rows)


def _api_cell(tr: Trace) -> str:
    if tr.api is None:
        return "—"
    a, b = tr.api_value or (0, 0)
    taint = f" `{tr.taint}`" if tr.taint else ""
    return f"{_t(tr.api)} ({a}→{b}){taint}"


def _faults(rec: Recording, trs: list[Trace]) -> str:
    if rec.by_taints:
        return _taint_faults(rec, trs)
    rows = []
    for _, grp in groupby(trs, key=lambda t: (t.fault.action, t.fault.node, t.fault.gpu)):
        g = list(grp)
        f = g[0].fault
        if len(g) == 1:
            tr = g[0]
            rows.append(
                [
                    _t(f.t),
                    str(f.seq),
                    _short(f.node, rec),
                    str(f.gpu),
                    f.label(),
                    _said(rec, "xid", _t(tr.seen)),
                    _said(rec, "update", _t(tr.update)),
                    _api_cell(tr),
                    _dur(tr.to_plugin),
                    _dur(tr.to_api),
                    _dur(tr.total),
                ]
            )
            continue
        # A burst: one row; the first fault that got an update carries the latencies.
        first = next((t for t in g if t.update is not None), g[0])
        seen = sum(t.seen is not None for t in g)
        updates = sum(t.update is not None for t in g)
        label = f"{len(g)}x {f.label()} in {_dur(g[-1].fault.t - f.t)}"
        rows.append(
            [
                f"{_t(f.t)}-{_t(g[-1].fault.t)}",
                f"{f.seq}-{g[-1].fault.seq}",
                _short(f.node, rec),
                str(f.gpu),
                label,
                _said(rec, "xid", f"{seen} lines"),
                _said(
                    rec,
                    "update",
                    f"{updates} update{'s' if updates != 1 else ''}"
                    + (f" (first {_t(first.update)})" if first.update is not None else ""),
                ),
                _api_cell(first),
                _dur(first.to_plugin),
                _dur(first.to_api),
                _dur(first.total),
            ]
        )
    head = [
        "t (s)",
        "seq (node journal)",
        "node",
        "GPU",
        "fault",
        "plugin saw",
        "plugin update",
        "API allocatable",
        "inject→plugin",
        "plugin→API",
        "total",
    ]
    note = (
        "\n\nEvery fault, one per row: faults.csv."
        if any(len(list(g)) > 1 for _, g in groupby(trs, key=lambda t: t.fault.action))
        else ""
    )
    return (_table(head, rows) if rows else "No faults injected.") + note


def _taint_faults(rec: Recording, trs: list[Trace]) -> str:
    """A DRA lab's faults: the driver's Xid line and the device's taint, a burst one row."""
    rows = []
    for _, grp in groupby(trs, key=lambda t: (t.fault.action, t.fault.node, t.fault.gpu)):
        g = list(grp)
        f, last = g[0].fault, g[-1].fault
        first = next((t for t in g if t.api is not None), g[0])
        seen = [t.seen for t in g if t.seen is not None]
        label = f"{len(g)}x {f.label()} in {_dur(last.t - f.t)}" if len(g) > 1 else f.label()
        rows.append([
            _t(f.t) if len(g) == 1 else f"{_t(f.t)}-{_t(last.t)}",
            str(f.seq) if len(g) == 1 else f"{f.seq}-{last.seq}",
            _short(f.node, rec), str(f.gpu), label,
            _t(seen[0]) if len(seen) == 1 and len(g) == 1 else f"{len(seen)} lines",
            _api_cell(first), _dur(first.total),
        ])  # fmt: skip
    head = ["t (s)", "seq (node journal)", "node", "GPU", "fault", "driver saw",
            "device taint in API (tainted devices on the node)", "total"]  # fmt: skip
    return _table(head, rows) if rows else "No faults injected."


def _activity(rec: Recording, trs: list[Trace]) -> str:
    if rec.by_taints:
        rows = [
            [_short(node, rec), str(sum(t.fault.node == node for t in trs)),
             str(sum(x.event == "xid" and x.node == node and 0 <= x.t <= rec.end
                     for x in rec.log)),
             f"{len(ser) - 1} ({' → '.join(str(v) for _, v in ser)})" if (ser := rec.series(node))
             else "—"]
            for node in rec.nodes
        ]  # fmt: skip
        return _table(["node", "faults", "driver Xid lines", "tainted devices changes"], rows)
    rows = []
    for node in rec.nodes:
        mine = [x for x in rec.log if x.node == node and 0 <= x.t <= rec.end]
        series = rec.series(node)
        rows.append(
            [
                _short(node, rec),
                str(sum(t.fault.node == node for t in trs)),
                *(
                    _said(rec, e, str(sum(x.event == e for x in mine)))
                    for e in ("xid", "update", "registered")
                ),
                f"{len(series) - 1} ({' → '.join(str(v) for _, v in series)})" if series else "—",
                str(rec.node_writes(node)),
            ]
        )
    head = [
        "node",
        "faults",
        "plugin Xid lines",
        "plugin updates (ListAndWatch)",
        "registrations",
        "allocatable changes",
        "Node object writes",
    ]
    return _table(head, rows) + (
        "\n\nNode object writes count every change of the Node's resourceVersion the sampler "
        "saw (kubelet status heartbeats included): a plugin that floods kubelet with updates "
        "shows here only if kubelet passes them on."
    )


def _disruptions(rec: Recording, ds: list[Disruption]) -> str:
    def at(x: tuple[float, int] | None) -> str:
        return "no change" if x is None else f"{x[1]} at {_t(x[0])}"

    rows = [
        [_t(d.action.start), d.action.text, _short(d.node, rec),
         "—" if d.before is None else str(d.before), at(d.changed),
         "—" if d.low is None else str(d.low), at(d.settled),
         _said(rec, "registered", _t(d.registered))]
        for d in ds
    ]  # fmt: skip
    head = ["t (s)", "action", "node", f"{rec.measure} before", "first change", "lowest",
            "settled", "plugin registered"]  # fmt: skip
    return _table(head, rows)


def _pods(rec: Recording) -> str:
    info = {p.name: p for p in rec.pods}
    rows = []
    for name in rec.pod_names():
        p = info.get(name)
        phases = " → ".join(
            f"{ph}{'@' + _short(n, rec) if n else ''} {t:.1f}s" for t, ph, n in rec.pod_phases(name)
        )
        by_node: dict[str, list[int]] = {}
        unknown = []
        for d in p.devices if p else []:
            if where := rec.gpu_of(d):
                by_node.setdefault(_short(where[0], rec), []).append(where[1])
            else:
                unknown.append(d)
        devices = [f"{n}: {', '.join(map(str, sorted(ix)))}" for n, ix in by_node.items()]
        devices += unknown
        final = (p.phase + (f": {p.reason}" if p.reason else "")) if p else "—"
        rows.append([name, _t(p.created) if p else "—", phases, final, ", ".join(devices)])
    return _table(
        ["pod", "created (s)", "phases (API samples)", "final", "GPUs (node: index)"], rows
    )


def _mig(rec: Recording, lives: list[MigLife]) -> str:
    def after(t: float | None, since: float | None) -> str:
        return "—" if t is None or since is None else f"{_t(t)} (+{_dur(t - since)})"

    rows = [[m.pod, f"`{m.device}` ({_short(m.node, rec)})", _t(m.created),
             after(m.made, m.created), after(m.running, m.created), _t(m.deleted),
             after(m.gone, m.deleted)] for m in lives]  # fmt: skip
    head = ["pod", "MIG device", "created (s)", "made", "Running", "deleted (s)", "gone"]
    return _table(head, rows)


def _actions(rec: Recording) -> str:
    rows = [
        [str(a.index), f"{a.at:g}", _t(a.start), _dur(a.end - a.start), a.text, a.error or ""]
        for a in rec.actions
    ]
    return _table(["#", "planned (s)", "started (s)", "took", "action", "error"], rows)


def _method(rec: Recording) -> str:
    if rec.by_taints:
        return (
            "<details><summary>How this was measured</summary>\n\n"
            "- All times are seconds since t=0 on the host's realtime clock, which the kind "
            "nodes share: faults by their fakenvml journal record, driver lines by "
            "containerd's log timestamp, API values by the middle of the sampler's node list "
            "request (the ResourceSlices are listed right after it).\n"
            "- *driver saw*: the driver's `Sending XID=N health event for device <uuid>` "
            "line (its chart's verbosity 4), matched in order per GPU. *device taint in "
            "API*: the first sample after the fault in which the GPU's device had a taint it "
            "did not have at the fault (a recovery: none left).\n"
            f"- {rec.plugin}; {len(rec.log)} driver lines matched a layer.\n"
            "</details>"
        )
    return (
        "<details><summary>How this was measured</summary>\n\n"
        "- All times are seconds since t=0 on the host's realtime clock, which the kind nodes "
        "share: faults by their fakenvml journal record, plugin lines by containerd's log "
        "timestamp (`kubectl logs --timestamps`), API values by the middle of the sampler's "
        "node list request.\n"
        "- *plugin saw*: the plugin's `XidCriticalError` line, matched in order per GPU. "
        "*plugin update*: its `device marked (un)healthy` line, which both plugins log once "
        "per ListAndWatch update; given to the earliest fault on that GPU within 5 s before "
        "it that has none yet. *API allocatable*: the first sample after the update where "
        "allocatable moved the expected way.\n"
        f"- Plugin: {rec.plugin}; {len(rec.log)} plugin lines matched a layer.\n"
        + (
            f"- Not stated in its subject file (`logs:`): {', '.join(rec.unstated_logs)}: "
            f"{NOT_STATED} where the report would read them.\n"
            if rec.unstated_logs
            else ""
        )
        + "</details>"
    )


def _csv(trs: list[Trace], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "seq",
                "t_s",
                "node",
                "gpu",
                "uuid",
                "fault",
                "plugin_saw_s",
                "plugin_update_s",
                "api_s",
                "inject_to_plugin_ms",
                "plugin_to_api_ms",
                "total_ms",
            ]
        )

        def ms(x: float | None) -> str:
            return "" if x is None else f"{x * 1000:.1f}"

        for tr in trs:
            f_ = tr.fault
            w.writerow(
                [
                    f_.seq,
                    f"{f_.t:.4f}",
                    f_.node,
                    f_.gpu,
                    f_.uuid,
                    f_.label(),
                    "" if tr.seen is None else f"{tr.seen:.4f}",
                    "" if tr.update is None else f"{tr.update:.4f}",
                    "" if tr.api is None else f"{tr.api:.4f}",
                    ms(tr.to_plugin),
                    ms(tr.to_api),
                    ms(tr.total),
                ]
            )


# -- the picture


def timeline_png(rec: Recording, trs: list[Trace], outcomes: list[Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    nodes = list(rec.nodes)
    pods = rec.pod_names()
    colors = {n: NODE_COLORS[i % len(NODE_COLORS)] for i, n in enumerate(nodes)}
    heights = [0.55 * len(nodes) + 0.6, 2.6, max(0.9, 0.32 * len(pods) + 0.5)]
    fig, (ax_ev, ax_al, ax_pod) = plt.subplots(
        3,
        1,
        sharex=True,
        figsize=(12, sum(heights) + 1.2),
        gridspec_kw={"height_ratios": heights},
        layout="constrained",
    )
    end = max(rec.end, rec.spec.duration)
    ok = all(o.passed for o in outcomes)
    fig.suptitle(
        f"{rec.spec.name} · {_served(rec)} · "
        f"{'PASS' if ok else 'FAIL'} ({sum(o.passed for o in outcomes)}/{len(outcomes)})",
        fontsize=13,
        fontweight="bold",
        color="#2e7d32" if ok else "#c62828",
    )

    # Actions as vertical lines through all three panels: faults red, disruptions gray.
    for a in rec.actions:
        fault = faults.BY_NAME.get(a.do)
        if fault and fault.heal:  # a fault (its heal is another)
            style = {"color": "#c9302c", "ls": ":", "lw": 0.9, "alpha": 0.6}
        elif fault:  # a heal
            style = {"color": "#2e8b57", "ls": ":", "lw": 0.9, "alpha": 0.6}
        elif a.do in ("restart_kubelet", "stop_plugin", "start_plugin", "restart_plugin"):
            style = {"color": "#555555", "ls": "--", "lw": 1.1, "alpha": 0.8}
        else:
            continue
        for ax in (ax_ev, ax_al, ax_pod):
            ax.axvline(a.start, zorder=0, **style)
        if a.do in ("restart_kubelet", "stop_plugin", "start_plugin", "restart_plugin"):
            ax_ev.annotate(
                a.text.replace(rec.experiment.get("lab", "") + "-", ""),
                (a.start, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -2),
                textcoords="offset points",
                va="top",
                fontsize=7.5,
                color="#333333",
            )

    # Panel 1: per node, faults (top), the plugin's Xid lines (middle), updates (bottom).
    y = {n: len(nodes) - 1 - i for i, n in enumerate(nodes)}
    for n in nodes:
        ax_ev.axhline(y[n], color="#eeeeee", lw=6, zorder=0)
    legend: list = []  # type: ignore[type-arg]

    def mark(pts: list[tuple[float, float]], label: str, **style: object) -> None:
        """Scatter the points; the legend names only what the picture shows."""
        if pts:
            ax_ev.scatter(*zip(*pts, strict=True), **style)  # type: ignore[arg-type]
            legend.append(ax_ev.scatter([], [], label=label, **style))  # type: ignore[arg-type]

    for kind in FAULT_NAMES:
        marker, color = FAULT_STYLE.get(kind, OTHER_STYLE)
        pts = [(tr.fault.t, y[tr.fault.node] + 0.22) for tr in trs if tr.fault.kind == kind]
        mark(pts, FAULT_NAMES[kind], marker=marker, color=color, s=36, linewidths=1.2, zorder=3)
    for _, grp in groupby(trs, key=lambda t: (t.fault.action, t.fault.node)):
        g = list(grp)
        if len(g) > 1:
            f = g[0].fault
            ax_ev.annotate(f"{len(g)}x {f.label()}", (g[-1].fault.t, y[f.node] + 0.22),
                           xytext=(6, 0), textcoords="offset points", va="center", fontsize=8,
                           color=FAULT_STYLE[f.kind][1])  # fmt: skip
    lines = [x for x in rec.log if x.node in y]
    mark([(x.t, y[x.node]) for x in lines if x.event == "xid"], "plugin saw Xid",
         marker="|", color="#999999", s=30, zorder=2)  # fmt: skip
    for healthy, marker, color in ((False, "v", "#e65100"), (True, "^", "#2e8b57")):
        pts = [(x.t, y[x.node] - 0.22) for x in lines
               if x.event == "update" and x.healthy is healthy]  # fmt: skip
        mark(pts, f"update: {'healthy' if healthy else 'unhealthy'}", marker=marker,
             color=color, s=46, edgecolors="black", linewidths=0.5, zorder=4)  # fmt: skip
    # A plugin that resends for every event draws a solid band: say how many it sent.
    for node in nodes:
        ts = [x.t for x in lines if x.node == node and x.event == "update"]
        start = 0
        for k in range(1, len(ts) + 1):
            if k == len(ts) or ts[k] - ts[k - 1] > 1.0:
                if k - start > 3:
                    ax_ev.annotate(f"{k - start} updates", (ts[k - 1], y[node] - 0.22),
                                   xytext=(8, 0), textcoords="offset points", va="center",
                                   fontsize=8, color="#e65100")  # fmt: skip
                start = k
    mark([(x.t, y[x.node] - 0.22) for x in lines if x.event == "registered"],
         "registered with kubelet", marker="o", facecolors="none", edgecolors="#1565c0",
         s=46, linewidths=1.2, zorder=4)  # fmt: skip
    ax_ev.set_yticks([y[n] for n in nodes], [_short(n, rec) for n in nodes])
    ax_ev.set_ylim(-0.6, len(nodes) - 0.4)
    ax_ev.set_title(
        "faults (top) · plugin Xid lines (middle) · plugin ListAndWatch updates (bottom)",
        fontsize=9,
        loc="left",
    )
    if legend:
        ax_ev.legend(handles=legend, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                     frameon=False)  # fmt: skip

    # Panel 2: allocatable per node as step lines, capacity dashed.
    top = 1
    for n in nodes:
        al, cap = rec.series(n), rec.series(n, "tainted" if rec.by_taints else "capacity")
        if not al:
            continue
        xs, ys = [t for t, _ in al] + [rec.end], [v for _, v in al] + [al[-1][1]]
        ax_al.step(xs, ys, where="post", color=colors[n], lw=2, label=f"{_short(n, rec)}")
        cx, cy = [t for t, _ in cap] + [rec.end], [v for _, v in cap] + [cap[-1][1]]
        ax_al.step(cx, cy, where="post", color=colors[n], lw=1, ls="--", alpha=0.6)
        ax_al.annotate(
            f"{al[-1][1]}/{cap[-1][1]}",
            (rec.end, al[-1][1]),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=colors[n],
        )
        top = max(top, *cy, *ys)
    # MIG devices per node in the fake's state (experiments that use MIG), dotted.
    with_mig = any(s.mig for s in rec.samples)
    for n in nodes if with_mig else ():
        if mig := rec.series(n, "mig_devices"):
            xs, ys = [t for t, _ in mig] + [rec.end], [v for _, v in mig] + [mig[-1][1]]
            ax_al.step(xs, ys, where="post", color=colors[n], lw=1.6, ls=":",
                       label=f"{_short(n, rec)} MIG devices")  # fmt: skip
            top = max(top, *ys)
    for tr in trs:
        if tr.api is not None and tr.api_value is not None:
            ax_al.annotate(
                f"+{_dur(tr.total)}",
                (tr.api, tr.api_value[1]),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color=colors[tr.fault.node],
            )
    ax_al.set_ylim(-0.4, top + 0.8)
    ax_al.yaxis.get_major_locator().set_params(integer=True)
    ax_al.set_ylabel(("devices" if with_mig else "tainted devices") if rec.by_taints
                     else "nvidia.com/gpu")  # fmt: skip
    ax_al.set_title(
        ("tainted devices per node in the ResourceSlices · +latency from the fault"
         if rec.by_taints
         else "allocatable per node in the API (solid) · capacity (dashed) · "
         "+latency from the fault")
        + (" · MIG devices in the fake's state (dotted)" if with_mig else ""),
        fontsize=9,
        loc="left",
    )  # fmt: skip
    ax_al.grid(axis="y", color="#eeeeee")
    ax_al.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)

    # Panel 3: pod phases as bars, the node each landed on written on its Running bar.
    for i, name in enumerate(pods):
        row = len(pods) - 1 - i
        phases = rec.pod_phases(name)
        for (t, ph, node), nxt in zip(phases, [*phases[1:], None], strict=True):
            t_end = nxt[0] if nxt else rec.end
            if ph == "Absent":
                continue
            key = "Unschedulable" if ph == "Pending" and not node else ph
            ax_pod.broken_barh(
                [(t, t_end - t)], (row - 0.35, 0.7), color=PHASE_COLORS.get(key, "#dddddd")
            )
            if ph == "Running" and node:
                ax_pod.text(t + 0.1, row, _short(node, rec), va="center", fontsize=7)
    ax_pod.set_yticks(range(len(pods)), list(reversed(pods)), fontsize=8)
    ax_pod.set_ylim(-0.6, max(len(pods), 1) - 0.4)
    ax_pod.set_title("pod phases in the API", fontsize=9, loc="left")
    ax_pod.legend(
        handles=[
            Patch(
                color=c,
                label="Pending (unscheduled)"
                if k == "Unschedulable"
                else "Pending (on a node)"
                if k == "Pending"
                else k,
            )
            for k, c in PHASE_COLORS.items()
        ],
        fontsize=7.5,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    if not pods:
        ax_pod.text(0.5, 0.5, "no pods", transform=ax_pod.transAxes, ha="center", color="#999")

    ax_pod.set_xlim(-0.2, end * 1.05)  # room for the final values written at the right
    ax_pod.set_xlabel("seconds since t=0")
    fig.savefig(path, dpi=110)
    plt.close(fig)
