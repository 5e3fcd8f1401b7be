"""`gpulab`: the lab's command line.

    gpulab experiment run e2e/experiments/xid-storm.yaml [--subject nvidia] [--out DIR]
    gpulab experiment validate e2e/experiments/*.yaml
    gpulab experiment report out/experiments/xid-storm-gpulab    # re-render from recording.json
    gpulab infra [GROUP...] [--list]     # what labs need, built (python -m clusters.infra)
    gpulab infra export DIR | import DIR | key   # the same, as a directory a CI cache keeps

`run` brings the experiment's lab up (re-using a running cluster), plays the scenario,
writes report.md + timeline.png and exits 1 when an expectation fails (2: a bad file,
3: the lab or an action could not run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from e2e import experiments as ex

OUT = Path("out/experiments")


def _run(args: argparse.Namespace, console: Console) -> int:
    from clusters.lab import Lab
    from clusters.spec import SpecError
    from clusters.steps import StepError
    from clusters.subject import SubjectError
    from clusters.subject import load as load_subject
    from e2e import report
    from e2e.runner import Runner

    exp = ex.load(args.file)
    if args.subject:
        exp = exp.model_copy(update={"subject": args.subject})
    ex.check_lab(exp, args.file)
    try:
        subject = load_subject(exp.subject)
    except SubjectError as e:
        console.print(f"[red]gpulab: error:[/] {e}")
        return 2
    try:
        lab = Lab(exp.lab, subject=subject, console=console)
        out = args.out or OUT / f"{exp.name}{lab.serving.report_suffix}"
        lab.up()
        rec = Runner(exp, lab, console, reset_after=not args.no_reset).run()
    except (SpecError, StepError) as e:
        console.print(f"[red]gpulab: error:[/] {e}")
        return 3
    outcomes = report.write(rec, out)
    return _verdict(console, outcomes, out)


def _verdict(console: Console, outcomes: list, out: Path) -> int:  # type: ignore[type-arg]
    for o in outcomes:
        mark = "[green]✓[/]" if o.passed else "[red]✗[/]"
        console.print(f"{mark} {o.text} [dim](observed: {o.observed})[/]")
    ok = all(o.passed for o in outcomes)
    passed = sum(o.passed for o in outcomes)
    console.print(
        f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] "
        f"({passed}/{len(outcomes)} expectations) · report: {out / 'report.md'}"
    )
    return 0 if ok else 1


def _validate(args: argparse.Namespace, console: Console) -> int:
    for f in args.files:
        exp = ex.load(f)
        ex.check_lab(exp, f)
        console.print(
            f"[green]✓[/] {f}: {exp.name}, {len(exp.timeline)} actions, "
            f"{len(exp.expect)} expectations on lab {exp.lab}"
        )
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    from e2e import report
    from e2e.recording import Recording

    src = args.dir / "recording.json"
    if not src.is_file():
        console.print(f"[red]gpulab: error:[/] no recording.json in {args.dir}")
        return 2
    return _verdict(console, report.write(Recording.load(src), args.dir), args.dir)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["infra"]:  # its own parser: `gpulab infra --help` is clusters.infra's
        from clusters import infra

        return infra.main(args_in[1:], prog="gpulab infra")
    ap = argparse.ArgumentParser(prog="gpulab", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="group", required=True)
    sub.add_parser("infra", help="build what labs need: engine, kind, node image, images")
    exp = sub.add_parser("experiment", help="fault-injection experiments on a lab")
    cmds = exp.add_subparsers(dest="cmd", required=True)
    run = cmds.add_parser("run", help="run an experiment and write its report")
    run.add_argument("file", help="e2e/experiments/<name>.yaml, or a shipped name")
    run.add_argument("--subject", help="override the file's subject (a name or a subject file)")
    run.add_argument(
        "--out",
        type=Path,
        help=f"report directory (default {OUT}/<name>-<subject>, on a DRA lab {OUT}/<name>)",
    )
    run.add_argument(
        "--no-reset",
        action="store_true",
        help="leave faults and pods in place afterwards, to look at them",
    )
    val = cmds.add_parser("validate", help="check experiment files against the schema and lab")
    val.add_argument("files", nargs="+")
    rep = cmds.add_parser("report", help="re-render a report directory from recording.json")
    rep.add_argument("dir", type=Path)
    args = ap.parse_args(args_in)
    console = Console(stderr=True, soft_wrap=True)
    handler = {"run": _run, "validate": _validate, "report": _report}[args.cmd]
    try:
        return handler(args, console)
    except ex.ExperimentError as e:
        console.print(f"[red]gpulab: error:[/] {e}", highlight=False)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
