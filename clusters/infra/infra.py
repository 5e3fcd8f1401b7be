"""The infrastructure the cluster tier needs, as one ordered list of steps (`make infra`).

    gpulab infra                  # every step; seconds when warm
    gpulab infra nvidia-plugins   # only some groups (see GROUPS)
    gpulab infra tree-key         # the gpulab image's input key
    gpulab infra --list           # each group's scripts; runs nothing
    gpulab infra export DIR       # products + images for a CI cache (infracache)
    gpulab infra import DIR       # ... restored; then every step finds its product
    gpulab infra key              # the key an export must match

Each step runs one script in a process group of its own, with the script's output in a
log file under $GPULAB_CACHE/logs: one status line per step (✓ or ✗ and seconds), a line a
minute while a step runs long, and on failure the log's last lines and its path. An
interrupted run kills the whole group, so no orphaned build goes on writing into the cache.

What the steps made is recorded in $GPULAB_CACHE/infra.json (clusters/built.py), which
labs and test fixtures only read.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from clusters import built, versions
from clusters.built import ROOT, Products
from clusters.subjects.subject import SUBJECTS_DIR, Subject, SubjectError, build_args
from clusters.subjects.subject import examples as subject_examples
from clusters.subjects.subject import load as load_subject
from clusters.subjects.subject import names as subject_names
from clusters.subjects.subject import shipped as subject_shipped
from fakenvml import library, paths

T = TypeVar("T")
STEPS = {  # group -> the scripts its steps run (`--list`)
    "engine": ["clusters/infra/scripts/docker.sh"],
    "kind": ["clusters/infra/scripts/kind.sh"],
    "helm": ["clusters/infra/scripts/helm.sh"],
    "nvidia-plugins": [
        "clusters/infra/scripts/nvidia-plugin.sh",
        "clusters/infra/scripts/mig-parted.sh",
    ],
    "node-image": [
        "clusters/infra/scripts/node-image.sh",
        "clusters/infra/nodeimage/build.sh",
        "clusters/infra/nodeimage/rootfs.sh",
    ],
    "kubelets": ["clusters/infra/nodeimage/build.sh"],
    "kueue": ["clusters/infra/images/build.sh"],
    "lab-images": [
        "clusters/infra/images/build.sh",
        "clusters/infra/scripts/dra-driver.sh",
        "clusters/infra/scripts/gpu-operator.sh",
    ],
}


class InfraError(Exception):
    """A step failed; the message names the step and its log."""


def node_requirements() -> list[str]:
    """gpulab's base requirements (`[project] dependencies`, no extra): what a GPU node
    runs, and what the gpulab image installs."""
    if (root := paths.checkout()) is not None:
        with (root / "pyproject.toml").open("rb") as f:
            return list(tomllib.load(f)["project"]["dependencies"])
    return [r for r in importlib.metadata.requires("gpulab") or [] if "extra ==" not in r]


def image_env(key: str) -> dict[str, str]:
    """What clusters/infra/images/build.sh needs to build the gpulab image: the interpreter (and
    its pip), the library, the requirements, the node's packages, and where gpulab is: the
    checkout to build a wheel of, or the installed package's site to copy from."""
    env = {"GPULAB_TREE_KEY": key, "GPULAB_PYTHON": sys.executable,
           "GPULAB_LIBRARY": str(library.default_path()),
           "GPULAB_NODE_REQS": "\n".join(node_requirements()),
           "GPULAB_NODE_PACKAGES": " ".join(built.NODE_PACKAGES)}  # fmt: skip
    if (root := paths.checkout()) is not None:
        return {**env, "GPULAB_SOURCE": str(root)}
    return {**env, "GPULAB_SITE": str(ROOT)}


# -- running steps -----------------------------------------------------------------------


class Runner:
    """Runs steps in order with one status line each; stops at the first failure."""

    TICK_S = 60

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.logs = built.cache_dir() / "logs"
        self.products = Products.load()
        self.running: set[subprocess.Popen[str]] = set()  # steps in flight, in any lane
        self._recording = threading.Lock()
        # CPU seconds the current step's scripts used, per lane (a lane is a thread).
        self._cpu = threading.local()

    def record(self, change: Callable[[], object]) -> None:
        """Change the products and save them, one lane at a time (the lanes share them)."""
        with self._recording:
            change()
            self.products.save()

    def stop(self) -> None:
        """Kill every step still running (another lane's, when this one failed)."""
        for proc in list(self.running):
            _kill_group(proc)

    def step(self, title: str, fn: Callable[[], T]) -> T:
        """Runs `fn`; one status line with its product, its seconds and, where its scripts
        used a CPU second or more, their CPU seconds: above the seconds where both cores
        were its (a Go build), below where it waited (the module proxy, another lane)."""
        t0 = time.monotonic()
        self._cpu.s = 0.0
        try:
            result = fn()
        except InfraError as e:
            self.console.print(f"[red]✗[/] {title} [dim]({time.monotonic() - t0:.1f}s)[/]")
            self.console.print(f"  {e}", highlight=False)
            raise
        except KeyboardInterrupt:
            self.console.print(f"[red]✗[/] {title}: interrupted")
            raise
        shown = (
            ", ".join(f"{k}={v}" for k, v in result.items()) if isinstance(result, dict) else result
        )
        note = f" [dim]→ {shown}[/]" if shown else ""
        cpu = f", cpu {self._cpu.s:.0f}s" if self._cpu.s >= 1 else ""
        self.console.print(
            f"[green]✓[/] {title}{note} [dim]({time.monotonic() - t0:.1f}s{cpu})[/]",
            highlight=False,
        )
        return result

    def script(
        self, title: str, log_name: str, path: str, *args: str, env: dict[str, str] | None = None
    ) -> str:
        """Run a shipped script (a path relative to ROOT, or absolute) in its own process
        group; stderr to the step's log, stdout returned (the product). A line a minute
        while it runs. The scripts get the same cache this process uses."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log, out = self.logs / f"{log_name}.log", self.logs / f"{log_name}.out"
        t0 = time.monotonic()
        with log.open("w") as err, out.open("w") as products:
            proc = subprocess.Popen(
                [str(ROOT / path), *args],
                stdout=products,
                stderr=err,
                text=True,
                env={**os.environ, "GPULAB_CACHE": str(built.cache_dir()), **(env or {})},
                start_new_session=True,
                cwd=paths.checkout() or self.logs,
            )
            self.running.add(proc)
            try:
                cpu = self._wait(proc, title, log, t0)
                self._cpu.s = getattr(self._cpu, "s", 0.0) + cpu
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                self.running.discard(proc)
        if proc.returncode != 0:
            tail = "\n".join("    " + line for line in _tail(log, 8))
            raise InfraError(
                f"{path} {' '.join(args)} exited {proc.returncode}; last lines of {log}:\n{tail}"
            )
        return out.read_text().strip()

    def _wait(self, proc: subprocess.Popen[str], title: str, log: Path, t0: float) -> float:
        """Waits for the script, a line a minute; returns the CPU seconds it and every
        process it waited for used (wait4's rusage: a docker build's work is the engine's,
        not counted)."""
        tick = t0 + self.TICK_S
        while True:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by another lane's stop (_kill_group)
                proc.wait()
                return 0.0
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage.ru_utime + usage.ru_stime
            if time.monotonic() >= tick:
                tick += self.TICK_S
                last = (_tail(log, 1) or [""])[0]
                mins = (time.monotonic() - t0) / 60
                self.console.print(
                    f"  … {title}: {mins:.0f} min [dim]{last[:100]}[/]", highlight=False
                )
            time.sleep(0.05)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the step's process group (the script and every build it started), then
    SIGKILL what is left after 5 s."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


# -- the steps ---------------------------------------------------------------------------

# kubelets: the workers' images with older kubelets (KUBELET_VERSIONS), which only the
# skew pass and the platform lane need; kueue: Kueue's image, for the platform lane's
# Kueue suite and `make bench-kueue`. `make test` builds both at nice 19 beside its first
# tiers (Makefile: LATE_GROUPS).
GROUPS = (
    "engine",
    "kind",
    "helm",
    "nvidia-plugins",
    "node-image",
    "kubelets",
    "lab-images",
    "kueue",
)


def run(groups: Iterable[str] = GROUPS, console: Console | None = None) -> Products:
    """Bring up every step of `groups`, in the fixed order; returns (and records) what
    they made."""
    want = set(groups)
    unknown = want - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(sorted(unknown))} ({', '.join(GROUPS)})")
    r = Runner(console)
    t0 = time.monotonic()
    if want & {"engine", "node-image", "kubelets", "lab-images", "kueue"}:
        r.step("Docker engine", lambda: _engine(r))
    # The debootstraps (disk and network bound) run beside the Go builds (CPU bound, at
    # nice 10): on 2 cores they hide behind the first compiles.
    chosen = _choose_node_images(r) if "node-image" in want else {}
    local = any(not c.startswith("upstream ") for c in chosen.values())
    beside = ThreadPoolExecutor(max_workers=1)
    lane = beside.submit(_debootstraps, r, want, local)
    try:
        _run(r, want, chosen, lane)
    except BaseException:
        r.stop()
        raise
    finally:
        beside.shutdown(wait=True)
    r.console.print(
        f"[bold green]Infrastructure ready[/] in {time.monotonic() - t0:.1f}s "
        f"[dim](recorded in {built.manifest_path()}, logs in {r.logs})[/]",
        highlight=False,
    )
    return r.products


def _debootstraps(r: Runner, want: set[str], node_rootfs: bool) -> dict[str, str]:
    """The node root filesystem (when a node image is built here) and the lab base and
    workload images: what needs Docker and Debian's packages but no Go build."""
    made: dict[str, str] = {}
    if node_rootfs:
        rootfs = "clusters/infra/nodeimage/rootfs.sh"
        r.step("Node root filesystem (debootstrap)",
               lambda: r.script("node rootfs", "node-rootfs", rootfs))  # fmt: skip
    if "lab-images" in want:
        for which, title in (("base", "Lab base image (debootstrap)"),
                             ("workload", "Workload image (busybox)"),
                             ("bats-base", "DRA suite runner's base (debootstrap)")):  # fmt: skip
            made.update(r.step(title, lambda w=which: _image(r, w)))
    return made


def _image(r: Runner, which: str, env: dict[str, str] | None = None) -> dict[str, str]:
    out = r.script(f"{which} image", f"image-{which}", "clusters/infra/images/build.sh", which,
                   env=env)  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _run(r: Runner, want: set[str], chosen: dict[str, str],
         lane: Future[dict[str, str]]) -> None:  # fmt: skip
    p = r.products
    if "kind" in want:
        kind = r.step(
            f"kind {versions.get('KIND_VERSION')}",
            lambda: r.script("kind", "kind", "clusters/infra/scripts/kind.sh").splitlines()[-1],
        )
        r.record(lambda: setattr(p, "kind", kind))
    # Two Go lanes: the node image's builds here, the lab images' programs beside them. A
    # cold Go build waits on the module proxy for a minute at a time (the cores sat idle
    # for about 4 of a cold infra's 22 minutes in one lane); the other lane compiles then.
    # The first lane to fail stops the other's step; its error is the one raised.
    failed: list[BaseException] = []

    def stop_if_failed(f: Future[None]) -> None:
        if (e := f.exception()) is not None:
            failed.append(e)
            r.stop()

    beside = ThreadPoolExecutor(max_workers=1)
    programs = beside.submit(_programs, r, want, lane)
    programs.add_done_callback(stop_if_failed)
    try:
        if "node-image" in want:
            for kube, choice in chosen.items():
                image = _node_image_of(r, kube, choice, lane)
                r.record(lambda k=kube, i=image: p.node_images.__setitem__(k, i))
        if "kubelets" in want:
            control = versions.kube_version()
            for kubelet in versions.skewed_kubelets(control):
                image = _worker_image(r, control, kubelet, p.node_images.get(control, ""))
                key = versions.node_image_key(control, kubelet)
                r.record(lambda k=key, i=image: p.node_images.__setitem__(k, i))
    except BaseException as e:
        failed.append(e)
        r.stop()
        beside.shutdown(wait=True)
        raise failed[0] from None
    beside.shutdown(wait=True)
    programs.result()
    if "lab-images" in want:
        # The suite runner carries the Kubernetes build's kubectl and the helm build.
        bats = r.step(f"DRA driver's suite runner (bats {versions.get('BATS_VERSION')})",
                      lambda: _image(r, "bats"))  # fmt: skip
        r.record(lambda: p.images.update(bats))
    if want & {"node-image", "kubelets", "lab-images"}:
        _preload(r, p)


def _programs(r: Runner, want: set[str], lane: Future[dict[str, str]]) -> None:
    """The second Go lane: helm and the charts' modules, NVIDIA's plugin, toolkit and
    mig-parted, the lab images (NFD's, the DRA driver's and node-problem-detector's builds
    among them) and the subjects' images."""
    p = r.products
    if "helm" in want:
        helm = r.step(
            f"helm {versions.get('HELM_VERSION')} (Go)",
            lambda: r.script("helm", "helm", "clusters/infra/scripts/helm.sh").splitlines()[-1],
        )
        r.record(lambda: setattr(p, "helm", helm))
        for module in chart_modules():
            r.step(f"Chart module {module}",
                   lambda m=module: r.script(f"module {m}", f"module-{m.replace('/', '_')}",
                                             "clusters/infra/scripts/helm.sh", "module",
                                             m))  # fmt: skip
    if want & {"nvidia-plugins", "lab-images"}:
        for v in versions.nvidia_plugin_versions():
            binary = r.step(
                f"NVIDIA device plugin {v} (Go)",
                lambda v=v: r.script(
                    f"NVIDIA plugin {v}",
                    f"nvidia-plugin-{v}",
                    "clusters/infra/scripts/nvidia-plugin.sh",
                    v,
                ),
            )
            r.record(lambda v=v, b=binary: p.nvidia.__setitem__(v, b))
        newest = Path(p.nvidia[versions.nvidia_plugin_versions()[0]]).parent
        toolkit = str((newest / "nvidia-container-runtime").resolve().parent)
        r.record(lambda: setattr(p, "toolkit", toolkit))
        migparted = r.step(
            f"NVIDIA mig-parted {versions.get('MIG_PARTED_VERSION')} (Go)",
            lambda: r.script("mig-parted", "mig-parted",
                             "clusters/infra/scripts/mig-parted.sh").splitlines()[-1],
        )  # fmt: skip
        r.record(lambda: setattr(p, "mig_parted", migparted))
    if "lab-images" in want:
        debootstrapped = lane.result()
        r.record(lambda: p.images.update(debootstrapped))
        _lab_images(r, p)
        _subjects(r, p)
    if "kueue" in want:
        # The batch queue above the scheduler (e2e/test_kueue.py, make bench-kueue): a
        # group of its own, so `make test` builds it beside the unit tier with the
        # kubelets, not in the infra tier before it.
        kueue = r.step(f"Kueue {versions.get('KUEUE_VERSION')} (Go)", lambda: _image(r, "kueue"))
        r.record(lambda: p.images.update(kueue))


def _subjects(r: Runner, p: Products) -> None:
    """Subjects whose image is built from a Dockerfile: the examples, and those named in
    $GPULAB_SUBJECTS (`make infra SUBJECT=path/to/subject.yaml`). Subjects that run one
    build directory differently (its modes) share its image."""
    made: dict[Path, tuple[str, str]] = {}
    for s in subjects_wanted():
        if s.spec.image.build is None:
            continue
        context = s.path(s.spec.image.build)
        if context in made:
            first, tag = made[context]
            ref = r.step(f"Subject {s.name}'s image: {first}'s", lambda t=tag: t)
        else:
            ref = r.step(f"Subject {s.name}'s image", lambda s=s: _build_subject(r, s, p))
            made[context] = (s.name, ref)
        r.record(lambda n=s.name, t=ref: p.subjects.__setitem__(n, t))


def _preload(r: Runner, p: Products) -> None:
    """Every recorded node image with the lab images in its containerd (built.PRELOADED),
    once both are there; the images a lab then loads are only what a subject adds."""
    images = sorted(v for k, v in p.images.items()
                    if any(fnmatch.fnmatch(k, pat) for pat in built.PRELOADED))  # fmt: skip
    if not images:
        return
    for key, base in p.node_images.items():
        env = {"GPULAB_KUBE_VERSION": key.split("+")[0], "BASE_NODE_IMAGE": base,
               "PRELOAD_IMAGES": " ".join(images)}  # fmt: skip
        ref = r.step(
            f"Lab images preloaded into {base}",
            lambda e=env, k=key: r.script("preload", f"node-preload-{k}",
                                          "clusters/infra/nodeimage/build.sh", "preload",
                                          env=e).splitlines()[-1],
        )  # fmt: skip
        r.record(lambda b=base, x=ref: p.preloaded.__setitem__(b, x))


def _engine(r: Runner) -> str:
    r.script("Docker engine", "docker", "clusters/infra/scripts/docker.sh")
    out = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"Docker {out.stdout.strip()}"


def _choose_node_images(r: Runner) -> dict[str, str]:
    """Per Kubernetes version: `upstream <image>` (kind's own, here or pulled) or `local`
    (built here)."""
    choose = ("clusters/infra/scripts/node-image.sh", "--choose")
    return {kube: r.step(f"Node image {kube}: pull or build",
                         lambda k=kube: r.script("node image", f"node-image-choose-{k}", *choose,
                                                 env={"GPULAB_KUBE_VERSION": k}))
            for kube in versions.kube_versions()}  # fmt: skip


def _node_image_of(r: Runner, kube: str, source: str, lane: Future[dict[str, str]]) -> str:
    """kind's own image of `kube` (chosen), else built here."""
    env = {"GPULAB_KUBE_VERSION": kube}
    if source.startswith("upstream "):
        return source.split(" ", 1)[1]
    build = "clusters/infra/nodeimage/build.sh"
    for name, title in (
        ("kubernetes", f"Kubernetes {kube} binaries (Go)"),
        ("components", f"etcd, CoreDNS, crictl (Go), pause (C) for {kube}"),
        ("images", f"Control-plane images {kube}"),
    ):
        if name == "images":
            lane.result()  # the root filesystem they go into
        r.step(title, lambda n=name, t=title: r.script(t, f"node-{n}-{kube}", build, n, env=env))

    def node() -> str:  # the script's last line names the image
        out = r.script("node image", f"node-image-{kube}", build, "node", env=env)
        return out.splitlines()[-1]

    return r.step(f"Node image {kube}", node)


def _worker_image(r: Runner, control: str, kubelet: str, base: str) -> str:
    """`base` (the node image of `control`) with the kubelet of `kubelet` built alone."""
    if not base:  # the group alone, before any node image was made
        why = f"no node image of Kubernetes {control} recorded; run `gpulab infra node-image`"
        return r.step(f"Worker node image {control} with kubelet {kubelet}", lambda: _missing(why))
    env = {"GPULAB_KUBE_VERSION": control, "KUBELET_VERSION": kubelet, "BASE_NODE_IMAGE": base}
    return r.step(f"Worker node image {control} with kubelet {kubelet} (Go: the kubelet)",
                  lambda: r.script("worker image", f"node-worker-{control}-kubelet-{kubelet}",
                                   "clusters/infra/nodeimage/build.sh", "worker",
                                   env=env).splitlines()[-1])  # fmt: skip


def _missing(why: str) -> str:
    raise InfraError(why)


def _lab_images(r: Runner, p: Products) -> None:
    if paths.checkout() is None and not library.default_path().is_file():
        # An installed package builds its library here (a checkout's is `make install`'s).
        from fakenvml.native import build

        r.step("fakenvml library (gcc)", lambda: str(build.build("release", library.build_dir())))
    key = built.tree_key()
    for which, title, env in (
        ("gpulab", "gpulab image (fakenvml + plugin)", image_env(key)),
        ("nvidia", "NVIDIA plugin images", None),
        ("nfd", f"node-feature-discovery {versions.get('NFD_VERSION')} image (Go)", None),
        ("dra", f"NVIDIA DRA driver {versions.get('DRA_DRIVER_VERSION')} image (Go)", None),
        ("npd", f"node-problem-detector {versions.get('NPD_VERSION')} image (Go)", None),
        ("kwok", f"KWOK {versions.get('KWOK_VERSION')} image (Go)", None),
        ("mig-manager", f"NVIDIA MIG manager {versions.get('MIG_PARTED_VERSION')} image", None),
        ("gpu-operator", "NVIDIA GPU Operator and validator images (Go)", None),
    ):
        made = r.step(title, lambda w=which, e=env: _image(r, w, e))
        r.record(lambda m=made: p.images.update(m))
    r.record(lambda: setattr(p, "tree_key", key))


def subjects_wanted() -> list[Subject]:
    """The examples' subjects, and those named in $GPULAB_SUBJECTS (names or paths,
    comma-separated)."""
    named = [load_subject(n) for n in subject_names(os.environ.get("GPULAB_SUBJECTS", ""))]
    seen: dict[Path, Subject] = {s.source.resolve(): s for s in subject_examples()}
    for s in named:
        seen.setdefault(s.source.resolve(), s)
    return list(seen.values())


def subjects_tested() -> list[Subject]:
    """The shipped subjects, then the wanted ones (subjects_wanted) that are not shipped:
    every subject the node and container tiers may run."""
    others = [s for s in subjects_wanted() if s.source.resolve().parent != SUBJECTS_DIR]
    return subject_shipped() + others


def chart_modules() -> list[str]:
    """The Go modules (module@version) whose charts the shipped and wanted subjects use
    (their own or their companions')."""
    found = subject_shipped() + subjects_wanted()
    return sorted({c.go_module for s in found for c in s.charts if c.go_module})


def _build_subject(r: Runner, s: Subject, p: Products) -> str:
    img = s.spec.image
    if img.prepare is not None:
        # Go's caches are gpulab's (lib.sh's), so a Go plugin builds from the modules
        # NVIDIA's plugin builds already fetched.
        go = built.cache_dir() / "go"
        env = {"GOMODCACHE": str(go / "mod"), "GOCACHE": str(go / "build"),
               "GOFLAGS": "-buildvcs=false -modcacherw"}  # fmt: skip
        r.script(f"{s.name}: {img.prepare}", f"subject-{s.name}-prepare",
                 str(s.path(img.prepare)), env=env)  # fmt: skip
    args = build_args(p.images)
    tag = s.build_tag(args)
    if not built.image_present(tag):
        flags = [x for k, v in args.items() for x in ("--build-arg", f"{k}={v}")]
        r.script(f"{s.name} image", f"subject-{s.name}", "/usr/bin/env", "docker", "build",
                 "-q", "-t", tag, *flags, str(s.path(img.build or ".")))  # fmt: skip
    return tag


def _list(groups: Iterable[str]) -> int:
    """Each group's scripts, resolved where this package is; 1 when one is not there."""
    missing = 0
    for g in groups:
        for script in STEPS.get(g, []):
            path = ROOT / script
            ok = path.is_file() and os.access(path, os.X_OK)
            missing += not ok
            print(f"{g:<15} {path}{'' if ok else '  (missing or not executable)'}")
    print(f"cache: {built.cache_dir()}  record: {built.manifest_path()}")
    return 1 if missing else 0


def main(argv: list[str], prog: str = "gpulab infra") -> int:
    """The build steps' command line; `gpulab infra` hands export, import and key to
    clusters/infra/infracache.py (the GROUP help names them)."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "groups",
        nargs="*",
        metavar="GROUP",
        help=f"some of {', '.join(GROUPS)}, or tree-key (default: all); "
        "or export DIR, import DIR, key (a cache for CI: `%(prog)s export --help`)",
    )
    ap.add_argument("--list", action="store_true", help="list the steps' scripts; run nothing")
    args = ap.parse_args(argv)
    if args.list:
        if unknown := set(args.groups) - set(GROUPS):
            print(f"infra: error: unknown group(s) {', '.join(sorted(unknown))} "
                  f"({', '.join(GROUPS)})", file=sys.stderr)  # fmt: skip
            return 2
        return _list(args.groups or GROUPS)
    if args.groups == ["tree-key"]:
        print(built.tree_key())
        return 0
    try:
        run(args.groups or GROUPS)
    except (ValueError, SubjectError) as e:
        print(f"infra: error: {e}", file=sys.stderr)
        return 2
    except InfraError:
        return 1  # the failed step's ✗ line and log tail are printed already
    except KeyboardInterrupt:
        return 130
    return 0
