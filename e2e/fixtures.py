"""pytest fixtures for cluster-tier suites (the `gpulab_e2e` pytest11 plugin), usable by
any project that wants to test its own plugin in a gpulab lab:

    def test_gpu_pod(lab, pods, fake_gpus): ...

    @pytest.mark.needs("recovers")              # deselected for subjects that do not,
                                                # failed for those that do not say
    def test_comes_back(subject, lab, fake_gpus): ...

    @lab_fixture("hetero")                      # a second lab, brought up in its turn
    def hetero(labs, subject): return labs("hetero", subject)

Options: --lab NAME (default seed), --subjects gpulab,nvidia,path/to/subject.yaml (the
suites run once per subject; $GPULAB_SUBJECTS, `make e2e SUBJECT=...`), --keep-lab (leave
the cluster up; `make e2e KEEP=1`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import pytest

from clusters.built import InfraMissing
from clusters.labs import spec
from clusters.labs.dra import DraDriver
from clusters.labs.lab import Lab
from clusters.labs.spec import SpecError
from clusters.steps import StepError
from clusters.subjects.subject import Subject, SubjectError, Unstated
from clusters.subjects.subject import load as load_subject
from clusters.subjects.subject import names as subject_names
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
    g.addoption(
        "--suites",
        dest="gpulab_suites",
        choices=("subject", "all"),
        default=os.environ.get("GPULAB_E2E_SUITES") or "all",
        help="subject: only the suites that test the subjects (a plugin team's run); "
        "all: gpulab's own too (DRA, the chart on a plain cluster, experiments)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*expectations): run only for subjects whose `expects` has them, e.g. "
        "needs('recovers') or needs('lost_gpu=that-device'); a subject whose file does not "
        "state one fails the scenario in one line",
    )
    config.addinivalue_line(
        "markers",
        "varies_with(*traits): the scenario's outcome depends on the subject only through "
        "these expectations or properties (`plugin`: the program that runs); it runs for the "
        "first subject of each distinct combination, the others are deselected",
    )
    config.addinivalue_line(
        "markers",
        "platform: a suite of the GPU platform above the node (the GPU Operator, its MIG "
        "manager): mostly waits on its operators' own loops, so `make test` runs these "
        "(`-m platform`) in a lane of their own beside the rest (`-m 'not platform'`)",
    )
    config.addinivalue_line(
        "markers",
        "smoke: the older Kubernetes pass's set (`-m smoke`): the seeds' scenario, one fault "
        "and the restarts, once per plugin family",
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


@pytest.hookimpl(trylast=True)  # after pytest grouped the items by subject
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked needs(...) are not generated for subjects that lack it (deselected,
    never skipped: a scenario that a plugin cannot have is not a scenario for it). A
    subject configured for MIG (expects.mig single/mixed) runs only the MIG scenarios,
    which need `mig=...`: the whole-GPU suites are the same plugin's without MIG. A
    sharing subject (expects.memory_unit_mib) runs only those that need `shares_memory`."""
    keep, drop = [], []
    only_subjects = config.getoption("gpulab_suites") == "subject"
    # A need the subject does not state keeps the scenario: it fails at setup (below).
    for item in items:
        # Every needs marker counts: the module's (e.g. replicas=1) and the test's own.
        needs = tuple(a for m in item.iter_markers("needs") for a in m.args)
        s = getattr(getattr(item, "callspec", None), "params", {}).get("subject")
        # (A test may parametrize `subject` itself, with names: no expectations to read.)
        if isinstance(s, Subject):
            mig_only = s.expects.mig != "none" and not any(n.startswith("mig") for n in needs)
            # A sharing subject's devices are units of memory: the suites that count GPUs
            # are not its scenarios (e2e/test_share.py is).
            share_only = s.expects.shares_memory and "shares_memory" not in needs
            (drop if mig_only or share_only or not s.needs_met(needs) else keep).append(item)
        else:
            # gpulab's own suites (the shipped e2e package's tests with no subject).
            own = getattr(getattr(item, "module", None), "__name__", "").startswith("e2e.")
            (drop if only_subjects and own else keep).append(item)
    marked = any(i.get_closest_marker("varies_with") for i in keep)
    covered = {id(i) for i in covered_elsewhere(keep, subjects(config))} if marked else set()
    config.stash[_COVERED] = len(covered)
    drop += [i for i in keep if id(i) in covered]
    keep = by_lab([i for i in keep if id(i) not in covered], config)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


_COVERED = pytest.StashKey[int]()


def covered_elsewhere(items: list[pytest.Item], order: list[Subject]) -> list[pytest.Item]:
    """Items marked varies_with(...) whose scenario already runs for an earlier subject
    (in --subjects order) with the same traits: each claim is checked once per behaviour
    that can change its outcome, not once per subject (a run of one subject keeps all)."""
    rank = {id(s): i for i, s in enumerate(order)}
    first: dict[tuple[object, ...], pytest.Item] = {}
    marked: list[pytest.Item] = []
    for item in sorted(items, key=lambda i: rank.get(id(_subject_of(i)), len(rank))):
        s = _subject_of(item)
        traits = tuple(t for m in item.iter_markers("varies_with") for t in m.args)
        if s is None or item.get_closest_marker("varies_with") is None:
            continue
        marked.append(item)
        params = item.callspec.params  # type: ignore[attr-defined]
        others = tuple(sorted((k, repr(v)) for k, v in params.items() if k != "subject"))
        first.setdefault((item.path, item.originalname, others,
                          tuple(s.trait(t) for t in traits)), item)  # fmt: skip
    kept = {id(i) for i in first.values()}
    return [i for i in marked if id(i) not in kept]


def _subject_of(item: pytest.Item) -> Subject | None:
    s = getattr(getattr(item, "callspec", None), "params", {}).get("subject")
    return s if isinstance(s, Subject) else None


# Suites whose labs no subject serves: their column is what does (its Serving.name).
SERVED_BY = {("e2e/test_dra", "e2e/test_experiment_run.py::test_dra_"): DraDriver.name}


def summary_key(nodeid: str, names: list[str]) -> tuple[str, str] | None:
    """('scenario [other params]', subject) for an e2e test id (a test of a suite in
    SERVED_BY: what serves its lab, all its parameters in the scenario), or None."""
    for prefixes, column in SERVED_BY.items():
        if nodeid.startswith(prefixes):
            base, _, param = nodeid.rstrip("]").partition("[")
            return base.split("::")[-1] + (f" [{param}]" if param else ""), column
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
_TIMELINE_WRITTEN = pytest.StashKey[Path]()  # the labs' timeline table (LabPool.write)


def pytest_sessionstart(session: pytest.Session) -> None:
    # The HTML report's duration, and its cut-off for experiment reports of this run.
    session.config.stash[_STARTED] = time.time()


@pytest.hookimpl(trylast=True)  # its last line names the HTML report
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A grid a person reads at a glance: scenario x subject -> PASS and seconds, FAIL or
    `-`, and under it what each failed cell expected, saw and failed on. The whole of it,
    with the failures' traces and the experiments' timelines, goes to an HTML file."""
    config = terminalreporter.config
    # The labs' timeline in the output too: a lab that came late is the likeliest cause of
    # a test that failed waiting, and CI keeps its output, not build/.
    if (table := config.stash.get(_TIMELINE_WRITTEN, None)) and table.exists():
        terminalreporter.section("gpulab e2e: the labs' timeline (s from the session's start)")
        for line in table.read_text().splitlines()[2:]:
            terminalreporter.write_line(line)
    names = [s.name for s in subjects(config)]
    rows = summary_rows(terminalreporter.stats, names)
    if not rows:  # not an e2e run (the plugin is loaded into every pytest run)
        return
    width = terminalreporter._tw.fullwidth
    # One grid of subjects, and one per server of the GPUs that is no subject.
    servers = sorted({column for r in rows.values() for column in r} - set(names))
    plugins = {k: r for k, r in rows.items() if not set(r) & set(servers)}
    every: list[htmlreport.Section] = [("scenario x subject", plugins, names)] + [
        (column, {k: r for k, r in rows.items() if column in r}, [column]) for column in servers
    ]
    sections = [s for s in every if s[1]]
    for title, r, columns in sections:
        terminalreporter.section(f"gpulab e2e: {title}")
        for line in summary(r, columns, width):
            terminalreporter.write_line(line)
    if covered := config.stash.get(_COVERED, 0):
        terminalreporter.write_line(
            f"{covered} scenario x subject pairs not run: covered by an earlier subject whose "
            "traits the scenario varies with (varies_with)"
        )
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
                record_property(KUBERNETES, spec.load(name).versions_text)
            return


_CALL = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A scenario that needs an expectation its subject does not state fails before its
    fixtures bring a lab up (the one line of Unstated, below)."""
    s = _subject_of(item)
    if s is not None:
        s.require(tuple(a for m in item.iter_markers("needs") for a in m.args))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if call.excinfo is not None and call.excinfo.errisinstance(Unstated):
        rep.longrepr = str(call.excinfo.value)  # the file, the key, its values: all of it
    if rep.when == "call":
        item.stash[_CALL] = rep


@pytest.fixture(autouse=True)
def _fresh_plugin_after_a_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a failed scenario, fresh plugin pods (and full capacity) before the next one: a
    plugin that did not re-register after a kubelet restart would otherwise fail every
    later test on that lab, each at its own deadline (a subject's one failure became five,
    and minutes of waiting)."""
    yield
    rep = request.node.stash.get(_CALL, None)
    if rep is None or not rep.failed:
        return
    values = getattr(request.node, "funcargs", None) or {}  # what the test was given
    for name in ("lab", "hetero"):
        lab = values.get(name)
        if isinstance(lab, Lab) and lab.serves_plugin:
            with contextlib.suppress(StepError):
                lab.restart_plugin()


@pytest.fixture
def verdict(record_property: Callable[[str, object], None]) -> Verdict:
    """verdict.expect(text) / verdict.saw(text): the scenario's cell in the summary table
    (and properties in the JUnit XML)."""
    return Verdict(record_property)


def bring_up(lab: Lab) -> Lab:
    """lab.up() without its spec's fleet, or a one-line failure naming `make infra` when
    infrastructure is missing (fixtures never build it: no test timeout may wrap a build).
    The suites of a lab share it, and some read or delete every node's ResourceSlices
    (test_dra_width.py): its fleet is the fleet suite's (test_fleet.py), made from the spec
    there and deleted after it."""
    try:
        return lab.up(with_fleet=False)
    except InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


# Fixtures that stand for a lab, and which lab: each suite's lab_fixture records its own as
# pytest imports the suite, before the collection hooks read them. `lab` is the --lab one.
LAB_FIXTURES: dict[str, str] = {}
# Clusters that are no lab spec (the chart's plain cluster): name -> what makes one. The
# pool brings them up and down like labs, beside the suites before them.
CLUSTER_MAKERS: dict[str, Callable[[], Pooled]] = {}
# Lab fixtures of module scope: each holds its lab until its module's run of tests is over.
MODULE_HELD: set[str] = set()


class Job(NamedTuple):
    """A lab's job (lab_job): what it runs on the lab, and whether it is one of minutes
    whose lab comes up with the first phase."""

    run: Callable[[Lab], Any]
    first_phase: bool = False


# Jobs that run on a lab beside the other suites (NVIDIA's DRA suite, the DRA labs'
# experiments): fixture name -> (lab, job). The job starts as soon as its lab is up; the
# fixture's value is its result.
LAB_JOBS: dict[str, tuple[str, Job]] = {}


@dataclass(frozen=True)
class _Raised:
    """What a lab's job raised, kept for its fixture to raise (jobs_as_one)."""

    error: Exception


def jobs_as_one(declared: list[tuple[str, Job]]) -> Job:
    """A lab's jobs (its experiment, its wide-node scenarios) as the one job the pool
    runs: each in turn, in the order they were declared, its result or what it raised
    kept under its fixture's name; one job failing does not stop the next."""

    def run(lab: Lab) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, job in declared:
            try:
                out[name] = job.run(lab)
            except Exception as e:
                out[name] = _Raised(e)
        return out

    return Job(run, any(job.first_phase for _, job in declared))


class Pooled(Protocol):
    """What the pool holds: a Lab, or a cluster a suite makes itself."""

    def down(self) -> None: ...


def _declare(name: str, lab: str) -> None:
    known = LAB_FIXTURES.setdefault(name, lab)
    if known != lab:  # the name is all labs_of sees of a test's fixtures
        raise ValueError(f"fixture {name!r} stands for lab {known!r} elsewhere, "
                         f"not {lab!r}: give it a name of its own")  # fmt: skip


def lab_fixture(
    lab: str,
    *,
    scope: Literal["session", "module", "function"] = "session",
    make: Callable[[], Pooled] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """@lab_fixture("hetero") over a fixture function (which gets the lab from `labs`):
    a pytest fixture of `scope` that stands for that lab, so the session brings the lab up
    for the tests that use it, in their order (labs_of), and their summary cells show its
    Kubernetes version. `make`: a cluster that is no lab spec, made (and pooled) by it."""

    def declare(fn: Callable[..., Any]) -> Any:
        _declare(fn.__name__, lab)
        if scope == "module":
            MODULE_HELD.add(fn.__name__)
        if make is not None:
            CLUSTER_MAKERS[lab] = make
        return pytest.fixture(scope=scope)(fn)

    return declare


def lab_job(lab: str, *, first_phase: bool = False) -> Callable[[Callable[[Lab], Any]], Any]:
    """@lab_job("stock") over job(lab) -> result: a session fixture of the job's name whose
    value is its result. The job runs on `lab` as soon as the lab is up, in a thread beside
    the other labs' suites, and before the lab's own tests get it (`labs` waits for it):
    a suite or a timeline that runs a minute or more on its lab no longer keeps the
    others waiting. `first_phase` (a job of minutes): the lab's tests (this fixture's among
    them) come right after the first labs' (by_lab), so the lab comes up beside them and
    its place is given back soon after; otherwise they keep their place."""

    def declare(job: Callable[[Lab], Any]) -> Any:
        _declare(job.__name__, lab)
        LAB_JOBS[job.__name__] = (lab, Job(job, first_phase))

        def result(labs: LabPool) -> Any:
            got = labs.job_result(lab)[job.__name__]
            if isinstance(got, _Raised):
                raise got.error
            return got

        result.__name__ = job.__name__
        result.__doc__ = job.__doc__
        return pytest.fixture(scope="session", name=job.__name__)(result)

    return declare


def gpu_node(lab: spec.Lab, profile: str) -> spec.Node:
    """The lab's one GPU node whose GPUs are all of `profile` (as its spec names them): a
    suite names a node by what it needs of it, so a worker added to the spec moves none."""

    def profiles(n: spec.Node) -> set[str]:
        return {g["profile"] for g in n.spec.gpus or ()}

    found = [n for n in lab.gpu_nodes if profiles(n) == {profile}]
    if len(found) != 1:
        have = ", ".join(f"{n.name} ({'+'.join(sorted(profiles(n)))})" for n in lab.gpu_nodes)
        raise LookupError(f"lab {lab.name}: {len(found)} GPU nodes of {profile} alone, "
                          f"expected one; its GPU nodes: {have}")  # fmt: skip
    return found[0]


def _lab_uses(item: pytest.Item, config: pytest.Config) -> list[tuple[str, str]]:
    """The fixtures of one test that stand for a lab, and their labs (LAB_FIXTURES, `lab`)."""
    names = {**LAB_FIXTURES, "lab": config.getoption("--lab")}
    return [(f, names[f]) for f in getattr(item, "fixturenames", ()) if f in names]


def labs_of(item: pytest.Item, config: pytest.Config) -> list[str]:
    """The labs one test uses (through LAB_FIXTURES or `lab`)."""
    return [lab for _, lab in _lab_uses(item, config)]


def last_tests(items: list[pytest.Item], config: pytest.Config) -> dict[str, str]:
    """Each lab's last test: the one after whose teardown nothing holds the lab. A
    module-scoped lab fixture holds it until its module's run of tests is over (pytest
    tears the fixture down when the next test is another module's): run alone,
    e2e/test_fleet.py had the `dra` lab deleted after its last test there, before its
    fleet fixture's teardown took the fleet off it."""
    module = [item.nodeid.split("::", 1)[0] for item in items]
    end = list(range(len(items)))  # the last index of each item's module run
    for i in range(len(items) - 2, -1, -1):
        if module[i + 1] == module[i]:
            end[i] = end[i + 1]
    last: dict[str, int] = {}
    for i, item in enumerate(items):
        for fixture, lab in _lab_uses(item, config):
            last[lab] = max(last.get(lab, i), end[i] if fixture in MODULE_HELD else i)
    return {lab: items[i].nodeid for lab, i in last.items()}


def labs_wanted(items: list[pytest.Item], config: pytest.Config) -> list[str]:
    """The labs the selected tests use, in the order they first appear."""
    out: list[str] = []
    for item in items:
        out += [n for n in labs_of(item, config) if n not in out]
    return out


def by_lab(items: list[pytest.Item], config: pytest.Config) -> list[pytest.Item]:
    """The items with each lab's tests together (a stable sort on the first use of the
    first lab a test needs): a lab can then go down once its part is over, instead of
    idling until an experiment at the end needs it again. The --lab lab and hetero go
    together: the subject-grouped suites alternate between them."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        for name in labs_of(item, config):
            first.setdefault(name, i)
    together = {config.getoption("--lab"), "hetero"}
    phase0 = min((first[n] for n in together if n in first), default=0)
    with_jobs = {lab for lab, job in LAB_JOBS.values() if job.first_phase}

    def key(item: pytest.Item) -> float:
        used = labs_of(item, config)
        if not used:
            return first_position[id(item)]
        # A lab with a first-phase job: its tests right after the first phase's, so the
        # lab comes up beside that phase (its job then runs there) and goes soon after.
        return min(phase0 if n in together else phase0 + 0.5 if n in with_jobs else first[n]
                   for n in used)  # fmt: skip

    first_position = {id(item): i for i, item in enumerate(items)}
    return sorted(items, key=key)


# How long a test waits on the pool for a lab (its bring-up, a delete before it, its job)
# before it fails: each step inside has its own deadline, so this only ends a wait that
# would otherwise hang. Generous on purpose: under CI's load the operator lab's bring-up and
# job together took past 600 s.
LAB_WAIT_S = float(os.environ.get("GPULAB_LAB_POOL_WAIT_S", "1800"))


@contextlib.contextmanager
def alarm_paused() -> Iterator[None]:
    """pytest-timeout's timer (its signal method, pyproject.toml: the process's
    ITIMER_REAL) stopped for the block and set again to what was left: a test's 300 s count
    its own work, not its wait for a lab the pool brings up. (CI: the platform lane's first
    three tests failed at setup, each at 300 s, waiting for the operator lab and its job.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left, interval)


class LabPool:
    """The session's labs. They come up in the order the tests first use them, at most
    `live` up or coming up at once, a lab whose first-phase job is over not counted (five
    clusters at once took the load average to 29 on 2 cores and slowed every suite), and
    each goes down after the last test that uses it, unless kept. kind create and image loads mostly
    wait, so a lab comes up beside the suites of the one before it."""

    def __init__(self, order: list[str], last: dict[str, str], keep: bool, live: int,
                 jobs: dict[str, Job] | None = None) -> None:  # fmt: skip
        self.order, self.last, self.keep, self.live = order, last, keep, live
        self.jobs = jobs or {}  # lab -> its job (LAB_JOBS), started once the lab is up
        self.running: dict[str, Future[Any]] = {}
        # Two bring-ups at a time: a third beside them slowed the first lab the suites
        # wait for (the load average passed 30); the third starts when one is up.
        self.pool = ThreadPoolExecutor(max_workers=max(min(live, 2), 1))
        self.deleting = ThreadPoolExecutor(max_workers=1)  # beside the suites, one at a time
        self.working = ThreadPoolExecutor(max_workers=1)  # the labs' jobs
        self.coming: dict[str, Future[Any]] = {}  # a Lab, or a CLUSTER_MAKERS cluster
        self.going: dict[str, Future[None]] = {}
        self.done: set[str] = set()
        # (seconds since the pool began, lab, what happened): where the tier's time went,
        # which the labs' own progress lines (printed from threads into whichever test ran)
        # cannot tell. write() puts it in build/.
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, str, str]] = []
        self._fill()

    def _event(self, name: str, what: str) -> None:
        self.timeline.append((round(time.monotonic() - self.t0, 1), name, what))

    def _up(self, name: str, subject: Subject | None = None) -> Any:
        self._event(name, "up")
        try:
            made = (CLUSTER_MAKERS[name]() if name in CLUSTER_MAKERS
                    else bring_up(Lab(name, subject=subject)))  # fmt: skip
        except BaseException:
            self._event(name, "up failed")
            raise
        self._event(name, "ready")
        if name in self.jobs and name not in self.running:
            self.running[name] = self.working.submit(self._job, name, made)
        return made

    def _job(self, name: str, lab: Lab) -> Any:
        self._event(name, "job")
        try:
            return self.jobs[name].run(lab)
        finally:
            self._event(name, "job done")

    def _down(self, name: str, made: Pooled) -> None:
        self._event(name, "down")
        made.down()
        self._event(name, "gone")

    def _fill(self) -> None:
        for name in self.order:
            # A lab whose first-phase job is over only waits for its few tests (the
            # stock lab: its 5-minute DRA suite done, 10 s of tests after the first
            # labs'): it takes no place, so the next lab comes up while it waits, not
            # after (CI: the MIG lab's first test waited a minute for it).
            active = [n for n in self.coming if n not in self.done and not self._job_over(n)]
            if len(active) >= self.live:
                return
            if name not in self.coming:
                self.coming[name] = self.pool.submit(self._up, name)

    def _job_over(self, name: str) -> bool:
        """Whether `name`'s first-phase job has ended."""
        job = self.running.get(name)
        return job is not None and job.done() and self.jobs[name].first_phase

    def get(self, name: str, subject: Subject | None = None) -> Any:
        if name not in self.coming or name in self.done:  # not foreseen, or asked again
            self.done.discard(name)
            going = self.going.pop(name, None)
            if going is not None:  # a kind create beside its own delete fails: after it
                self._wait(name, going, "its delete")
            self.coming[name] = self.pool.submit(self._up, name, subject)
        lab = self._wait(name, self.coming[name], "its bring-up")
        if name in self.running:  # its job first: the lab's tests get it afterwards
            self._wait(name, self.running[name], "its job", raising=False)
        if subject is not None and lab.subject.name != subject.name:
            lab.use_subject(subject)
        return lab

    __call__ = get  # labs(name, subject=None), as the suites call it

    def _wait(self, name: str, f: Future[Any], what: str, raising: bool = True) -> Any:
        """f's result (or None, not `raising` what it raised), the test's timer paused;
        past LAB_WAIT_S a one-line error with the lab's timeline so far."""
        with alarm_paused():
            wait_futures([f], timeout=LAB_WAIT_S)
        if not f.done():
            seen = ", ".join(f"{w} at {t:.0f} s" for t, n, w in self.timeline if n == name)
            pytest.fail(f"lab {name}: {what} not over after {LAB_WAIT_S:.0f} s ({seen})",
                        pytrace=False)  # fmt: skip
        return f.result() if raising else None

    def job_result(self, name: str) -> Any:
        """The result of `name`'s job (raising what it raised), once it is done."""
        self.get(name)  # which waits for the job
        return self.running[name].result()

    def finished(self, nodeid: str) -> None:
        """After a test: labs whose last test it was go down, and the next come up."""
        for name, last in self.last.items():
            if last == nodeid and name not in self.done:
                self._event(name, "last test done")
                self._release(name)
        self._fill()

    def _release(self, name: str) -> None:
        self.done.add(name)
        f = self.coming.get(name)
        if not self.keep and f is not None and f.done() and not f.exception():
            self.going[name] = self.deleting.submit(self._down, name, f.result())

    def close(self) -> None:
        for name in list(self.coming):
            if name not in self.done:  # the session's last tests (their teardown is now)
                self._event(name, "last test done")
                self._release(name)
        self.pool.shutdown()
        self.working.shutdown()
        self.deleting.shutdown()

    def spans(self) -> list[dict[str, Any]]:
        """Per lab bring-up, in order: when it started, its seconds to ready, its job's
        seconds, how long its tests held it, and its delete's seconds (None: not seen, as
        for a kept lab)."""
        out: list[dict[str, Any]] = []
        for t, name, what in self.timeline:
            if what == "up":
                out.append({"lab": name, "up_at_s": t, "up_s": None, "job_s": None,
                            "used_s": None, "down_s": None, "failed": False})  # fmt: skip
                continue
            span = next((x for x in reversed(out) if x["lab"] == name), None)
            if span is None:  # its last test ran without it (skipped before setup)
                continue
            start = span["up_at_s"]
            if what == "ready":
                span["up_s"] = round(t - start, 1)
            elif what == "up failed":
                span["failed"] = True
            elif what == "last test done" and span["up_s"] is not None:
                span["used_s"] = round(t - start - span["up_s"], 1)
            elif what == "job":
                span["job_at"] = t
            elif what == "job done" and "job_at" in span:
                span["job_s"] = round(t - span.pop("job_at"), 1)
            elif what == "down":
                span["down_at"] = t
            elif what == "gone" and "down_at" in span:
                span["down_s"] = round(t - span.pop("down_at"), 1)
        for span in out:
            span.pop("down_at", None)
            span.pop("job_at", None)
        return out

    def write(self, path: Path) -> None:
        """The timeline and its spans as JSON, and a table beside it (`.md`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        spans = self.spans()
        path.write_text(json.dumps({"events": self.timeline, "labs": spans}, indent=1) + "\n")

        def cell(v: float | None) -> str:
            return "—" if v is None else f"{v:.0f}"

        rows = [f"| {s['lab']} | {cell(s['up_at_s'])} | {cell(s['up_s'])}"
                f"{' (failed)' if s['failed'] else ''} | {cell(s['job_s'])} | "
                f"{cell(s['used_s'])} | {cell(s['down_s'])} |" for s in spans]  # fmt: skip
        path.with_suffix(".md").write_text(
            "## e2e: the labs' timeline (seconds from the session's start)\n\n"
            "| lab | up at | to ready | its job | held by its tests | delete |\n"
            "|---|--:|--:|--:|--:|--:|\n"
            + "\n".join(rows) + "\n")  # fmt: skip


_POOL = pytest.StashKey[LabPool]()
TIMELINE = Path("build/e2e-labs.json")  # and .md: where the labs' time went (no --junitxml)
# Labs up or coming up at once: the --lab lab and hetero (their suites alternate), and the
# next one coming up beside them.
LIVE_LABS = int(os.environ.get("GPULAB_LIVE_LABS", "3"))


@pytest.fixture(scope="session")
def labs(request: pytest.FixtureRequest) -> Iterator[LabPool]:
    """labs(name, subject=None) -> that lab, up (re-used when it already runs) and running
    `subject`; the labs come and go as LabPool says."""
    items = request.session.items
    last = last_tests(items, request.config)
    used = {f for item in items for f in getattr(item, "fixturenames", ())}
    by_lab: dict[str, list[tuple[str, Job]]] = {}
    for name, (lab, job) in LAB_JOBS.items():
        if name in used:
            by_lab.setdefault(lab, []).append((name, job))
    jobs = {lab: jobs_as_one(declared) for lab, declared in by_lab.items()}
    pool = LabPool(labs_wanted(items, request.config), last,
                   keep=request.config.getoption("--keep-lab"), live=LIVE_LABS,
                   jobs=jobs)  # fmt: skip
    request.config.stash[_POOL] = pool
    # Subprocesses by fork, not vfork, while the pool's threads run. pytest sets and unsets
    # PYTEST_CURRENT_TEST in the process environment at every test phase, in the main
    # thread, while those threads start kind, helm and docker. A vfork child execs with the
    # parent's live `environ`, which glibc reallocates under it (CPython 3.11.5+ lets other
    # threads run during the vfork): a CI run's `kind create` failed "[Errno 14] Bad
    # address" and took the dra lab's 30 tests with it; 3 threads spawning beside a loop
    # of such flips: 344 EFAULTs in 3,307 spawns by vfork, none in 1,819 by fork.
    # `_USE_VFORK` is CPython's off switch for it (python/cpython#91401). Not for a whole
    # pytest run: where gRPC is loaded (the unit tier's plugin and kubelet stand-ins), its
    # fork handlers break its servers in the parent.
    vfork = subprocess._USE_VFORK  # type: ignore[attr-defined]
    subprocess._USE_VFORK = False  # type: ignore[attr-defined]
    try:
        yield pool
        del request.config.stash[_POOL]
        pool.close()  # its deletes run kind too
    finally:
        subprocess._USE_VFORK = vfork  # type: ignore[attr-defined]
    # Beside the session's JUnit XML where it writes one (make test's e2e tiers each do,
    # and each would overwrite one shared file), else build/e2e-labs.json.
    xml = request.config.getoption("xmlpath", None)
    written = Path(xml).with_suffix(".labs.json") if xml else TIMELINE
    pool.write(written)
    request.config.stash[_TIMELINE_WRITTEN] = written.with_suffix(".md")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    pool = item.config.stash.get(_POOL, None)
    if pool is not None:
        pool.finished(item.nodeid)


@pytest.fixture(scope="session")
def lab(labs: Callable[..., Lab], subject: Subject, request: pytest.FixtureRequest) -> Lab:
    """The --lab lab (default seed) running `subject` (the suites are parametrized over
    subjects)."""
    return labs(request.config.getoption("--lab"), subject)


def namespaced_pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in the suites' own namespace on `lab`, emptied before (a run stopped
    mid-test leaves its pods on a lab the next run reuses: its first test's pod was
    "already exists") and after."""
    lab.ensure_namespace(NAMESPACE)
    p = Pods.of(lab, NAMESPACE)
    p.delete_all()  # one list where nothing was left
    yield p
    p.delete_all()


def recovering_gpus(lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """get(node) -> NodeDir: inject/recover on that node's GPUs from the host. Afterwards,
    where a GPU had a fault meanwhile, the lab heals (clusters/labs/serving.py `heal`: faulted
    GPUs recovered, what serves them restarted where it would not come back by itself,
    until its signal shows every device). A subject that says it recovers but came back
    only after a restart fails the test: the restart keeps it from spilling further."""
    since: dict[str, int] = {}

    def get(node: str) -> NodeDir:
        d = lab.fake_gpus(node)
        since.setdefault(node, len(list(d.events())))
        return d

    yield get
    if since and (healed := lab.heal(since)).restart:
        raise StepError(healed.restart)


@pytest.fixture
def fake_gpus(lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """fake_gpus(node) -> NodeDir, and the lab at full capacity again afterwards."""
    yield from recovering_gpus(lab)


@pytest.fixture
def pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in a namespace of the suite's own, emptied after each test."""
    yield from namespaced_pods(lab)
