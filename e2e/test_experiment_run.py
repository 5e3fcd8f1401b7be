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
