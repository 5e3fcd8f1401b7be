"""pytest fixtures for cluster-tier suites (the `gpulab_e2e` pytest11 plugin), usable by
any project that wants to test its own plugin in a gpulab lab:

    def test_gpu_pod(lab, pods, fake_gpus): ...

Options: --lab NAME (default seed), --plugins gpulab,nvidia (the suites run once per
plugin), --keep-lab (leave the cluster up; `make e2e KEEP=1`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from clusters.infra import InfraMissing
from clusters.lab import Lab
from e2e.pods import Pods
from fakenvml.node import NodeDir

NAMESPACE = "gpulab-e2e"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gpulab-e2e")
    g.addoption("--lab", default=os.environ.get("GPULAB_LAB", "seed"))
    g.addoption(
        "--plugins",
        dest="gpulab_plugins",
        default=os.environ.get("GPULAB_PLUGINS", "gpulab,nvidia"),
    )
    g.addoption("--keep-lab", action="store_true", default=bool(os.environ.get("KEEP")))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "plugins(*names): run only for these plugins (features others lack)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    own = any(
        "plugin" in str(m.args[0]).replace(" ", "").split(",")
        for m in metafunc.definition.iter_markers("parametrize")
    )
    if "plugin" in metafunc.fixturenames and not own:  # a test may parametrize it itself
        plugins = metafunc.config.getoption("gpulab_plugins").split(",")
        metafunc.parametrize("plugin", plugins, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked plugins(...) are not generated for other plugins (deselected, never
    skipped: a scenario that a plugin cannot have is not a scenario for it)."""
    keep, drop = [], []
    for item in items:
        only = item.get_closest_marker("plugins")
        param = getattr(getattr(item, "callspec", None), "params", {}).get("plugin")
        (drop if only and param is not None and param not in only.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def summary_key(nodeid: str, plugins: list[str]) -> tuple[str, str] | None:
    """('scenario [other params]', plugin) for an e2e test id, or None."""
    if "[" not in nodeid or not nodeid.startswith("e2e/"):
        return None
    base, param = nodeid.rstrip("]").split("[", 1)
    tokens = param.split("-")
    plugin = next((t for t in reversed(tokens) if t in plugins), None)
    if plugin is None:
        return None
    tokens.remove(plugin)
    name = base.split("::")[-1] + (f" [{'-'.join(tokens)}]" if tokens else "")
    return name, plugin


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A table a person reads at a glance: scenario x plugin -> result and seconds."""
    plugins = terminalreporter.config.getoption("gpulab_plugins").split(",")
    rows: dict[str, dict[str, str]] = {}
    for outcome in ("passed", "failed", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if rep.when != "call" and outcome != "error":
                continue
            key = summary_key(rep.nodeid, plugins)
            if key is None:
                continue
            mark = "PASS" if outcome == "passed" else "FAIL"
            rows.setdefault(key[0], {})[key[1]] = f"{mark} {rep.duration:5.1f}s"
    if not rows:
        return
    tr = terminalreporter
    tr.section("gpulab e2e: scenario x plugin")
    width = max(len(r) for r in rows)
    tr.write_line(f"{'scenario':<{width}}  " + "  ".join(f"{p:<12}" for p in plugins))
    for name, results in rows.items():
        cells = "  ".join(f"{results.get(p, '-'):<12}" for p in plugins)
        tr.write_line(f"{name:<{width}}  {cells}")


def bring_up(lab: Lab) -> Lab:
    """lab.up(), or a one-line failure naming `make infra` when infrastructure is missing
    (fixtures never build it: no test timeout may wrap a build)."""
    try:
        return lab.up()
    except InfraMissing as e:
        pytest.fail(str(e), pytrace=False)


# Fixtures that stand for a lab, and which lab: `lab` is the --lab one.
LAB_FIXTURES = {"hetero": "hetero"}


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
    """labs(name, plugin=None) -> that lab, up (re-used when it already runs) and running
    `plugin`. Every lab the selected tests use starts coming up at once, side by side
    (kind create and image loads mostly wait: two labs take little longer than one); each
    comes up once per session and goes down at the end unless --keep-lab."""
    wanted = labs_wanted(request.session.items, request.config)
    pool = ThreadPoolExecutor(max_workers=max(len(wanted), 1))
    coming: dict[str, Future[Lab]] = {n: pool.submit(bring_up, Lab(n)) for n in wanted}

    def get(name: str, plugin: str | None = None) -> Lab:
        if name not in coming:
            coming[name] = pool.submit(bring_up, Lab(name, plugin=plugin))
        lab = coming[name].result()
        if plugin is not None and lab.plugin != plugin:
            lab.use_plugin(plugin)
        return lab

    yield get
    up = [f.result() for f in coming.values() if f.done() and not f.exception()]
    pool.shutdown()
    if not request.config.getoption("--keep-lab"):
        # One after the other: concurrent `kind delete`s race on ~/.kube/config.lock.
        for lab in up:
            lab.down()


@pytest.fixture(scope="session")
def lab(labs: Callable[..., Lab], plugin: str, request: pytest.FixtureRequest) -> Lab:
    """The --lab lab (default seed) running `plugin` (the suites are parametrized over
    plugins)."""
    return labs(request.config.getoption("--lab"), plugin)


def namespaced_pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in the suites' own namespace on `lab`, emptied afterwards."""
    lab.ensure_namespace(NAMESPACE)
    p = Pods(lab.core, NAMESPACE, lab.images["workload"])
    yield p
    p.delete_all()


@pytest.fixture
def fake_gpus(lab: Lab) -> Iterator[Callable[[str], NodeDir]]:
    """fake_gpus(node) -> NodeDir: inject/recover on that node's GPUs from the host.
    Afterwards every GPU faulted during the test is recovered, and a plugin that does not
    recover by itself (NVIDIA's) is restarted, so the next test starts at full capacity."""
    touched: dict[str, tuple[NodeDir, int]] = {}

    def get(node: str) -> NodeDir:
        d = lab.fake_gpus(node)
        touched.setdefault(node, (d, len(list(d.events()))))
        return d

    yield get
    faulted = False
    for d, start in touched.values():
        for gpu in sorted({r.gpu for r in d.events(start)}):
            d.recover(gpu)
            faulted = True
    if faulted:
        if lab.plugin == "nvidia":
            lab.restart_plugin()
        lab.wait_capacity()


@pytest.fixture
def pods(lab: Lab) -> Iterator[Pods]:
    """Pod helpers in a namespace of the suite's own, emptied after each test."""
    yield from namespaced_pods(lab)
