"""What `gpulab experiment` does (its arguments are gpulab/cli.py's):

    gpulab experiment run e2e/experiments/xid-storm.yaml [--subject nvidia] [--out DIR]
    gpulab experiment validate e2e/experiments/*.yaml
    gpulab experiment report out/experiments/xid-storm-gpulab    # re-render from recording.json

`run` brings the experiment's lab up (re-using a running cluster), plays the scenario,
writes report.md + timeline.png and exits 1 when an expectation fails (2: a bad file,
3: the lab or an action could not run). Each returns the exit status; a bad experiment
file raises ExperimentError (one line).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from e2e import experiments as ex

OUT = Path("out/experiments")


def run(file: str, subject: str | None, out: Path | None, reset: bool, console: Console) -> int:
    """The experiment in `file` (a path or a shipped name) on its lab, with `subject`
    instead of the file's when given; its report in `out` (default: out/experiments/<name>
    and what serves the lab adds: `-<subject>` for a device plugin, nothing for NVIDIA's
    DRA driver)."""
    from clusters.labs.lab import Lab
    from clusters.labs.spec import SpecError
    from clusters.steps import StepError
    from clusters.subjects.subject import SubjectError
    from clusters.subjects.subject import load as load_subject
    from e2e import report
    from e2e.runner import Runner

    exp = ex.load(file)
    if subject:
        exp = exp.model_copy(update={"subject": subject})
    checked = ex.check_lab(exp, file)  # the spec the lab then runs: loaded once
    try:
        chosen = load_subject(exp.subject)
    except SubjectError as e:
        console.print(f"[red]gpulab: error:[/] {e}")
        return 2
    try:
        lab = Lab(checked, subject=chosen, console=console)
        out = out or OUT / f"{exp.name}{lab.serving.report_suffix}"
        lab.up()
        rec = Runner(exp, lab, console, reset_after=reset).run()
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


def validate(files: list[str], console: Console) -> int:
    for f in files:
        exp = ex.load(f)
        ex.check_lab(exp, f)
        console.print(
            f"[green]✓[/] {f}: {exp.name}, {len(exp.timeline)} actions, "
            f"{len(exp.expect)} expectations on lab {exp.lab}"
        )
    return 0


def rerender(out: Path, console: Console) -> int:
    """report.md and timeline.png again, from the recording.json in `out`."""
    from e2e import report
    from e2e.recording import Recording

    src = out / "recording.json"
    if not src.is_file():
        console.print(f"[red]gpulab: error:[/] no recording.json in {out}")
        return 2
    return _verdict(console, report.write(Recording.load(src), out), out)
