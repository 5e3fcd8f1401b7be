"""The e2e run as one HTML file, for the people who read a run after it (CI artifacts):
the scenario x subject grid, each cell opening on what was expected and seen, every
failure's whole trace, and the timelines of the experiments the run played.

One file with no external references (styles inline, images as data: URLs, no
JavaScript): it opens the same from a CI artifact, a mail or a laptop offline. Written
next to the JUnit XML (`--junitxml build/e2e-junit.xml` -> build/e2e-junit.html), else to
out/e2e-report.html, by the gpulab_e2e plugin's terminal summary.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from e2e.verdict import Cell, kubernetes, scenario_name

DEFAULT = Path("out/e2e-report.html")

# Grid of (title, rows: scenario -> subject -> Cell, columns).
Section = tuple[str, dict[str, dict[str, Cell]], list[str]]


@dataclass
class Run:
    started: float  # epoch seconds
    seconds: float
    subjects: list[str]
    sections: list[Section]
    totals: dict[str, int] = field(default_factory=dict)  # outcome -> count, as pytest says
    timelines: list[Path] = field(default_factory=list)  # experiment timeline.png files


def path_for(xmlpath: str | None) -> Path:
    """<junit stem>.html beside the JUnit XML, or out/e2e-report.html without one."""
    if not xmlpath:
        return DEFAULT
    return Path(os.path.expandvars(os.path.expanduser(xmlpath))).with_suffix(".html")


def reports_root() -> Path:
    """Where the experiments write their report directories (test_experiment_run.py's
    $GPULAB_REPORTS, `gpulab experiment run`'s default)."""
    from e2e.play import OUT  # here: its imports would slow every pytest start

    return Path(os.environ.get("GPULAB_REPORTS", str(OUT)))


def timelines(root: Path, since: float) -> list[Path]:
    """The timeline.png files under `root` written since `since` (this run's: an older
    directory left from another run is not this run's result)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("timeline.png") if p.stat().st_mtime >= since)


TOTALS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")


def totals(stats: dict[str, list[Any]]) -> dict[str, int]:
    """pytest's closing counts from the terminal reporter's stats (the nonzero ones)."""
    return {k: len(stats[k]) for k in TOTALS if stats.get(k)}


def write(run: Run, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(run), encoding="utf-8")
    return path


def render(run: Run) -> str:
    failed = [
        (scenario, subject, c)
        for _, rows, columns in run.sections
        for scenario, results in rows.items()
        for subject in columns
        if (c := results.get(subject)) is not None and c.outcome != "PASS"
    ]
    anchors = {id(c): f"failure-{i}" for i, (_, _, c) in enumerate(failed, 1)}
    body = [_header(run)]
    for title, rows, columns in run.sections:
        body.append(f"<h2>{escape(title)}</h2>\n{_grid(rows, columns, anchors)}")
    if failed:
        body.append("<h2>Failures</h2>")
        body += [_failure(s, subject, c, anchors[id(c)]) for s, subject, c in failed]
    if run.timelines:
        body.append("<h2>Experiment timelines</h2>")
        body += [_timeline(p) for p in run.timelines]
    return PAGE.format(title="gpulab e2e report", style=STYLE, body="\n".join(body))


def _header(run: Run) -> str:
    when = datetime.fromtimestamp(run.started).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    versions = sorted({v for _, rows, _ in run.sections for v in kubernetes(rows)})
    columns = [c for _, _, cs in run.sections for c in cs if c not in run.subjects]
    items = [
        ("date", when),
        ("kubernetes", ", ".join(versions) or "-"),
        ("subjects", ", ".join(run.subjects + columns)),
        ("totals", ", ".join(f"{n} {k}" for k, n in run.totals.items()) or "-"),
        ("duration", _duration(run.seconds)),
    ]
    ok = not run.totals.get("failed") and not run.totals.get("error")
    verdict = f'<p class="{"pass" if ok else "fail"} verdict">{"PASS" if ok else "FAIL"}</p>'
    return f"<h1>gpulab e2e report</h1>\n{verdict}\n{_dl(items)}"


def _grid(rows: dict[str, dict[str, Cell]], columns: list[str], anchors: dict[int, str]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    out = [f"<table>\n<thead><tr><th>scenario</th>{head}</tr></thead>\n<tbody>"]
    for scenario, results in rows.items():
        tds = []
        for column in columns:
            c = results.get(column)
            if c is None:
                tds.append('<td class="none" title="not run for this subject">-</td>')
                continue
            tip = "\n".join(f"{k}: {v}" for k, v in _facts(c) if v)
            facts = _dl(_facts(c))
            if c.outcome != "PASS":
                facts += f'<a href="#{anchors[id(c)]}">the whole failure</a>'
            tds.append(
                f'<td class="{c.outcome.lower()}" title="{escape(tip)}"><details>'
                f"<summary>{c.outcome} {c.seconds:.1f}s</summary>{facts}</details></td>"
            )
        name = escape(scenario_name(scenario))
        out.append(f'<tr><th scope="row">{name}</th>{"".join(tds)}</tr>')
    return "\n".join([*out, "</tbody>\n</table>"])


def _facts(c: Cell) -> list[tuple[str, str]]:
    return [
        ("expected", "; ".join(c.expected)),
        ("seen", "; ".join(c.seen)),
        ("seconds", f"{c.seconds:.1f}"),
        ("kubernetes", c.kubernetes),
        ("failure", c.failure),
    ]


def _failure(scenario: str, subject: str, c: Cell, anchor: str) -> str:
    title = f"{scenario_name(scenario)} on {subject}"
    facts = [("test", c.nodeid), *_facts(c)[:-1]]
    return (
        f'<section class="failure" id="{anchor}"><h3>FAIL {escape(title)}</h3>\n{_dl(facts)}\n'
        f"<pre>{escape(c.trace or c.failure)}</pre></section>"
    )


def _timeline(png: Path) -> str:
    """The image inline, under the first line of the report.md beside it."""
    name = png.parent.name
    md = png.with_name("report.md")
    caption = name
    if md.is_file():
        lines = md.read_text(encoding="utf-8").splitlines()
        caption = lines[0].lstrip("# ").strip() if lines else name
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (
        f"<figure><figcaption>{escape(caption)}</figcaption>"
        f'<img alt="timeline of {escape(name)}" src="data:image/png;base64,{data}"></figure>'
    )


def _dl(items: list[tuple[str, str]]) -> str:
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items if v)
    return f"<dl>{rows}</dl>"


def _duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s} s" if minutes else f"{seconds:.1f} s"


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
</body>
</html>
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; vertical-align: top; text-align: left; }
thead th { background: #f4f4f4; position: sticky; top: 0; }
td.pass { background: #dff0d8; }
td.fail { background: #f2dede; }
td.none { color: #999; text-align: center; }
summary { cursor: pointer; white-space: nowrap; font-weight: 600; }
td.pass summary { color: #2b6e2b; }
td.fail summary { color: #a94442; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0 0.75em; margin: 0.3em 0; }
dt { color: #666; }
dd { margin: 0; }
pre { background: #f7f7f7; padding: 0.75em; overflow-x: auto; font-size: 0.85em; }
p.verdict { font-size: 1.3em; font-weight: 700; }
p.pass { color: #2b6e2b; }
p.fail { color: #a94442; }
section.failure { border-top: 1px solid #ddd; margin-top: 1em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-weight: 600; margin-bottom: 0.4em; }
"""
