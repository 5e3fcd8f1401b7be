"""pytest fixtures for cluster-tier suites (the `gpulab_e2e` pytest11 plugin), usable by
any project that wants to test its own plugin in a gpulab lab:

    def test_gpu_pod(lab, pods, fake_gpus): ...

    @pytest.mark.needs("recovers")              # deselected for subjects that do not
    def test_comes_back(subject, lab, fake_gpus): ...

Options: --lab NAME (default seed), --subjects gpulab,nvidia,path/to/subject.yaml (the
suites run once per subject; $GPULAB_SUBJECTS, `make e2e SUBJECT=...`), --keep-lab (leave
the cluster up; `make e2e KEEP=1`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from clusters import spec
from clusters.infra import InfraMissing
from clusters.lab import Lab
from clusters.spec import SpecError
from clusters.steps import StepError
from clusters.subject import Subject, SubjectError
from clusters.subject import load as load_subject
from clusters.subject import names as subject_names
from e2e import htmlreport
from e2e.pods import Pods
from e2e.verdict import KUBERNETES, Cell, Verdict, summary
from fakenvml.node import NodeDir

NAMESPACE = "gpulab-e2e"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gpulab-e2e")
    g.addoption("--lab", default=os.environ.get("GPULAB_LAB", "seed"))
    g.addoption(
        "--subjects",
        "--subject",
        dest="gpulab_subjects",
        default=os.environ.get("GPULAB_SUBJECTS") or "gpulab,nvidia",
        help="plugins under test: shipped subject names or subject files, comma-separated",
    )
    g.addoption("--keep-lab", action="store_true", default=bool(os.environ.get("KEEP")))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*expectations): run only for subjects whose `expects` has them, e.g. "
        "needs('recovers') or needs('lost_gpu=that-device')",
    )


_SUBJECTS = pytest.StashKey[list[Subject]]()


def subjects(config: pytest.Config) -> list[Subject]:
    """The --subjects, loaded once: every test gets the same objects, so pytest groups the
    tests by subject (new objects per test would interleave them: a plugin switch each)."""
    if _SUBJECTS not in config.stash:
        try:
            names = subject_names(config.getoption("gpulab_subjects"))
            config.stash[_SUBJECTS] = [load_subject(n) for n in names]
        except SubjectError as e:
            raise pytest.UsageError(str(e)) from None
    return config.stash[_SUBJECTS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    own = any(
        "subject" in str(m.args[0]).replace(" ", "").split(",")
        for m in metafunc.definition.iter_markers("parametrize")
    )
    if "subject" in metafunc.fixturenames and not own:  # a test may parametrize it itself
        found = subjects(metafunc.config)
        metafunc.parametrize("subject", found, ids=[s.name for s in found], scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked needs(...) are not generated for subjects that lack it (deselected,
    never skipped: a scenario that a plugin cannot have is not a scenario for it). A
    subject configured for MIG (expects.mig single/mixed) runs only the MIG scenarios,
    which need `mig=...`: the whole-GPU suites are the same plugin's without MIG."""
    keep, drop = [], []
    for item in items:
        # Every needs marker counts: the module's (e.g. replicas=1) and the test's own.
        needs = tuple(a for m in item.iter_markers("needs") for a in m.args)
        s = getattr(getattr(item, "callspec", None), "params", {}).get("subject")
        # (A test may parametrize `subject` itself, with names: no expectations to read.)
        if isinstance(s, Subject):
            mig_only = s.expects.mig != "none" and not any(n.startswith("mig") for n in needs)
            (drop if mig_only or not s.needs_met(needs) else keep).append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# The DRA suites' column: NVIDIA's DRA driver serves their labs, no subject does.
DRA_COLUMN = "nvidia-dra-driver"
DRA_TESTS = ("e2e/test_dra", "e2e/test_experiment_run.py::test_dra_")


def summary_key(nodeid: str, names: list[str]) -> tuple[str, str] | None:
    """('scenario [other params]', subject) for an e2e test id (a DRA test's column is
    DRA_COLUMN, all its parameters in the scenario), or None."""
    if nodeid.startswith(DRA_TESTS):
        base, _, param = nodeid.rstrip("]").partition("[")
        return base.split("::")[-1] + (f" [{param}]" if param else ""), DRA_COLUMN
    if "[" not in nodeid or not nodeid.startswith("e2e/"):
        return None
    base, param = nodeid.rstrip("]").split("[", 1)
    for name in sorted(names, key=len, reverse=True):  # nvidia-v0.17.4 before nvidia
        tokens = f"-{param}-".split(f"-{name}-", 1)
        if len(tokens) == 2:
            rest = "-".join(t.strip("-") for t in tokens if t.strip("-"))
            return base.split("::")[-1] + (f" [{rest}]" if rest else ""), name
    return None


def summary_rows(stats: dict[str, list[Any]], names: list[str]) -> dict[str, dict[str, Cell]]:
    """scenario -> subject -> Cell, from the terminal reporter's stats (test reports by
    outcome): the calls that passed or failed, and the setups or teardowns that errored."""
    rows: dict[str, dict[str, Cell]] = {}
    for outcome in ("passed", "failed", "error"):
        for rep in stats.get(outcome, []):
            if getattr(rep, "when", None) != "call" and outcome != "error":
                continue
            key = summary_key(rep.nodeid, names)
            if key is None:
                continue
            trace = "" if outcome == "passed" else str(getattr(rep, "longreprtext", ""))
            # A collection error (CollectReport) has neither duration nor properties.
            seconds, props = getattr(rep, "duration", 0.0), getattr(rep, "user_properties", [])
            rows.setdefault(key[0], {})[key[1]] = Cell.of(
                outcome == "passed", seconds, props, _crash(rep), trace=trace, nodeid=rep.nodeid
            )
    return rows


_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    # The HTML report's duration, and its cut-off for experiment reports of this run.
    session.config.stash[_STARTED] = time.time()


@pytest.hookimpl(trylast=True)  # its last line names the HTML report
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A grid a person reads at a glance: scenario x subject -> PASS and seconds, FAIL or
    `-`, and under it what each failed cell expected, saw and failed on. The whole of it,
    with the failures' traces and the experiments' timelines, goes to an HTML file."""
    config = terminalreporter.config
    names = [s.name for s in subjects(config)]
    rows = summary_rows(terminalreporter.stats, names)
    if not rows:  # not an e2e run (the plugin is loaded into every pytest run)
        return
    width = terminalreporter._tw.fullwidth
    dra = {k: r for k, r in rows.items() if DRA_COLUMN in r}
    plugins = {k: r for k, r in rows.items() if k not in dra}
    both: list[htmlreport.Section] = [
        ("scenario x subject", plugins, names),
        ("NVIDIA's DRA driver", dra, [DRA_COLUMN]),
    ]
    sections = [s for s in both if s[1]]
    for title, r, columns in sections:
        terminalreporter.section(f"gpulab e2e: {title}")
        for line in summary(r, columns, width):
            terminalreporter.write_line(line)
    started = config.stash.get(_STARTED, time.time())
    run = htmlreport.Run(
        started=started,
        seconds=time.time() - started,
        subjects=names,
        sections=sections,
        totals=htmlreport.totals(terminalreporter.stats),
        timelines=htmlreport.timelines(htmlreport.reports_root(), since=started),
    )
    path = htmlreport.path_for(getattr(config.option, "xmlpath", None))
    try:
        htmlreport.write(run, path)
    except OSError as e:
        terminalreporter.write_line(f"gpulab e2e report: not written: {e}")
        return
    terminalreporter.write_line(f"gpulab e2e report: {path}")


def _crash(rep: pytest.TestReport) -> str:
    """The failing assertion's message (pytest's reprcrash), when there is one."""
    crash = getattr(getattr(rep, "longrepr", None), "reprcrash", None)
    return str(getattr(crash, "message", "") or "")


@pytest.fixture(autouse=True)
def _kubernetes_version(request: pytest.FixtureRequest,
                        record_property: Callable[[str, object], None]) -> None:  # fmt: skip
    """Records the Kubernetes version of the lab a test runs on (the summary's column)."""
    names = {**LAB_FIXTURES, "lab": request.config.getoption("--lab")}
    for fixture, name in names.items():
        if fixture in request.fixturenames:
            with contextlib.suppress(SpecError):
                record_property(KUBERNETES, spec.load(name).kubernetes)
            return


@pytest.fixture
def verdict(record_property: Callable[[str, object], None]) -> Verdict:
    """verdict.expect(text) / verdict.saw(text): the scenario's cell in the summary table
    (and properties in the JUnit XML)."""
    return Verdict(record_property)


def bring_up(lab: Lab) -> Lab:
    """lab.up(), or a one-line failure naming `make infra` when infrastructure is missing
    (fixtures never build it: no test timeout may wrap a build)."""
    try:
        return lab.up()
    except InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


# Fixtures that stand for a lab, and which lab: `lab` is the --lab one.
LAB_FIXTURES = {"hetero": "hetero", "mig_lab": "mig", "dra_lab": "dra", "dra_mig_lab": "dra-mig"}


def labs_wanted(items: list[pytest.Item], config: pytest.Config) -> list[str]:
    """The labs the selected tests use, in the order they first appear."""
    names = {**LAB_FIXTURES, "lab": config.getoption("--lab")}
    out: list[str] = []
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in names and names[fixture] not in out:
                out.append(names[fixture])
    return out


@pytest.fixture(scope="session")
def labs(request: pytest.FixtureRequest) -> Iterator[Callable[..., Lab]]:
    """labs(name, subject=None) -> that lab, up (re-used when it already runs) and running
    `subject`. Every lab the selected tests use starts coming up at once, side by side
    (kind create and image loads mostly wait: two labs take little longer than one); each
    comes up once per session and goes down at the end unless --keep-lab."""
    wanted = labs_wanted(request.session.items, request.config)
    pool = ThreadPoolExecutor(max_workers=max(len(wanted), 1))
    coming: dict[str, Future[Lab]] = {n: pool.submit(bring_up, Lab(n)) for n in wanted}

    def get(name: str, subject: Subject | None = None) -> Lab:
        if name not in coming:
            coming[name] = pool.submit(bring_up, Lab(name, subject=subject))
        lab = coming[name].result()
        if subject is not None and lab.subject.name != subject.name:
            lab.use_subject(subject)
        return lab

    yield get
    up = [f.result() for f in coming.values() if f.done() and not f.exception()]
    pool.shutdown()
    if not request.config.getoption("--keep-lab"):
        # One after the other: concurrent `kind delete`s race on ~/.kube/config.lock.
        for lab in up:
            lab.down()


@pytest.fixture(scope="session")
def lab(labs: Callable[..., Lab], subject: Subject, request: pytest.FixtureRequest) -> Lab:
    """The --lab lab (default seed) running `subject` (the suites are parametrized over
    subjects)."""
    return labs(request.config.getoption("--lab"), subject)


def namespaced_pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in the suites' own namespace on `lab`, emptied afterwards."""
    lab.ensure_namespace(NAMESPACE)
    p = Pods.of(lab, NAMESPACE)
    yield p
    p.delete_all()


def recovering_gpus(lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """get(node) -> NodeDir: inject/recover on that node's GPUs from the host. Afterwards
    every GPU faulted meanwhile is recovered and the lab brought back to full health: a
    subject that does not recover by itself (NVIDIA's) is restarted until capacity is
    whole; on a DRA lab the kubelet plugins restart (v0.4.1 never lifts a taint it set)
    until no device is tainted."""
    touched: dict[str, tuple[NodeDir, int]] = {}

    def get(node: str) -> NodeDir:
        d = lab.fake_gpus(node)
        touched.setdefault(node, (d, len(list(d.events()))))
        return d

    yield get
    faulted = False
    for d, start in touched.values():
        for gpu in sorted({r.gpu for r in d.events(start) if r.kind.is_fault}):
            d.recover(gpu)
            faulted = True
    if not faulted:
        return
    if lab.lab.spec.dra:
        lab.restart_plugin()
        lab.wait_untainted(deadline_s=60)
        return
    if not lab.subject.expects.recovers:
        lab.restart_plugin()
    try:
        lab.wait_capacity(deadline_s=60)
    except StepError:
        # A recovering subject that did not recover: this test errors, and fresh plugin
        # pods keep the failure from spilling into every later test.
        lab.restart_plugin()
        raise


@pytest.fixture
def fake_gpus(lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """fake_gpus(node) -> NodeDir, and the lab at full capacity again afterwards."""
    yield from recovering_gpus(lab)


@pytest.fixture
def pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in a namespace of the suite's own, emptied after each test."""
    yield from namespaced_pods(lab)
