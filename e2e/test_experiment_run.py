"""Cluster tier: experiments run for real: xid-storm on the `hetero` lab with our plugin,
dra-taints on `dra` and dynmig on `dra-dynmig` (NVIDIA's DRA driver).

Each one's expectations must all pass and its report (markdown + PNG) must exist; the
measured latencies land in the JUnit XML. Reports go to $GPULAB_REPORTS (default
out/experiments), which CI uploads. Labs are the session's (fixture `labs`), shared with
the suites that use them. The DRA labs' two are their labs' jobs (e2e/fixtures.py lab_job):
each plays its 40 s timeline as soon as its lab is up, beside the other labs' suites, and
its test reads the recording; the suites waited through both timelines before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from clusters.labs.lab import Lab
from clusters.subjects.subject import load as load_subject
from e2e import experiments, report
from e2e.fixtures import lab_fixture, lab_job
from e2e.recording import Outcome, Recording, layer_stats, mig_lives, traces
from e2e.runner import Runner
from e2e.verdict import Verdict

# Under the working directory (the checkout for `make e2e`), never beside installed code.
REPORTS = Path(os.environ.get("GPULAB_REPORTS", "out/experiments"))
# The labs of the experiments run here (each experiment file's `lab:`).
HETERO, DRA, DYNMIG = "hetero", "dra", "dra-dynmig"
Played = tuple[Recording, list[Outcome], Path]  # play()'s


def play(name: str, lab: Lab) -> Played:
    """Run a shipped experiment on `lab` and write its report (under REPORTS, named as
    `gpulab experiment run` names it); the recording, the outcomes and the directory."""
    exp = experiments.load(name)
    experiments.check_lab(exp)
    rec = Runner(exp, lab).run()
    out = REPORTS / f"{exp.name}{lab.serving.report_suffix}"
    return rec, report.write(rec, out), out


def all_held(outcomes: list[Outcome], out: Path) -> None:
    failed = [f"{o.text} (observed: {o.observed})" for o in outcomes if not o.passed]
    assert not failed, f"expectations failed, see {out / 'report.md'}: " + "; ".join(failed)


@lab_fixture(HETERO, scope="function")
def hetero(labs: Callable[..., Lab]) -> Lab:
    return labs(HETERO, load_subject("gpulab"))


def test_xid_storm_marks_the_gpu_once_and_reports_it(hetero: Lab, verdict: Verdict) -> None:
    verdict.expect("every expectation holds; 300 Xids seen")
    rec, outcomes, out = play("xid-storm", hetero)

    for name, st in layer_stats(traces(rec)).items():
        if st is not None:
            verdict.property(f"{name} median (ms)", round(st[2], 1))
    passed = sum(o.passed for o in outcomes)
    seen = sum(x.event == "xid" for x in rec.log)
    verdict.saw(f"{passed}/{len(outcomes)} expectations; {seen} Xids seen")
    all_held(outcomes, out)
    assert (out / "report.md").read_text().startswith("# xid-storm · gpulab plugin · ✅ PASS")
    assert (out / "timeline.png").stat().st_size > 20_000
    # 300 Xids were injected and the plugin saw every one of them.
    assert sum(f.kind == "xid" for f in rec.faults) == 300
    assert seen == 300


@lab_job(DRA)
def dra_taints_played(lab: Lab) -> Played:
    return play("dra-taints", lab)


def test_dra_taints_times_each_fault_to_its_device_taint(
    dra_taints_played: Played, verdict: Verdict
) -> None:
    """The experiments tool on a DRA lab: NVIDIA's DRA driver turns an Xid 79, an ignored
    Xid 13 and a lost GPU into device taints, the report times each, and the claim made
    after the Xid 79 gets every Hopper but the tainted one."""
    verdict.expect("every expectation holds; the 3-GPU claim avoids the tainted GPU")
    rec, outcomes, out = dra_taints_played

    assert rec.signal == "taints"  # what the driver's Serving said faults show as
    trs = traces(rec)
    for name, st in layer_stats(trs, by_taints=True).items():
        if st is not None:
            verdict.property(f"{name} median (ms)", round(st[2], 1))
    all_held(outcomes, out)
    md = (out / "report.md").read_text()
    assert md.startswith(f"# dra-taints · {rec.plugin} · ✅ PASS"), md.splitlines()[0]
    # Every fault reached the API as a taint on its own GPU's device (a recovery: when the
    # restart lifted it).
    assert [(t.fault.label(), t.api is not None) for t in trs] == [
        ("Xid 79", True), ("Xid 13", True), ("GPU lost", True),
        ("recover", True), ("recover", True), ("recover", True)]  # fmt: skip
    assert sum(x.event == "xid" for x in rec.log) == 2  # the driver logged both Xids
    hopper = next(p for p in rec.pods if p.name == "hopper")
    got = sorted(rec.gpu_of(u)[1] for u in hopper.devices)  # type: ignore[index]
    verdict.saw(f"{sum(o.passed for o in outcomes)}/{len(outcomes)} expectations; "
                f"hopper got GPUs {got}")  # fmt: skip
    assert got == [0, 2, 3]


@lab_job(DYNMIG)
def dynmig_played(lab: Lab) -> Played:
    return play("dynmig", lab)


def test_dra_dynmig_times_each_claims_mig_device_made_and_destroyed(
    dynmig_played: Played, verdict: Verdict
) -> None:
    """The experiments tool on the DynamicMIG lab: each claim's MIG device is made in the
    fake's state after its pod is created and gone after its deletion; a claim that does
    not fit waits, then gets the placement a deleted pod released, made again."""
    verdict.expect("every expectation holds; each MIG device timed from claim to made")
    rec, outcomes, out = dynmig_played
    all_held(outcomes, out)
    lives = {m.pod: m for m in mig_lives(rec)}
    assert sorted(lives) == ["four-a", "four-b", "four-c", "three"]
    # four-c got the placement four-a released: made again after four-a's was gone.
    assert lives["four-c"].device == lives["four-a"].device
    a, c = lives["four-a"], lives["four-c"]
    assert a.gone is not None and c.made is not None and a.gone <= c.made
    # ... while three still held its own on that GPU: the two lived side by side.
    assert lives["three"].deleted is not None and c.made < lives["three"].deleted
    assert lives["three"].gone is not None and lives["four-b"].gone is None
    # Each device went with its own claim only: the 3g.40gb beside four-a's stayed.
    three = lives["three"]
    assert three.made is not None and three.deleted is not None
    for s in rec.samples:
        if three.made <= s.t < three.deleted:
            assert three.device in s.mig.get(three.node, {}), f"gone at {s.t:.2f}s, held"
    for m in lives.values():
        assert m.made is not None and m.made >= m.created, m
    made = sorted(m.made - m.created for m in lives.values() if m.pod != "four-c")  # type: ignore[operator]
    gone = [m.gone - m.deleted for m in (a, lives["three"])]  # type: ignore[operator]
    verdict.property("claim to MIG made, median (s)", round(made[len(made) // 2], 2))
    verdict.property("delete to MIG gone, max (s)", round(max(gone), 2))
    md = (out / "report.md").read_text()
    assert md.startswith(f"# dynmig · {rec.plugin} · ✅ PASS"), md.splitlines()[0]
    assert md.count("-mig-4g40gb-") >= 3 and "## MIG devices per claim" in md
