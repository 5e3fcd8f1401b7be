"""NVIDIA's DRA driver's own test suite run against a gpulab lab: the bats files of the
driver's Go module (tests/bats), those of its `tests-mock-nvml` target (the tests meant for
CPU-only nodes and a mock NVML), each installing the driver from the module's own chart as
upstream's CI does, on the `stock` lab's fake GPUs (clusters/labs/stock.yaml).

The suite runs unchanged, from the module. What gpulab supplies where upstream's runner has
a registry and the internet (docs/dra-driver.md, "The driver's own suite"):
- the runner: the `bats` image (clusters/infra/images/build.sh), as the suite's Dockerfile makes
  it (bats-core, its three libraries at /bats-libraries, jq, yq, kubectl, helm);
- the chart: the module's, its image values pointed at the driver image `make infra`
  built (the suite's `TEST_CHART_LOCAL` way, whose images must be on the nodes already);
- the image the suite's pods name (a shell, `nvidia-smi -L`, `sleep`; nvidia-smi and NVML
  come from the driver root through the driver's CDI spec): gpulab's Debian base image,
  loaded into the nodes under the names the suite uses;
- its setup_suite: the suite's own prerequisite checks (`validate_prerequisites`, sourced
  from its file), without `helm repo add` of NVIDIA's chart repository, which an offline
  machine cannot reach and no file run here installs from;
- the suite's own switches: MOCK_NVML=true (it skips what needs CUDA, MPS daemons, NVLink
  or IMEX and says why), TEST_ALT_PROC_DEVICES (the driver root's proc/devices, with the
  IMEX channels' major the compute-domain plugin reads), SKIP_CLEANUP=true (a lab made for
  the run); compute domains on, as the target runs them (the image has the controller and
  the compute-domain kubelet plugin; the IMEX daemon's tests skip under MOCK_NVML);
- the worker role on the lab's one node while the suite runs (WORKER_ROLE).

Every file of the target runs, and the module's two MIG files. Every test's result is a
row: passed, skipped by the suite (its reason), or failed, with the cause where known.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
import yaml
from rich.console import Console
from rich.table import Table

from clusters import built
from clusters.charts import chart
from clusters.labs import dra, fakegpus, kindconfig
from clusters.labs.lab import Lab
from fakenvml import docblock

LAB = "stock"  # shared with e2e/test_stock.py, which runs after (clusters/labs/stock.yaml)
TARGET = "tests-mock-nvml"  # the suite's Makefile target for CPU-only nodes and a mock NVML
SUITE_DIR = "tests/bats"
# The suite's CI sets these so (its Makefile, CI branch): 20 pods sharing one claim, once.
STRESS = {"TEST_GPU_STRESS_PODS_N": "20", "TEST_GPU_STRESS_ITERATIONS": "1",
          "TEST_GPU_STRESS_DELAY": "1"}  # fmt: skip
# The module's MIG files, which the target leaves out ("MIG hardware"): gpulab's fake GPUs
# have MIG, so they are candidates here too.
MIG_FILES = ("tests/bats/test_gpu_mig.bats", "tests/bats/test_gpu_dynmig.bats")
# Files of the candidates not run here, and why (docs/dra-driver.md, "The driver's own
# suite"). A file the suite adds must be run or get its row here. Not run: the files of
# which the suite skips every test under MOCK_NVML (each test's first line; `all_skip`
# checks it against the pinned module): run, each only installed the chart and skipped
# (5-7 s apiece, 35 s of every CI run, 2026-11-28); the files that do run install it the
# same way, compute domains on.
ALL_SKIP = "the suite skips each of its tests under MOCK_NVML (each test's first line)"
NOT_RUN: dict[str, str] = dict.fromkeys(
    ("test_gpu_updowngrade.bats", "test_cd_imex_chan_inject.bats", "test_cd_misc.bats",
     "test_cd_logging.bats", "test_cd_failover.bats", "test_cd_mnnvl_workload.bats",
     "test_cd_updowngrade.bats"), ALL_SKIP)  # fmt: skip
# The static-MIG file picks its node by `kubectl get nodes | grep worker | head -n1`: a
# worker's name or its role in the ROLES column. The stock lab is one control-plane node
# (the robustness file counts the whole cluster's devices against one node's GPUs) that
# runs every workload, i.e. a worker too: it carries the role while the suite runs. The
# kubelet may not set node-role labels itself (NodeRestriction), so the lab's admin does.
WORKER_ROLE = "node-role.kubernetes.io/worker"


@dataclass(frozen=True)
class Explained:
    where: str  # what the failure's text must say (where it failed)
    why: str


# Failures whose cause is known, by (file, test), with the evidence in docs/dra-driver.md.
# A failure counts as explained only where it fails where the evidence says: a new failure
# of the same test is never one of these by accident.
NO_1G_PROFILE = Explained(
    "mig_create_1g0_on_node",
    "the suite's assumption: it picks GPU 0's first 1g profile with `grep -oE "
    "'1g\\.[1-9]+gb'`, which matches no profile of an H100 80GB (`nvidia-smi mig -lgip`: "
    "1g.10gb, 1g.20gb), the stock lab's board; a real H100 80GB answers the same",
)
EXPLAINED: dict[tuple[str, str], Explained] = {
    ("test_gpu_mig.bats", "StaticMIG: allocate (1 cnt)"): NO_1G_PROFILE,
    ("test_gpu_mig.bats", "StaticMIG: inspect device attributes in resource slice (mig)"):
        NO_1G_PROFILE,
    ("test_gpu_mig.bats", "StaticMIG: mutual exclusivity with physical GPU"): NO_1G_PROFILE,
}  # fmt: skip

# What the suite runs on a node's GPUs, `nvmm <node hint|all> <command...>` (its lib/nvmm:
# `kubectl exec` into the GPU operator's mig-manager pod on the node, where the driver's
# nvidia-smi runs; helpers.sh puts $NVMM_PATH first in PATH, as upstream's single-node CI
# does with its own). gpulab's runs it in the node's fakenvml pod (the fake-gpus chart),
# with the node's driver root: NVIDIA's nvidia-smi and the node's libnvidia-ml. "all": each
# node's output after a `-- <node>` line, as upstream's.
NVMM = f"""#!/usr/bin/env bash
# gpulab's nvmm (e2e/dra_suite.py): nvidia-smi and the like in the node's fakenvml pod.
set -o errexit -o nounset -o pipefail
hint=${{1:?usage: nvmm <node-hint> [command...]}}
shift
root={kindconfig.DRIVER_ROOT}
kubectl -n {fakegpus.NAMESPACE} get pods -l app.kubernetes.io/name=fakenvml \\
    -o jsonpath='{{range .items[*]}}{{.spec.nodeName}} {{.metadata.name}}{{"\\n"}}{{end}}' |
  while read -r node pod; do
    if [ "$hint" = all ]; then
      echo "-- $node"
    elif [[ "$node" != *"$hint"* ]]; then
      continue
    fi
    kubectl -n {fakegpus.NAMESPACE} exec "$pod" -c fakenvml -- env \\
      PATH="$root/usr/bin:/usr/local/bin:/usr/bin:/bin" \\
      LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu" "$@" </dev/null
  done
"""

# The release the suite installs and the namespace it creates (its helpers.sh).
RELEASE, NAMESPACE = "dra-driver-nvidia-gpu-batssuite", "dra-driver-nvidia-gpu"

SETUP_SUITE = """\
# gpulab's setup_suite for the DRA driver's suite (e2e/dra_suite.py): the suite's own
# prerequisite checks, without `helm repo add` of NVIDIA's chart repository (offline; no
# file run here installs from it).
source /cwd/tests/bats/setup_suite.bash
setup_suite() {
    validate_prerequisites
    HELM_CACHE_HOME=$(mktemp -d -t helm-XXXXX)
    export HELM_CACHE_HOME
    export HELM_REPOSITORY_CONFIG=${HELM_CACHE_HOME}/repo.cfg
}
"""


@dataclass(frozen=True)
class Row:
    file: str  # the .bats file's name
    test: str
    result: str  # passed, skipped, failed, not run
    seconds: float
    why: str = ""  # a skip's reason (the suite's), a failure's cause or first line
    # Ran twice (retry_unexplained): the first run's cause. `why` is the last run's, which
    # is what explains a failure and what the docs show; the run's report shows both.
    retried: str = ""

    @property
    def explained(self) -> bool:
        known = EXPLAINED.get((self.file, self.test))
        return self.result != "failed" or (known is not None and self.why == known.why)


def module_dir() -> Path:
    where = chart.module_dir(f"{dra.MODULE}@{dra.version()}")
    if not (where / SUITE_DIR / "Makefile").is_file():
        raise built.InfraMissing(f"the DRA driver's suite is not in {where}; {built.MAKE_INFRA}")
    return where


def target_files(src: Path, target: str = TARGET) -> list[str]:
    """The .bats files (tests/bats/...) the suite's Makefile target runs, in its order."""
    text = (src / SUITE_DIR / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:(?!.*:=).*\n((?:\t.*\n)+)", text, re.M)
    if m is None:
        raise ValueError(f"the suite's Makefile has no target {target}")
    return re.findall(r"tests/bats/test_\w+\.bats", m.group(1))


def candidates(src: Path) -> list[str]:
    """The files gpulab considers: the target's, then the module's MIG files."""
    return target_files(src) + [f for f in MIG_FILES if (src / f).is_file()]


def all_skip(text: str) -> bool:
    """Whether a .bats file's every test starts (past comments) with the suite's
    `if [ "${MOCK_NVML:-}" = "true" ]; then skip ...` line."""
    tests = re.findall(r"^@test [^\n]*\{\n((?:[ \t]*(?:#[^\n]*)?\n)*)([^\n]*)", text, re.M)
    return bool(tests) and all(
        re.match(r'\s*if \[ "\$\{MOCK_NVML:-\}" = "true" \]; then skip ', first)
        for _, first in tests
    )


def runnable(files: list[str]) -> list[str]:
    return [f for f in files if Path(f).name not in NOT_RUN]


def prepare(work: Path, src: Path, image: str) -> str:
    """The suite's tree in `work` (what the runner sees as /cwd): its tests/bats, the chart
    with its image values set to `image`, gpulab's setup_suite. The chart's version."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(src / SUITE_DIR, work / SUITE_DIR)
    shutil.copytree(src / dra.CHART_DIR, work / "chart")
    values_path = work / "chart" / "values.yaml"
    values = yaml.safe_load(values_path.read_text())
    repo, tag = chart.split_image(image)
    values["image"] = {**values.get("image", {}), "repository": repo, "tag": tag,
                       "pullPolicy": "IfNotPresent"}  # fmt: skip
    values_path.write_text(yaml.safe_dump(values, sort_keys=False))
    (work / "setup_suite.bash").write_text(SETUP_SUITE)
    nvmm = work / "gpulab-bin" / "nvmm"
    nvmm.parent.mkdir()
    nvmm.write_text(NVMM)
    nvmm.chmod(0o755)
    for p in work.rglob("*"):  # the module cache's files are read-only
        p.chmod(p.stat().st_mode | 0o200)
    return str(yaml.safe_load((work / "chart" / "Chart.yaml").read_text())["version"])


def pod_images(work: Path, files: list[str]) -> set[str]:
    """The images the files' pods name (inline and in the specs they apply)."""
    texts = [(work / f).read_text() for f in files]
    specs = {s for t in texts for s in re.findall(r"tests/bats/specs/[\w./-]+\.yaml", t)}
    texts += [(work / s).read_text() for s in sorted(specs) if (work / s).is_file()]
    found = {m for t in texts for m in re.findall(r"^\s*-?\s*image:\s*[\"']?([^\s\"'$]+)", t, re.M)}
    return {i for i in found if not i.startswith("{")}


def load_as(lab: Lab, image: str, names: set[str]) -> None:
    """`image` into every lab node under each of `names` (for a name the host's engine
    already has, that image). A tag this call made goes again afterwards."""
    engine = docker.from_env()
    made = []
    for name in sorted(names):
        try:
            engine.images.get(name)
        except docker.errors.ImageNotFound:
            engine.images.get(image).tag(name)
            made.append(name)
    try:
        lab.host.load(sorted(names), [n.name for n in lab.lab.nodes])
    finally:
        for name in made:
            engine.images.remove(name, noprune=True)


def clean(lab: Lab) -> None:
    """What a run leaves (the suite's own cleanup script needs the internet): its release,
    its kubelet plugin pods gone (helm's --wait ends with them still Terminating), and the
    pods and claims of the lab's default namespace, made by the suite alone."""
    chart.run(built.helm(), ["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait",
                             "--ignore-not-found"], lab.kubeconfig)  # fmt: skip
    lab.kube.wait_pods_gone(NAMESPACE, dra.POD_LABELS, "the suite's kubelet plugin", 120)
    lab.core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    dra.delete_claims(lab, "default")


def worker_role(lab: Lab, on: bool) -> None:
    """The worker role (WORKER_ROLE) on each node whose name does not say worker, or off."""
    for node in lab.lab.nodes:
        if "worker" not in node.name:
            labels = {WORKER_ROLE: "" if on else None}
            lab.core.patch_node(node.name, {"metadata": {"labels": labels}})


def environment(chart_version: str) -> dict[str, str]:
    return {
        "KUBECONFIG": "/kubeconfig",
        "TEST_CHART_REPO": "/cwd/chart",
        "TEST_CHART_VERSION": chart_version,
        "TEST_NVIDIA_DRIVER_ROOT": kindconfig.DRIVER_ROOT,
        # The suite's switch for a mock NVML's /proc/devices (the chart's altProcDevices):
        # the driver root's, with the IMEX channels' major the compute-domain plugin needs.
        "TEST_ALT_PROC_DEVICES": f"{kindconfig.DRIVER_ROOT}/proc/devices",
        "TEST_EXPECTED_IMAGE_SPEC_SUBSTRING": dra.version(),
        "MOCK_NVML": "true",
        "SKIP_CLEANUP": "true",
        "NVMM_PATH": "/cwd/gpulab-bin",
        **STRESS,
    }


def run(lab: Lab, out: Path, console: Console, files: list[str] | None = None) -> list[Row]:
    """The suite's GPU files of its mock-NVML target (or `files`) against `lab`; the rows
    (also out/report.json and out/report.md) and bats' own output in out/bats.log.

    A test that fails for no known cause runs once more, alone, after a clean: the suite
    reads a pod's log as soon as the pod is Ready, which on a busy machine can come before
    the line its nvidia-smi prints (seen once in three runs here, under load: "pod with two
    ResourceClaimTemplates" read an empty log 1 s after creation, and its claims, left
    behind, failed the next test; 26 quiet repetitions of that pod found the line 60-100
    ms after Ready every time). Its row says it was retried and why it failed first."""
    src = module_dir()
    every = candidates(src)
    files = files if files is not None else runnable(every)
    images = built.require(["base", "dra", "bats"], lab.lab.kubernetes).images
    out = out.resolve()  # the engine's bind mounts want absolute paths
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    chart_version = prepare(work, src, images["dra"])
    clean(lab)
    lab.host.load([images["dra"]], [n.name for n in lab.lab.nodes])
    load_as(lab, images["base"], pod_images(work, files))
    console.print(f"[bold]NVIDIA's DRA driver {dra.version()}: its own suite[/] "
                  f"({TARGET}'s GPU files: {', '.join(Path(f).stem for f in files)})")  # fmt: skip
    t0 = time.monotonic()
    log = out / "bats.log"
    log.write_text("")
    rows: list[Row] = []
    worker_role(lab, True)
    try:
        # A file at a time, each from a clean lab: a file whose setup_file uninstalls the
        # release and installs it anew (the DynamicMIG file) waited, in the suite's own
        # helper, on the previous file's kubelet plugin pod, still Terminating under load,
        # and failed when it went ("pods ... not found"; CI, 2026-11-27).
        for f in files:
            clean(lab)
            rows += bats(images["bats"], work, out / f"junit-{Path(f).stem}", lab,
                         chart_version, [f], [], console)  # fmt: skip
        rows = retry_unexplained(rows, images["bats"], work, out, lab, chart_version, files,
                                 console)  # fmt: skip
    finally:
        clean(lab)
        worker_role(lab, False)
    rows += [Row(Path(f).name, "(whole file)", "not run", 0, NOT_RUN[Path(f).name])
             for f in every if f not in files]  # fmt: skip
    write(out, rows, time.monotonic() - t0)
    return rows


def retry_unexplained(rows: list[Row], image: str, work: Path, out: Path, lab: Lab,
                      chart_version: str, files: list[str],
                      console: Console) -> list[Row]:  # fmt: skip
    """Each test that failed for no known cause once more, alone, after a clean; a file
    whose setup_file failed (none of its tests ran) once more whole. The rows say it, each
    where its first run's row stood: the docs' table is the suite's order whatever was
    retried (CI, 2026-12-06: a retried first test moved to its file's end, and the docs'
    table no longer matched)."""
    again = [i for i, r in enumerate(rows) if not r.explained]
    if not again:
        return rows
    console.print(f"[yellow]![/] {len(again)} failed for no known cause: once more, alone")
    instead: dict[int, list[Row]] = {}
    for f in files:
        name = Path(f).name
        mine = [i for i in again if rows[i].file == name]
        if not mine:
            continue
        clean(lab)
        whole = any(rows[i].test == SETUP_FAILED for i in mine)
        extra = [] if whole else [
            "--filter", "|".join(f"^{re.escape(rows[i].test)}$" for i in mine)]  # fmt: skip
        retried = bats(image, work, out / f"junit-retry-{Path(f).stem}", lab, chart_version,
                       [f], extra, console)  # fmt: skip
        if whole:
            first = next(i for i in mine if rows[i].test == SETUP_FAILED)
            instead |= {i: [] for i in mine}
            instead[first] = [retry_row(rows[first], r) for r in retried]
        else:
            second = {r.test: r for r in retried}
            instead |= {i: [retry_row(rows[i], second.get(rows[i].test))] for i in mine}
    return [r for i, row in enumerate(rows) for r in instead.get(i, [row])]


def retry_row(first: Row, second: Row | None) -> Row:
    """The second run's row, which says the first run's cause. A retry that ends in a
    known failure is that failure (CI, 2026-12-04: the static-MIG file's first run read
    its ResourceSlice before the reinstalled driver had published one, its second ended
    in the suite's profile pattern)."""
    if second is None:
        return first
    return Row(second.file, second.test, second.result, first.seconds + second.seconds,
               second.why, retried=first.why or first.result)  # fmt: skip


def run_why(r: Row) -> str:
    """A row's cause as the run's report says it: a retried one's first cause too."""
    if not r.retried:
        return r.why
    return f"retried; first: {r.retried}" + (f"; then: {r.why}" if r.why else "")


def bats(image: str, work: Path, report: Path, lab: Lab, chart_version: str, files: list[str],
         extra: list[str], console: Console) -> list[Row]:  # fmt: skip
    """One bats run in the runner image; its rows (JUnit in `report`), its output appended
    to bats.log beside `report`."""
    if report.exists():
        shutil.rmtree(report)
    report.mkdir()
    cmd = ["bats", "--setup-suite-file", "/cwd/setup_suite.bash", "--timing",
           "--print-output-on-failure", "--formatter", "tap", "--report-formatter", "junit",
           "--output", "/report", *extra, *files]  # fmt: skip
    container = docker.from_env().containers.run(
        image, cmd, detach=True, network_mode="host", working_dir="/cwd",
        environment=environment(chart_version),
        volumes={str(work): {"bind": "/cwd", "mode": "rw"},
                 str(report): {"bind": "/report", "mode": "rw"},
                 str(lab.kubeconfig): {"bind": "/kubeconfig", "mode": "ro"}},
    )  # fmt: skip
    try:
        with (report.parent / "bats.log").open("a") as log:
            buf = ""
            for chunk in container.logs(stream=True, follow=True):
                buf += chunk.decode(errors="replace")
                *lines, buf = buf.split("\n")
                for line in lines:
                    log.write(line + "\n")
                    log.flush()
                    progress(console, line)
        status = container.wait()["StatusCode"]
    finally:
        container.remove(force=True)
    rows = rows_of(report, files)
    if not rows:
        raise RuntimeError(
            f"the suite ran no test (bats exited {status}); see {report.parent}/bats.log"
        )
    return rows


_TAP = re.compile(r"^(ok|not ok) \d+ (.*?)(?: # skip ?\(?(.*?)\)?)?(?: # in (\d+) ?ms)?$")


def progress(console: Console, line: str) -> None:
    """One line per finished test, as bats' TAP stream reports it."""
    m = _TAP.match(line)
    if not m:
        return
    ok, name, skip, ms = m.groups()
    secs = f" [dim]({int(ms) / 1000:.1f}s)[/]" if ms else ""
    if skip is not None:
        console.print(f"  [yellow]-[/] {name}{secs} [dim]skipped: {skip}[/]", highlight=False)
    elif ok == "ok":
        console.print(f"  [green]✓[/] {name}{secs}", highlight=False)
    else:
        console.print(f"  [red]✗[/] {name}{secs}", highlight=False)


SETUP_FAILED = "setup_file failed"  # bats' test name for a file whose setup_file failed
_SETUP_FILE = re.compile(r"in test file (\S+\.bats)")


def rows_of(report: Path, files: list[str]) -> list[Row]:
    """The rows of bats' JUnit report (one testsuite per file). A failed setup_file is
    reported under bats' `setup_suite`: its row goes to the file its message names."""
    rows = []
    for xml in sorted(report.glob("*.xml")):
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            name = Path(suite.get("name", "")).name
            for case in suite.iter("testcase"):
                test, secs = case.get("name", ""), float(case.get("time") or 0)
                skipped, failure = case.find("skipped"), case.find("failure")
                if failure is not None and test == SETUP_FAILED:
                    m = _SETUP_FILE.search(failure.text or "")
                    file = Path(m.group(1)).name if m else name
                    rows.append(Row(file, test, "failed", secs, failed_line(failure.text or "")))
                elif failure is not None:
                    known = EXPLAINED.get((name, test))
                    text = failure.text or ""
                    why = known.why if known and known.where in text else failed_line(text)
                    rows.append(Row(name, test, "failed", secs, why))
                elif skipped is not None:
                    why = skipped.get("message") or (skipped.text or "").strip()
                    rows.append(Row(name, test, "skipped", secs, why))
                else:
                    rows.append(Row(name, test, "passed", secs))
    order = {Path(f).name: i for i, f in enumerate(files)}
    return sorted(rows, key=lambda r: order.get(r.file, len(order)))


def failed_line(text: str) -> str:
    """The suite's own words for a failure: bats' "`command' failed" line, else the first
    line that is not its tags."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    failed = [line for line in lines if line.endswith("failed") and line.startswith("`")]
    rest = [line for line in lines if not line.startswith("tags:")]
    return (failed or rest or [""])[0]


def counts(rows: list[Row]) -> dict[str, int]:
    out = {k: 0 for k in ("passed", "skipped", "failed", "not run")}
    for r in rows:
        out[r.result] += 1
    return out


def table(rows: list[Row]) -> Table:
    c = counts(rows)
    t = Table(title=f"NVIDIA's DRA driver {dra.version()}: its own suite on gpulab "
                    f"({c['passed']} passed, {c['skipped']} skipped by the suite, "
                    f"{c['failed']} failed, {c['not run']} files not run)")  # fmt: skip
    for col in ("file", "test", "result", "s", "why"):
        t.add_column(col, justify="right" if col == "s" else "left")
    style = {"passed": "green", "skipped": "yellow", "failed": "red", "not run": "dim"}
    for r in rows:
        t.add_row(r.file.removesuffix(".bats"), r.test,
                  f"[{style[r.result]}]{r.result}[/]", f"{r.seconds:.1f}", run_why(r))  # fmt: skip
    return t


def markdown(rows: list[Row]) -> str:
    c = counts(rows)
    lines = [f"NVIDIA's DRA driver {dra.version()}, its own `{TARGET}` suite on gpulab: "
             f"{c['passed']} passed, {c['skipped']} skipped by the suite, {c['failed']} "
             f"failed; {c['not run']} files not run.", "",
             "| file | test | result | s | why |", "|---|---|---|--:|---|"]  # fmt: skip
    for r in rows:
        why = run_why(r).replace("|", "\\|")
        lines.append(f"| {r.file.removesuffix('.bats')} | {r.test} | {r.result} | "
                     f"{r.seconds:.1f} | {why} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def per_test(rows: list[Row]) -> str:
    """The docs' table (docs/dra-driver.md): a row per test, no timings."""
    lines = ["| file | test | result | why |", "|---|---|---|---|"]
    for r in rows:
        # A retry is the run's news (its report), not the docs'.
        why = "" if r.result == "passed" else r.why.replace("|", "\\|")
        lines.append(f"| {r.file.removesuffix('.bats')} | {r.test} | {r.result} | {why} |")
    return "\n".join(lines)


def per_file(rows: list[Row]) -> str:
    """The README's table: a row per GPU file, one for the compute-domain files together."""
    lines = ["| file | passed | skipped by the suite | failed |", "|---|--:|--:|--:|"]
    groups: dict[str, list[Row]] = {}
    for r in rows:
        key = "test_cd_*" if r.file.startswith("test_cd_") else r.file.removesuffix(".bats")
        groups.setdefault(key, []).append(r)
    for key, mine in groups.items():
        if key == "test_cd_*":
            idle = len({r.file for r in mine if r.result == "not run"})
            files = len({r.file for r in mine})
            key += f" ({files} files, {idle} not run)" if idle else f" ({files} files)"
        c = counts(mine)
        cells = "| not run |  |  |" if c["not run"] == len(mine) else (
            f"| {c['passed']} | {c['skipped']} | {c['failed']} |")  # fmt: skip
        lines.append(f"| {key} {cells}")
    return "\n".join(lines)


# The pages whose tables show a run: <!-- dra-suite:start --> ... <!-- dra-suite:end -->.
BLOCK = "dra-suite"
TABLES = {"README.md": per_file, "docs/dra-driver.md": per_test}


def write_docs(root: Path, rows: list[Row]) -> None:
    """The README's and the docs' tables from a run's rows."""
    for name, render in TABLES.items():
        path = root / name
        path.write_text(docblock.rewrite(path.read_text(), BLOCK, render(rows)))


def load(report: Path) -> list[Row]:
    return [Row(**r) for r in json.loads(report.read_text())["rows"]]


def write(out: Path, rows: list[Row], seconds: float) -> None:
    doc = {"driver": dra.version(), "target": TARGET, "seconds": round(seconds, 1),
           "counts": counts(rows), "rows": [asdict(r) for r in rows]}  # fmt: skip
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "report.md").write_text(markdown(rows))


if __name__ == "__main__":
    # python -m e2e.dra_suite build/dra-suite/report.json: the README's and the docs'
    # tables from that run (e2e/test_dra_suite.py checks they show the run it made).
    import sys

    write_docs(Path.cwd(), load(Path(sys.argv[1])))
