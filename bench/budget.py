"""`make test`'s time budget: every tier timed, one table at the end, JSON and markdown beside it.

    python -m bench.budget time TIER [--junit PATH] -- CMD...
        Runs CMD (its output streams as usual), records TIER's wall seconds, exit code and
        JUnit path in $GPULAB_BUDGET_DIR/TIER.json (build/budget/ by default) and exits with
        CMD's exit code.
    python -m bench.budget report [--reset] [--out PATH]
        Prints each tier's time and tests against its budget, the total against the total
        budget and the ten slowest tests; writes build/budget.json and build/budget.md (a
        CI step summary). --reset forgets the recorded tiers afterwards. Always exits 0.
    python -m bench.budget reset
        Forgets the recorded tiers (`make test` starts with it, so a tier that did not run
        this time shows "not run", never an older figure).

Why budgets live here and not in timed tests: a test that fails when it is slow fails on a
loaded machine, a cold cache or a slower runner, for reasons the change under test did not
cause, and a red build that nobody can fix by fixing code teaches people to re-run it.
Time belongs to the run (machine, cache, load), so, like `make bench`'s aims, a budget is
measured and printed beside the figure; a tier over budget is a yellow warning in the table
and the build fails only when a test does. The budgets are in one table, BUDGETS, below.

`time` and `reset` use only the standard library: `make infra`, the first tier, is what
creates the venv. `report` prints with rich, or the markdown table where rich is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Seconds each tier of a warm `make test` may take (a machine that has run it before), in
# the order `make test` runs them.
BUDGETS: dict[str, int] = {
    "infra": 60,  # warm, every step is a cache hit: nothing is built or pulled
    "lint": 60,  # ruff, actionlint and shellcheck over the tree; no network when warm
    "unit": 420,  # tests/: the node tier (stand-in kubelet, plugin containers) dominates
    "asan": 90,  # the ASan+UBSan build of fakenvml and tests/fakenvml under it
    "fuzz": 45,  # 30 s of libFuzzer (FUZZ_SECONDS=30) plus its build
    # the cluster tier on the newest Kubernetes: every lab, every subject, and NVIDIA's DRA
    # driver's own suite (about 2 min 10 s); the lane below, beside it, costs it ~45 s
    "e2e": 1110,
    # The lane beside the e2e tier, one after another: the GPU Operator's, Kueue's (on the
    # operator's lab: ~1.5-3.5 min, most of it its image's load and start) and the MIG
    # manager's suites (-m platform; the operator's first test alone ~250-300 s, most of it
    # its own reconcile loops), then the skew pass (CI_KUBELET's kubelet on the workers)
    # smoke set, gpulab and nvidia, -m smoke.
    "e2e-platform": 810,
    "e2e-skew": 210,
    # then, in that lane: action.yml run step by step (ci/run-action.py), the tiny
    # plugin's smoke set, on the seed lab the skew pass kept
    "action": 180,
}
TOTAL_BUDGET = 30 * 60  # the whole warm run: what a reviewer waits for
COLD_GOAL = 50 * 60  # a new machine, where `make infra` builds the node and lab images first
SLOWEST = 10
COLUMNS = ("tier", "time", "tests (pass/fail/skip)", "budget", "within?", "cpu", "notes")
NUMERIC = COLUMNS[1:4]
CPU_SAMPLE_S = 5.0  # the machine's CPU, sampled while a tier runs (its record's "cpu")


def budget_dir() -> Path:
    return Path(os.environ.get("GPULAB_BUDGET_DIR") or "build/budget")


def clock(seconds: float) -> str:
    """m:ss, minutes unbounded (75 min is 75:00)."""
    m, s = divmod(round(seconds), 60)
    return f"{m}:{s:02d}"


def span(seconds: int) -> str:
    m, s = divmod(seconds, 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def over_by(seconds: float, budget: int) -> int:
    """Whole seconds over budget, 0 when within (a tier at 60.4 s of 60 is within)."""
    return max(0, round(seconds) - budget)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------- time


@contextlib.contextmanager
def forwarding_signals(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """SIGTERM and SIGHUP go on to the command; SIGINT from a terminal reaches it already
    (same process group), so here it is ignored and the record is still written."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
        signal.SIGHUP: signal.signal(signal.SIGHUP, forward),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---------------------------------------------------------------- the machine's CPU


def cpu_times(stat: Path = Path("/proc/stat")) -> tuple[float, float, float] | None:
    """(busy, steal, all) jiffies of every core since boot, from the first line of
    /proc/stat (user nice system idle iowait irq softirq steal ...); None where unreadable.
    Busy is what ran (iowait and idle did not; steal is the host's, not ours)."""
    try:
        fields = [float(x) for x in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq, steal, sum(fields)


def share(a: tuple[float, float, float] | None,
          b: tuple[float, float, float] | None) -> tuple[float, float] | None:  # fmt: skip
    """(busy, steal) as fractions of the machine between two cpu_times readings."""
    if a is None or b is None or b[2] <= a[2]:
        return None
    whole = b[2] - a[2]
    return round((b[0] - a[0]) / whole, 3), round((b[1] - a[1]) / whole, 3)


class CpuSampler:
    """The machine's busy and steal share every CPU_SAMPLE_S while a tier runs, in a
    thread: where a tier leaves the cores idle (a wait on a cluster) is where a tier
    beside it costs nothing, and steal says the host, not the change, was slow."""

    def __init__(self, every: float = CPU_SAMPLE_S) -> None:
        self.every, self.t0 = every, time.monotonic()
        self.first = self.last = cpu_times()
        self.samples: list[tuple[float, float, float]] = []  # (seconds in, busy, steal)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            now = cpu_times()
            got = share(self.last, now)
            if got is not None:
                self.samples.append((round(time.monotonic() - self.t0, 1), *got))
            self.last = now

    def result(self) -> dict[str, Any] | None:
        self.stop.set()
        self.thread.join()
        whole = share(self.first, cpu_times())
        if whole is None:
            return None
        return {"busy": whole[0], "steal": whole[1], "every_s": self.every,
                "samples": self.samples}  # fmt: skip


def run_timed(tier: str, junit: str | None, command: list[str], directory: Path) -> int:
    started = time.time()
    t0 = time.monotonic()
    signalled = 0
    cpu = CpuSampler()
    try:
        # close_fds=False: a wrapped `make` keeps its parent's jobserver descriptors.
        proc = subprocess.Popen(command, close_fds=False)
    except OSError as e:
        print(f"budget: tier {tier}: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        code = 126 if isinstance(e, PermissionError) else 127
    else:
        with forwarding_signals(proc):
            rc = proc.wait()
        signalled = max(0, -rc)
        code = 128 + signalled if signalled else rc  # killed by signal N: 128+N, as in a shell
    record = {
        "tier": tier,
        "seconds": round(time.monotonic() - t0, 3),
        "exit_code": code,
        "junit": str(Path(junit).resolve()) if junit else None,
        "command": command,
        "started": started,
        "cpu": cpu.result(),
    }
    write_atomically(directory / f"{tier}.json", json.dumps(record, indent=2) + "\n")
    if signalled:
        # Die of the command's signal, so that a shell running `make test` stops at Ctrl-C
        # instead of going on to the next tier (bash's "wait and cooperative exit").
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signalled, signal.SIG_DFL)
            os.kill(os.getpid(), signalled)
    return code


def reset(directory: Path) -> None:
    for tier in BUDGETS:
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{tier}.json").unlink()


# ---------------------------------------------------------------- report


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.errors += other.errors
        self.skipped += other.skipped

    def cell(self) -> str:
        text = f"{self.passed}/{self.failed}/{self.skipped}"
        return f"{text} +{self.errors} errors" if self.errors else text


@dataclass
class CaseTime:
    tier: str
    test: str
    seconds: float


@dataclass
class Row:
    tier: str
    budget: int
    seconds: float | None = None  # None: not run, or its record unreadable
    exit_code: int | None = None
    junit: str | None = None
    tests: Counts | None = None
    notes: list[str] = field(default_factory=list)
    started: float = 0.0  # the epoch second it began (0: not known)
    cpu: tuple[float, float] | None = None  # the machine's (busy, steal) while it ran

    @property
    def cpu_cell(self) -> str:
        if self.cpu is None:
            return "—"
        busy, steal = self.cpu
        return f"{busy:.0%}" + (f", steal {steal:.0%}" if steal >= 0.005 else "")

    @property
    def span(self) -> tuple[float, float] | None:
        """(start, end) on the clock, where both are known."""
        if self.seconds is None or self.started <= 0:
            return None
        return self.started, self.started + self.seconds

    @property
    def over_by(self) -> int:
        return 0 if self.seconds is None else over_by(self.seconds, self.budget)


@dataclass
class Report:
    rows: list[Row]
    slowest: list[CaseTime]

    @property
    def seconds(self) -> float:
        """The tiers' time on the clock: tiers that ran beside each other (`make test` runs
        asan and fuzz beside unit) count once; a tier whose start is unknown adds its own."""
        total = sum(r.seconds for r in self.rows if r.seconds is not None and r.span is None)
        end = float("-inf")
        for start, stop in sorted(r.span for r in self.rows if r.span is not None):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        return total

    @property
    def tests(self) -> Counts:
        total = Counts()
        for r in self.rows:
            if r.tests:
                total.add(r.tests)
        return total

    @property
    def failed_tiers(self) -> list[str]:
        return [r.tier for r in self.rows if r.exit_code not in (None, 0)]

    @property
    def not_run(self) -> list[str]:
        return [r.tier for r in self.rows if r.seconds is None]

    @property
    def total_notes(self) -> list[str]:
        notes = []
        if self.failed_tiers:
            notes.append("failed: " + ", ".join(self.failed_tiers))
        if self.not_run:
            notes.append("not counted: " + ", ".join(self.not_run))
        return notes


class BadInput(Exception):
    """A record or JUnit file the report cannot use; its message is one line."""


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"record unreadable: {shown(path)}: {one_line(e)}") from None
    if not isinstance(data, dict):
        raise BadInput(f"record unreadable: {shown(path)}: expected an object, found {data!r:.40}")
    expected = {"seconds": (int, float), "exit_code": int, "junit": (str, type(None))}
    for key, types in expected.items():
        if not isinstance(data.get(key), types) or isinstance(data.get(key), bool):
            raise BadInput(f"record unreadable: {shown(path)}: {key!r} is {data.get(key)!r:.40}")
    return data


def node_id(case: ET.Element) -> str:
    """pytest's node id from a <testcase>: xunit1 names the file; xunit2 only a classname."""
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if not file:
        return f"{classname}::{name}" if classname else name
    module = file.removesuffix(".py").replace("/", ".")
    inner = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
    return "::".join([file, *(inner.split(".") if inner else []), name])


def shown(path: Path) -> str:
    """The path as a reader would type it: relative to this directory where it is inside."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_junit(path: Path, tier: str, not_before: float | None) -> tuple[Counts, list[CaseTime]]:
    try:
        if not_before is not None and path.stat().st_mtime < not_before - 1:
            raise BadInput(f"JUnit older than this run, not counted: {shown(path)}")
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise BadInput(f"JUnit missing: {shown(path)}") from None
    except (OSError, ET.ParseError) as e:
        raise BadInput(f"JUnit unreadable: {shown(path)}: {one_line(e)}") from None
    counts, times = Counts(), []
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            counts.failed += 1
        elif "error" in kinds:
            counts.errors += 1
        elif "skipped" in kinds:
            counts.skipped += 1
        else:
            counts.passed += 1
        try:
            seconds = float(case.get("time", "0"))
        except ValueError:
            seconds = 0.0
        times.append(CaseTime(tier, node_id(case), seconds))
    return counts, times


def collect(directory: Path) -> Report:
    rows, times = [], []
    for tier, budget in BUDGETS.items():
        row = Row(tier, budget)
        rows.append(row)
        path = directory / f"{tier}.json"
        if not path.exists():
            row.notes.append("not run")
            continue
        try:
            record = read_record(path)
        except BadInput as e:
            row.notes.append(str(e))
            continue
        row.seconds = float(record["seconds"])
        started = record.get("started")
        row.started = float(started) if isinstance(started, (int, float)) else 0.0
        row.exit_code = record["exit_code"]
        row.junit = record["junit"]
        cpu = record.get("cpu")
        if isinstance(cpu, dict) and all(isinstance(cpu.get(k), (int, float))
                                          for k in ("busy", "steal")):  # fmt: skip
            row.cpu = float(cpu["busy"]), float(cpu["steal"])
        if row.exit_code:
            row.notes.append(f"failed (exit {row.exit_code})")
        if row.junit:
            try:
                row.tests, tier_times = read_junit(Path(row.junit), tier, row.started or None)
            except BadInput as e:
                row.notes.append(str(e))
            else:
                times += tier_times
    for row in rows:  # a tier that began while an earlier one ran: say so beside its time
        during = [o.tier for o in rows if o is not row and o.span and row.span
                  and o.span[0] < row.span[0] < o.span[1]]  # fmt: skip
        if during:
            row.notes.append("beside " + ", ".join(during))
    times.sort(key=lambda t: -t.seconds)  # stable: ties keep tier order, then file order
    return Report(rows, times[:SLOWEST])


def within(seconds: float | None, budget: int) -> str:
    if seconds is None:
        return "—"
    over = over_by(seconds, budget)
    return f"over by {span(over)}" if over else "✓"


def footnotes(cpus: int) -> list[str]:
    return [
        f"Budgets are for a warm run (bench/budget.py); the cold goal, a new machine "
        f"building everything first, is {clock(COLD_GOAL)}. Over budget warns, never fails.",
        f"tests: passed/failed/skipped, from each tier's JUnit XML; nproc {cpus}. cpu: the "
        f"machine's cores busy while the tier ran (tiers beside it included), and the "
        f"host's steal where there was some.",
    ]


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def to_json(report: Report, cpus: int) -> dict[str, Any]:
    tiers = []
    for r in report.rows:
        tiers.append(
            {
                "tier": r.tier,
                "seconds": r.seconds,
                "budget": r.budget,
                "over_by": r.over_by,
                "exit_code": r.exit_code,
                "junit": r.junit,
                "tests": asdict(r.tests) if r.tests else None,
                "cpu": dict(zip(("busy", "steal"), r.cpu, strict=True)) if r.cpu else None,
                "notes": r.notes,
            }
        )
    return {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": cpus,
        "budgets": dict(BUDGETS),
        "total_budget": TOTAL_BUDGET,
        "cold_goal": COLD_GOAL,
        "tiers": tiers,
        "totals": {
            "seconds": round(report.seconds, 3),
            "budget": TOTAL_BUDGET,
            "over_by": over_by(report.seconds, TOTAL_BUDGET),
            "tests": asdict(report.tests),
            "failed_tiers": report.failed_tiers,
            "not_run": report.not_run,
        },
        "slowest": [asdict(t) for t in report.slowest],
    }


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(report: Report, cpus: int) -> str:
    lines = [
        "## make test: time budget",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("--:" if name in NUMERIC else "---" for name in COLUMNS) + "|",
    ]
    for r in report.rows:
        time_cell = clock(r.seconds) if r.seconds is not None else "—"
        tests = r.tests.cell() if r.tests else "—"
        cells = [r.tier, time_cell, tests, clock(r.budget), within(r.seconds, r.budget), r.cpu_cell]
        lines.append("| " + " | ".join([*cells, md_cell("; ".join(r.notes))]) + " |")
    total = [
        "**total**",
        clock(report.seconds),
        report.tests.cell(),
        clock(TOTAL_BUDGET),
        within(report.seconds, TOTAL_BUDGET),
        "",
        md_cell("; ".join(report.total_notes)),
    ]
    lines += ["| " + " | ".join(total) + " |", ""]
    lines += [f"_{note}_" for note in footnotes(cpus)]
    lines += ["", f"### slowest {SLOWEST} tests", "", "| tier | test | seconds |", "|---|---|--:|"]
    lines += [f"| {t.tier} | {md_cell(t.test)} | {t.seconds:.1f} |" for t in report.slowest]
    return "\n".join(lines) + "\n"


def print_report(report: Report, cpus: int) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # `make infra` failed before the venv existed
        print(to_markdown(report, cpus))
        return
    console = Console() if sys.stdout.isatty() else Console(width=120)

    def within_text(seconds: float | None, budget: int) -> Text:
        text = within(seconds, budget)
        style = "yellow" if text.startswith("over") else "green" if text == "✓" else ""
        return Text(text, style=style)

    table = Table(title="make test: time budget", caption_justify="left")
    for name in COLUMNS:
        justify = "right" if name in NUMERIC else "left"
        table.add_column(name, justify=justify, no_wrap=name != "notes")
    for r in report.rows:
        table.add_row(
            r.tier,
            clock(r.seconds) if r.seconds is not None else "—",
            r.tests.cell() if r.tests else "—",
            clock(r.budget),
            within_text(r.seconds, r.budget),
            r.cpu_cell,
            Text("; ".join(r.notes), style="red" if r.exit_code else ""),
        )
    table.add_section()
    table.add_row(
        Text("total", style="bold"),
        clock(report.seconds),
        report.tests.cell(),
        clock(TOTAL_BUDGET),
        within_text(report.seconds, TOTAL_BUDGET),
        "",
        Text("; ".join(report.total_notes)),
    )
    console.print(table)
    for note in footnotes(cpus):
        console.print(note, style="dim")
    over = [f"{r.tier} (+{span(r.over_by)})" for r in report.rows if r.over_by]
    if over_by(report.seconds, TOTAL_BUDGET):
        over.append(f"total (+{span(over_by(report.seconds, TOTAL_BUDGET))})")
    if over:
        console.print(
            f"⚠ over budget: {', '.join(over)}. A warning: the build fails only when a test does.",
            style="bold yellow",
        )
    slow = Table(title=f"slowest {SLOWEST} tests")
    slow.add_column("tier")
    slow.add_column("test", overflow="fold")
    slow.add_column("seconds", justify="right")
    for t in report.slowest:
        slow.add_row(t.tier, Text(t.test), f"{t.seconds:.1f}")  # ids hold [params]
    console.print(slow)


def report_command(directory: Path, out: Path | None, forget: bool) -> int:
    out = out or directory.parent / "budget.json"
    report, cpus = collect(directory), nproc()
    print_report(report, cpus)
    write_atomically(out, json.dumps(to_json(report, cpus), indent=2) + "\n")
    write_atomically(out.with_suffix(".md"), to_markdown(report, cpus))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    if forget:
        reset(directory)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    timed = sub.add_parser("time", help="run a tier's command and record its time")
    timed.add_argument("tier", choices=list(BUDGETS), metavar="TIER", help=", ".join(BUDGETS))
    timed.add_argument("--junit", metavar="PATH", help="the JUnit XML the command writes")
    rep = sub.add_parser("report", help="print the tiers against their budgets")
    rep.add_argument("--reset", action="store_true", help="forget the recorded tiers after")
    rep.add_argument("--out", type=Path, help="JSON report (default: beside the budget dir)")
    sub.add_parser("reset", help="forget the recorded tiers")
    args = ap.parse_args(argv)
    if args.action == "time" and not command:
        ap.error("time: expected the tier's command after --, e.g. time unit -- make test-unit")
    if args.action != "time" and command:
        ap.error(f"{args.action}: takes no command")
    directory = budget_dir()
    if args.action == "time":
        return run_timed(args.tier, args.junit, command, directory)
    if args.action == "reset":
        reset(directory)
        return 0
    return report_command(directory, args.out, args.reset)


if __name__ == "__main__":
    sys.exit(main())
