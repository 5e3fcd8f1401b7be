"""Which cluster-tier tests run, in what order, and when their labs come and go: the
gpulab_e2e plugin's collection rules (varies_with, smoke, the by-lab order) on a throwaway
suite collected by pytest itself, and LabPool's schedule with a stand-in for bringing a
lab up (no cluster: what is checked is the order of calls)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusters.labs.lab import Lab
from e2e import fixtures

pytest_plugins = ["pytester"]

SUITE = """
import pytest

@pytest.mark.varies_with("plugin")
def test_per_program(subject): pass

@pytest.mark.varies_with()
def test_once(subject): pass

@pytest.mark.varies_with("cdi")
@pytest.mark.parametrize("n", [1, 2])
def test_per_delivery(subject, n): pass

def test_every_subject(subject): pass

@pytest.mark.smoke
def test_smoke(subject): pass
"""


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return [line for line in result.outlines if "::" in line]


def test_varies_with_keeps_the_first_subject_of_each_trait_combination(
    pytester: pytest.Pytester,
) -> None:
    ids = collected(pytester, "--subjects", "gpulab,nvidia,nvidia-cdi")
    per_program = [i for i in ids if "test_per_program" in i]
    # nvidia-cdi runs nvidia's binary: covered by nvidia.
    assert per_program == ["test_suite.py::test_per_program[gpulab]",
                           "test_suite.py::test_per_program[nvidia-v0.19.3]"]  # fmt: skip
    assert [i for i in ids if "test_once" in i] == ["test_suite.py::test_once[gpulab]"]
    # CDI delivery differs: gpulab (env) and nvidia-cdi (cdi), each parameter kept.
    delivery = sorted(i.split("[")[1] for i in ids if "test_per_delivery" in i)
    assert delivery == ["gpulab-1]", "gpulab-2]", "nvidia-cdi-v0.19.3-1]", "nvidia-cdi-v0.19.3-2]"]
    assert len([i for i in ids if "test_every_subject" in i]) == 3


def test_one_subject_keeps_every_scenario(pytester: pytest.Pytester) -> None:
    ids = collected(pytester, "--subjects", "nvidia-cdi")
    assert len(ids) == 6  # 1 + 1 + 2 + 1 + 1


def test_smoke_selects_the_marked_scenarios(pytester: pytest.Pytester) -> None:
    ids = collected(pytester, "--subjects", "gpulab,nvidia", "-m", "smoke")
    assert ids == ["test_suite.py::test_smoke[gpulab]", "test_suite.py::test_smoke[nvidia-v0.19.3]"]


UNSTATED_SUITE = """
import pytest

@pytest.mark.needs("healthcheck_env")
def test_needs_it(subject):
    raise AssertionError("ran on a guess")

@pytest.mark.needs("recovers")
def test_needs_a_stated_one(subject): pass

def test_reads_it(subject):
    assert subject.expects.lost_gpu == "that-device"

def test_reads_nothing(subject): pass
"""

SUBJECT = """
name: terse
image: {ref: example/terse:1}
daemonset: ds.yaml
device_ids: {env: TERSE_DEVICES}
expects: {recovers: true}
"""
DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: terse}
spec: {selector: {matchLabels: {app: terse}}, template: {spec: {containers: []}}}
"""


def test_a_scenario_reading_an_unstated_expectation_fails_in_one_line(
    pytester: pytest.Pytester,
) -> None:
    """Kept, not deselected; failed, not skipped; the line names the file, the key and its
    values. A need fails at setup, before any lab is brought up for it."""
    pytester.makepyfile(test_suite=UNSTATED_SUITE)
    path = pytester.path / "terse.yaml"
    path.write_text(SUBJECT)
    (pytester.path / "ds.yaml").write_text(DAEMONSET)
    result = pytester.runpytest("-p", "no:cacheprovider", "--subjects", str(path))
    result.assert_outcomes(passed=2, failed=1, errors=1)
    out = result.stdout.str()
    assert f"{path}: expects.healthcheck_env is not stated, and this scenario reads it: " \
           "state one of true (NVIDIA's switch) | {disable: VAR, off_values: [values], " \
           "codes: bool, enable: VAR} | false" in out  # fmt: skip
    assert f"{path}: expects.lost_gpu is not stated" in out
    assert "ran on a guess" not in out and "raise unstated" not in out  # no traceback


LABS_SUITE = """
import pytest
from e2e.fixtures import lab_fixture

@lab_fixture("mig")
def mig_lab(): pass

@lab_fixture("hetero")
def hetero(): pass

@pytest.fixture
def lab(): pass

def test_a_mig(mig_lab): pass
def test_b_seed(lab): pass
def test_c_free(): pass
def test_d_hetero(hetero): pass
def test_e_mig(mig_lab): pass
def test_f_seed_again(lab): pass
"""


def test_tests_of_one_lab_run_together(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_labs=LABS_SUITE)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    names = [line.split("::")[1] for line in result.outlines if "::" in line]
    # mig's tests together first; seed and hetero (one phase: their suites alternate)
    # together; a test with no lab keeps its place.
    assert names == ["test_a_mig", "test_e_mig", "test_b_seed", "test_d_hetero",
                     "test_f_seed_again", "test_c_free"]  # fmt: skip


class Item:
    """A collected test as last_tests reads it: its node id and fixtures."""

    def __init__(self, nodeid: str, *fixturenames: str) -> None:
        self.nodeid, self.fixturenames = nodeid, fixturenames


class Config:
    def getoption(self, name: str) -> str:
        return {"--lab": "seed"}[name]


def test_a_lab_held_by_a_module_fixture_is_released_after_that_modules_last_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fixtures, "LAB_FIXTURES", {"fleet": "dra", "dra_lab": "dra"})
    monkeypatch.setattr(fixtures, "MODULE_HELD", {"fleet"})
    items = [Item("a.py::one", "fleet"), Item("a.py::two", "lab"), Item("a.py::three"),
             Item("b.py::four", "dra_lab"), Item("b.py::five"),
             Item("c.py::six", "fleet"), Item("c.py::seven", "lab")]  # fmt: skip
    last = fixtures.last_tests(items, Config())  # type: ignore[arg-type]
    # dra: held by c.py's module fixture to its module's end; seed: its last user.
    assert last == {"dra": "c.py::seven", "seed": "c.py::seven"}
    last = fixtures.last_tests(items[:5], Config())  # type: ignore[arg-type]
    # A function-scoped use after the module's run ends the hold at that test.
    assert last == {"dra": "b.py::four", "seed": "a.py::two"}
    last = fixtures.last_tests(items[:3], Config())  # type: ignore[arg-type]
    assert last == {"dra": "a.py::three", "seed": "a.py::two"}


JOB_SUITE = """
import pytest
from e2e.fixtures import lab_fixture, lab_job

@lab_fixture("mig")
def mig_lab(): pass

@lab_fixture("hetero")
def hetero(): pass

@lab_fixture("stock")
def stock(): pass

@lab_job("stock", first_phase=True)
def rows(lab): pass

@pytest.fixture
def lab(): pass

def test_a_mig(mig_lab): pass
def test_b_seed(lab): pass
def test_c_rows(rows): pass
def test_d_hetero(hetero): pass
def test_e_stock(stock): pass
def test_f_free(): pass
"""


def test_a_lab_with_a_job_has_its_tests_right_after_the_first_phase(
    pytester: pytest.Pytester,
) -> None:
    """So its lab comes up beside that phase, its job runs there, and it goes soon after."""
    pytester.makepyfile(test_jobs=JOB_SUITE)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    names = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert names == ["test_a_mig", "test_b_seed", "test_d_hetero", "test_c_rows",
                     "test_e_stock", "test_f_free"]  # fmt: skip


class Recorder:
    """Stands in for bring_up/Lab.down: records the order, never starts a cluster."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def lab(self, name: str, subject: object = None) -> object:
        rec = self

        class Fake:
            def __init__(self) -> None:
                self.name = name
                self.subject = subject

            def down(self) -> None:
                with rec.lock:
                    rec.events.append(f"down {name}")

        return Fake()

    def bring_up(self, lab: object) -> object:
        with self.lock:
            self.events.append(f"up {lab.name}")  # type: ignore[attr-defined]
        return lab


def test_the_pool_keeps_at_most_live_labs_and_drops_each_after_its_last_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = Recorder()
    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)
    last = {"seed": "t2", "hetero": "t3", "mig": "t4", "dra": "t5"}
    pool = fixtures.LabPool(["seed", "hetero", "mig", "dra"], last, keep=False, live=2)
    assert set(pool.coming) == {"seed", "hetero"}  # mig waits for a place
    pool.get("seed")
    pool.finished("t1")
    assert set(pool.coming) == {"seed", "hetero"}
    pool.finished("t2")  # seed's last test: it goes, mig comes
    assert set(pool.coming) == {"seed", "hetero", "mig"}
    pool.get("mig")
    pool.finished("t3")
    assert "dra" in pool.coming
    pool.get("dra")
    pool.finished("t4")
    pool.finished("t5")
    pool.close()
    assert sorted(e for e in rec.events if e.startswith("down")) == [
        "down dra", "down hetero", "down mig", "down seed"]  # fmt: skip
    assert rec.events.count("up seed") == 1
    assert rec.events.index("down seed") > rec.events.index("up seed")


def test_a_lab_asked_again_after_its_last_test_comes_up_after_its_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lab a test asks for after the one its pool took for the last (a fixture the pool
    did not foresee) is made again only once its delete has ended: kind refuses to create
    a cluster beside the delete of one with its name."""
    rec = Recorder()
    deleting = threading.Event()
    release = threading.Event()

    def slow_down(lab: object) -> None:
        deleting.set()
        release.wait(10)
        with rec.lock:
            rec.events.append(f"down {lab.name}")  # type: ignore[attr-defined]

    def lab(name: str, subject: object = None) -> object:
        made = rec.lab(name, subject)
        made.down = lambda: slow_down(made)  # type: ignore[attr-defined]
        return made

    monkeypatch.setattr(fixtures, "Lab", lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)
    pool = fixtures.LabPool(["dra"], {"dra": "t1"}, keep=False, live=2)
    pool.get("dra")
    pool.finished("t1")
    assert deleting.wait(5)
    threading.Timer(0.3, release.set).start()
    pool.get("dra")  # asked again while the delete runs
    pool.close()
    assert rec.events[:3] == ["up dra", "down dra", "up dra"]


def test_a_kept_pool_takes_nothing_down(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)
    pool = fixtures.LabPool(["seed"], {"seed": "t1"}, keep=True, live=3)
    pool.get("seed")
    pool.finished("t1")
    pool.close()
    assert rec.events == ["up seed"]


def test_a_wait_for_a_lab_stops_the_tests_timer_and_gives_back_what_was_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bring-up runs with pytest-timeout's alarm off (this test's own, set by the
    signal method in pyproject.toml); afterwards the alarm has what it had before."""
    rec = Recorder()
    during: list[float] = []

    def slow(lab: object) -> object:
        time.sleep(0.5)
        during.append(signal.getitimer(signal.ITIMER_REAL)[0])
        return rec.bring_up(lab)

    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", slow)
    before = signal.getitimer(signal.ITIMER_REAL)[0]
    pool = fixtures.LabPool(["seed"], {"seed": "t1"}, keep=True, live=1)
    pool.get("seed")
    after = signal.getitimer(signal.ITIMER_REAL)[0]
    pool.close()
    assert before > 0  # the test's timer is there to pause
    assert during == [0.0]
    assert before - 0.2 < after <= before


def test_a_lab_that_never_comes_fails_its_test_with_its_timeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = Recorder()
    release = threading.Event()

    def stuck(lab: object) -> object:
        release.wait(10)
        return rec.bring_up(lab)

    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", stuck)
    monkeypatch.setattr(fixtures, "LAB_WAIT_S", 0.3)
    pool = fixtures.LabPool(["seed"], {"seed": "t1"}, keep=True, live=1)
    with pytest.raises(pytest.fail.Exception, match=r"^lab seed: its bring-up not over "
                       r"after 0 s \(up at 0 s\)$"):  # fmt: skip
        pool.get("seed")
    release.set()
    pool.close()


TIMELINE_SUITE = """
from e2e.fixtures import lab_fixture

class Plain:
    def down(self): pass

@lab_fixture("plain", make=Plain)
def plain(labs): return labs("plain")

def test_uses_it(plain): pass
"""


def test_the_labs_timeline_is_in_the_sessions_output(pytester: pytest.Pytester) -> None:
    """CI keeps a run's output, not its build/: a test that failed waiting for a lab has
    the lab's bring-up beside it."""
    pytester.makepyfile(test_timeline=TIMELINE_SUITE)
    xml = pytester.path / "out.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r".*gpulab e2e: the labs' timeline.*",
                                  r"\| lab \| up at \| to ready \|.*",
                                  r"\| plain \| 0 \| 0 \| — \| 0 \| 0 \|"])  # fmt: skip
    assert (pytester.path / "out.labs.md").exists()


def test_a_subject_run_leaves_gpulabs_own_suites_out() -> None:
    """`make e2e SUBJECT=mine` (`gpulab test --suites subject`): the suites that test the
    subject, not gpulab's DRA, chart-on-a-plain-cluster or experiment suites."""
    root = Path(__file__).resolve().parents[2]

    def ids(suites: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "gpulab", "test", "-q", "--collect-only",
             "--subjects", "examples/tiny-gpu-plugin/subject.yaml", "--suites", suites],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return [line for line in out.splitlines() if "::" in line]

    mine, every = ids("subject"), ids("all")
    assert mine and all("[tiny-gpu-plugin" in i for i in mine)
    assert any(i.startswith("e2e/test_dra.py") for i in every)
    assert set(mine) < set(every)


HEAL_SUITE = """
import pytest
from clusters.labs.lab import Lab


@pytest.fixture
def lab():
    return Lab("seed", subject="gpulab")


def test_a_fails(lab):
    assert False


def test_b_passes(lab):
    pass
"""


def test_a_failed_scenario_leaves_fresh_plugin_pods_for_the_next(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Patched from here, not in the suite: the suite runs in this process (an xdist
    # worker), and a class attribute it set stayed set for the files after it there (CI:
    # test_lab.py's restart test then restarted nothing).
    calls: list[str] = []
    monkeypatch.setattr(Lab, "restart_plugin", lambda self: calls.append(self.name))
    pytester.makepyfile(test_heal=HEAL_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert calls == ["seed"]


def test_the_pool_writes_each_labs_bring_up_use_and_delete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """build/e2e-labs.json and .md: per bring-up, when it began, its seconds to ready, how
    long its tests held it and its delete's seconds; a failed bring-up says so."""
    rec = Recorder()

    def bring_up(lab: object) -> object:
        time.sleep(0.2)
        if lab.name == "broken":  # type: ignore[attr-defined]
            raise RuntimeError("kind create failed")
        return rec.bring_up(lab)

    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", bring_up)
    pool = fixtures.LabPool(["seed", "broken"], {"seed": "t1", "broken": "t2", "never": "t0"},
                            keep=False, live=2)  # fmt: skip
    pool.finished("t0")  # a lab whose last test ran without it: nothing to record
    pool.get("seed")
    time.sleep(0.3)
    pool.finished("t1")
    with pytest.raises(RuntimeError):
        pool.get("broken")
    pool.finished("t2")
    pool.close()
    pool.write(tmp_path / "labs.json")
    spans = {s["lab"]: s for s in json.loads((tmp_path / "labs.json").read_text())["labs"]}
    seed, broken = spans["seed"], spans["broken"]
    assert seed["up_s"] >= 0.2 and seed["used_s"] >= 0.3 and seed["down_s"] is not None
    assert broken["failed"] and broken["up_s"] is None and broken["down_s"] is None
    table = (tmp_path / "labs.md").read_text()
    assert "| seed | 0 |" in table and "| broken |" in table and "—" in table


def test_a_labs_job_runs_once_it_is_up_and_its_tests_get_the_lab_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rec = Recorder()
    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)

    def job(lab: object) -> int:
        with rec.lock:
            rec.events.append(f"job on {lab.name}")  # type: ignore[attr-defined]
        time.sleep(0.3)
        with rec.lock:
            rec.events.append("job done")
        return 42

    pool = fixtures.LabPool(
        ["stock"], {"stock": "t2"}, keep=False, live=2, jobs={"stock": fixtures.Job(job)}
    )
    pool.get("stock")  # a test of the lab's own: after the job
    assert rec.events == ["up stock", "job on stock", "job done"]
    assert pool.job_result("stock") == 42
    pool.finished("t2")
    pool.close()
    assert rec.events[-1] == "down stock"
    pool.write(tmp_path / "labs.json")
    span = json.loads((tmp_path / "labs.json").read_text())["labs"][0]
    assert span["job_s"] >= 0.3


def test_a_labs_jobs_run_in_turn_and_one_failing_does_not_stop_the_next() -> None:
    """The dra-mig lab has its wide-node job and could have an experiment beside it: the
    pool runs them as one, in the order declared, each result under its own name."""
    ran: list[str] = []

    def first(lab: object) -> None:
        ran.append("first")
        raise RuntimeError("the first failed")

    def second(lab: object) -> int:
        ran.append("second")
        return 7

    one = fixtures.jobs_as_one([("first", fixtures.Job(first)),
                                ("second", fixtures.Job(second, first_phase=True))])  # fmt: skip
    assert one.first_phase  # the lab comes up early if any of its jobs wants it
    out = one.run(object())  # type: ignore[arg-type]
    assert ran == ["first", "second"]
    assert out["second"] == 7
    assert isinstance(out["first"].error, RuntimeError)


def test_a_jobs_failure_is_its_results(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)

    def job(lab: object) -> None:
        raise RuntimeError("bats failed")

    pool = fixtures.LabPool(
        ["stock"], {"stock": "t1"}, keep=False, live=2, jobs={"stock": fixtures.Job(job)}
    )
    pool.get("stock")  # the lab is still the lab's tests'
    with pytest.raises(RuntimeError, match="bats failed"):
        pool.job_result("stock")
    pool.finished("t1")
    pool.close()


def test_a_cluster_of_no_lab_spec_is_made_and_deleted_by_its_maker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chart's plain cluster: the pool brings it up beside other suites as a lab."""
    rec = Recorder()
    monkeypatch.setitem(fixtures.CLUSTER_MAKERS, "plain", lambda: rec.bring_up(rec.lab("plain")))
    monkeypatch.setattr(fixtures, "bring_up", lambda lab: pytest.fail("no lab spec to bring up"))
    pool = fixtures.LabPool(["plain"], {"plain": "t1"}, keep=False, live=2)
    assert pool("plain").name == "plain"
    pool.finished("t1")
    pool.close()
    assert rec.events == ["up plain", "down plain"]


def test_a_lab_whose_job_is_over_gives_its_place_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stock lab waits for its tests after its job, idle: the next lab comes up then,
    not only after the stock lab's last test."""
    rec = Recorder()
    monkeypatch.setattr(fixtures, "Lab", rec.lab)
    monkeypatch.setattr(fixtures, "bring_up", rec.bring_up)
    done = threading.Event()
    last = {"seed": "t2", "stock": "t3", "mig": "t4"}
    job = fixtures.Job(lambda lab: done.wait(10), first_phase=True)
    pool = fixtures.LabPool(["seed", "stock", "mig"], last, keep=False, live=2,
                            jobs={"stock": job})  # fmt: skip
    pool.get("seed")
    pool.coming["stock"].result(timeout=10)  # up, its job started
    pool.finished("t0")
    assert "mig" not in pool.coming  # the job still runs: its lab holds its place
    done.set()
    pool.running["stock"].result(timeout=10)
    pool.finished("t1")
    assert "mig" in pool.coming
    for t in ("t2", "t3", "t4"):
        pool.finished(t)
    pool.close()


ORDER_SUITE = """
import pytest
from e2e.fixtures import lab_fixture, lab_job

@lab_fixture("mig")
def mig_lab(): pass

@lab_fixture("hetero")
def hetero(): pass

@lab_job("stock"{first_phase})
def rows(lab): pass

@pytest.fixture
def lab(): pass

def test_a_seed(lab): pass
def test_b_mig(mig_lab): pass
def test_c_rows(rows): pass
def test_d_hetero(hetero): pass
"""


@pytest.mark.parametrize(("first_phase", "order"), [
    (", first_phase=True", ["test_a_seed", "test_d_hetero", "test_c_rows", "test_b_mig"]),
    ("", ["test_a_seed", "test_d_hetero", "test_b_mig", "test_c_rows"]),
])  # fmt: skip
def test_only_a_first_phase_jobs_lab_has_its_tests_moved_up(
    pytester: pytest.Pytester, first_phase: str, order: list[str]
) -> None:
    """A job of minutes (NVIDIA's DRA suite) has its lab's tests right after the first
    phase; a shorter one (a DRA lab's experiment) runs when its lab comes up in its turn."""
    pytester.makepyfile(test_jobs=ORDER_SUITE.format(first_phase=first_phase))
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == order


SHARE_SUITE = """
import pytest

def test_counts_gpus(subject): pass

@pytest.mark.needs("shares_memory")
def test_counts_memory(subject): pass
"""


def test_a_sharing_subject_runs_the_sharing_scenarios_and_no_other(
    pytester: pytest.Pytester,
) -> None:
    """Its devices are units of memory: the scenarios that count GPUs are not its own, and
    those that need `shares_memory` are no one else's (deselected, never skipped)."""
    pytester.makepyfile(test_suite=SHARE_SUITE)
    share = Path(__file__).resolve().parents[2] / "examples/gpu-mem-share/subject.yaml"
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                "--subjects", f"gpulab,{share}")  # fmt: skip
    ids = [line for line in result.outlines if "::" in line]
    assert ids == ["test_suite.py::test_counts_gpus[gpulab]",
                   "test_suite.py::test_counts_memory[gpu-mem-share]"]  # fmt: skip
