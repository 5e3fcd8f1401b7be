"""Cluster tier: the xid-storm experiment, run for real on the `hetero` lab with our plugin.

Its expectations must all pass and its report (markdown + PNG) must exist; the per-layer
latencies land in the JUnit XML. Reports go to $GPULAB_REPORTS (default out/experiments),
which CI uploads. The lab is the session's (fixture `labs`), shared with test_hetero.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from clusters.lab import Lab
from clusters.subject import load as load_subject
from e2e import experiments, report
from e2e.recording import layer_stats, traces
from e2e.runner import Runner
from e2e.verdict import Verdict

# Under the working directory (the checkout for `make e2e`), never beside installed code.
REPORTS = Path(os.environ.get("GPULAB_REPORTS", "out/experiments"))


@pytest.fixture
def hetero(labs: Callable[..., Lab]) -> Lab:
    return labs("hetero", load_subject("gpulab"))


def test_xid_storm_marks_the_gpu_once_and_reports_it(hetero: Lab, verdict: Verdict) -> None:
    verdict.expect("every expectation holds; 300 Xids seen")
    exp = experiments.load("xid-storm")
    experiments.check_lab(exp)
    rec = Runner(exp, hetero).run()
    out = REPORTS / f"{exp.name}-{exp.subject}"
    outcomes = report.write(rec, out)

    for name, st in layer_stats(traces(rec)).items():
        if st is not None:
            verdict.property(f"{name} median (ms)", round(st[2], 1))
    passed = sum(o.passed for o in outcomes)
    seen = sum(x.event == "xid" for x in rec.log)
    verdict.saw(f"{passed}/{len(outcomes)} expectations; {seen} Xids seen")
    failed = [f"{o.text} (observed: {o.observed})" for o in outcomes if not o.passed]
    assert not failed, f"expectations failed, see {out / 'report.md'}: " + "; ".join(failed)
    assert (out / "report.md").read_text().startswith("# xid-storm · gpulab plugin · ✅ PASS")
    assert (out / "timeline.png").stat().st_size > 20_000
    # 300 Xids were injected and the plugin saw every one of them.
    assert sum(f.kind == "xid" for f in rec.faults) == 300
    assert seen == 300


@pytest.fixture
def dra_lab(labs: Callable[..., Lab]) -> Lab:
    return labs("dra")


def test_dra_taints_times_each_fault_to_its_device_taint(dra_lab: Lab, verdict: Verdict) -> None:
    """The experiments tool on a DRA lab: NVIDIA's DRA driver turns an Xid 79, an ignored
    Xid 13 and a lost GPU into device taints, the report times each, and the claim made
    after the Xid 79 gets every Hopper but the tainted one."""
    verdict.expect("every expectation holds; the 3-GPU claim avoids the tainted GPU")
    exp = experiments.load("dra-taints")
    experiments.check_lab(exp)
    rec = Runner(exp, dra_lab).run()
    out = REPORTS / exp.name
    outcomes = report.write(rec, out)

    assert rec.signal == "taints"  # what the driver's Serving said faults show as
    trs = traces(rec)
    for name, st in layer_stats(trs, by_taints=True).items():
        if st is not None:
            verdict.property(f"{name} median (ms)", round(st[2], 1))
    failed = [f"{o.text} (observed: {o.observed})" for o in outcomes if not o.passed]
    assert not failed, f"expectations failed, see {out / 'report.md'}: " + "; ".join(failed)
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
