"""The infrastructure the cluster tier needs, as one ordered list of steps (`make infra`).

    python -m clusters.infra                  # every step; seconds when warm
    python -m clusters.infra nvidia-plugins   # only some groups (see GROUPS)
    python -m clusters.infra tree-key         # the gpulab image's input key
    python -m clusters.infra --list           # each group's scripts; runs nothing
    python -m clusters.infra export DIR       # products + images for a CI cache (infracache)
    python -m clusters.infra import DIR       # ... restored; then every step finds its product
    python -m clusters.infra key              # the key an export must match

Each step runs one script in a process group of its own, with the script's output in a
log file under $GPULAB_CACHE/logs: one status line per step (✓ or ✗ and seconds), a line a
minute while a step runs long, and on failure the log's last lines and its path. An
interrupted run kills the whole group, so no orphaned build goes on writing into the cache.

What the steps made is recorded in $GPULAB_CACHE/infra.json. Labs and test fixtures only
*use* it, through `require()`: when something is missing they fail at once with one line
that names `make infra`. No test ever builds, so no test timeout ever wraps a build.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from clusters import versions
from clusters.steps import StepError
from clusters.subject import Subject, SubjectError
from clusters.subject import examples as subject_examples
from clusters.subject import load as load_subject
from clusters.subject import names as subject_names
from clusters.subject import shipped as subject_shipped
from fakenvml import library, paths

# The scripts are package data (clusters/scripts, clusters/nodeimage, clusters/images),
# named relative to ROOT: the checkout, or site-packages for an installed package.
ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
MAKE_INFRA = "run `make infra`" if paths.checkout() else "run `gpulab infra`"
# What the gpulab image leaves out: the node side (fakenvml, the plugin) never talks to the
# API server or Docker nor draws reports, and every lab loads the image into every GPU
# node (the kubernetes client alone is 126 MB).
LAB_ONLY = {"kubernetes", "docker", "matplotlib"}
STEPS = {  # group -> the scripts its steps run (`--list`)
    "engine": ["clusters/scripts/docker.sh"],
    "kind": ["clusters/scripts/kind.sh"],
    "helm": ["clusters/scripts/helm.sh"],
    "nvidia-plugins": ["clusters/scripts/nvidia-plugin.sh"],
    "node-image": [
        "clusters/scripts/node-image.sh",
        "clusters/nodeimage/build.sh",
        "clusters/nodeimage/rootfs.sh",
    ],
    "lab-images": ["clusters/images/build.sh", "clusters/scripts/dra-driver.sh"],
}


def cache_dir() -> Path:
    return paths.cache_dir()


def manifest_path() -> Path:
    return cache_dir() / "infra.json"


class InfraError(Exception):
    """A step failed; the message names the step and its log."""


class InfraMissing(StepError):
    """Something the cluster tier needs is not there; the message says what makes it."""


@dataclass
class Products:
    """What `make infra` made, as labs and fixtures need it."""

    kind: str = ""
    helm: str = ""  # renders subjects deployed from a Helm chart
    node_images: dict[str, str] = field(default_factory=dict)  # Kubernetes version -> image
    images: dict[str, str] = field(default_factory=dict)  # base, gpulab, workload, nvidia-<v>
    nvidia: dict[str, str] = field(default_factory=dict)  # version -> binary
    # The NVIDIA Container Toolkit's dir (nvidia-container-runtime, nvidia-cdi-hook,
    # nvidia-ctk) that the newest pinned plugin requires: what lab GPU nodes run.
    toolkit: str = ""
    tree_key: str = ""  # the checkout state the gpulab image was built from
    subjects: dict[str, str] = field(default_factory=dict)  # subject name -> image built

    @classmethod
    def load(cls) -> Products:
        path = manifest_path()
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in asdict(cls()) if k in data})
        except FileNotFoundError:
            return cls()
        except (ValueError, TypeError) as e:
            raise InfraMissing(f"{path} is unreadable ({e}); {MAKE_INFRA}") from e

    def save(self) -> None:
        path = manifest_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)


def tree_key() -> str:
    """A hash of everything the gpulab image is made of: the fakenvml and plugin packages,
    the pins (pyproject.toml, or an installed package's METADATA), the built library and
    how the image is built."""
    h = hashlib.sha256()
    pins = ROOT / "pyproject.toml" if paths.checkout() else _dist_dir() / "METADATA"
    files: list[Path] = [
        pins,
        ROOT / "clusters/images/gpulab.Dockerfile",
        ROOT / "clusters/images/build.sh",
        library.default_path(),
    ]
    for pkg in ("fakenvml", "plugin"):
        files += sorted(
            p
            for p in (ROOT / pkg).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    for p in files:
        name = p.relative_to(ROOT) if p.is_relative_to(ROOT) else Path("build/release", p.name)
        h.update(str(name).encode() + b"\0")
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()[:16]


def _dist_dir() -> Path:
    """The installed package's .dist-info directory."""
    files = importlib.metadata.distribution("gpulab").files or []
    return Path(str(next(f for f in files if f.name == "METADATA").locate())).parent


def node_requirements() -> list[str]:
    """gpulab's runtime requirements minus LAB_ONLY: what the gpulab image installs."""
    if (root := paths.checkout()) is not None:
        with (root / "pyproject.toml").open("rb") as f:
            deps = tomllib.load(f)["project"]["dependencies"]
    else:
        deps = [r for r in importlib.metadata.requires("gpulab") or [] if "extra ==" not in r]
    return [d for d in deps if re.split(r"[=<>!~\[; ]", d)[0].lower() not in LAB_ONLY]


def image_env(key: str) -> dict[str, str]:
    """What clusters/images/build.sh needs to build the gpulab image: the interpreter (and
    its pip), the library, the requirements, and gpulab itself: the checkout to build a
    wheel of, or the installed package's files to copy."""
    env = {"GPULAB_TREE_KEY": key, "GPULAB_PYTHON": sys.executable,
           "GPULAB_LIBRARY": str(library.default_path()),
           "GPULAB_NODE_REQS": "\n".join(node_requirements())}  # fmt: skip
    if (root := paths.checkout()) is not None:
        return {**env, "GPULAB_SOURCE": str(root)}
    items = ("fakenvml", "plugin", "clusters", "e2e", _dist_dir().name)
    return {**env, "GPULAB_SITE": str(ROOT), "GPULAB_SITE_ITEMS": " ".join(items)}


# -- running steps -----------------------------------------------------------------------


class Runner:
    """Runs steps in order with one status line each; stops at the first failure."""

    TICK_S = 60

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.logs = cache_dir() / "logs"
        self.products = Products.load()
        self.running: set[subprocess.Popen[str]] = set()  # steps in flight, in any lane

    def stop(self) -> None:
        """Kill every step still running (another lane's, when this one failed)."""
        for proc in list(self.running):
            _kill_group(proc)

    def step(self, title: str, fn: Callable[[], T]) -> T:
        t0 = time.monotonic()
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
        self.console.print(
            f"[green]✓[/] {title}{note} [dim]({time.monotonic() - t0:.1f}s)[/]", highlight=False
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
                env={**os.environ, "GPULAB_CACHE": str(cache_dir()), **(env or {})},
                start_new_session=True,
                cwd=paths.checkout() or self.logs,
            )
            self.running.add(proc)
            try:
                self._wait(proc, title, log, t0)
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

    def _wait(self, proc: subprocess.Popen[str], title: str, log: Path, t0: float) -> None:
        while True:
            try:
                proc.wait(timeout=self.TICK_S)
                return
            except subprocess.TimeoutExpired:
                last = (_tail(log, 1) or [""])[0]
                mins = (time.monotonic() - t0) / 60
                self.console.print(
                    f"  … {title}: {mins:.0f} min [dim]{last[:100]}[/]", highlight=False
                )


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

GROUPS = ("engine", "kind", "helm", "nvidia-plugins", "node-image", "lab-images")


def run(groups: Iterable[str] = GROUPS, console: Console | None = None) -> Products:
    """Bring up every step of `groups`, in the fixed order; returns (and records) what
    they made."""
    want = set(groups)
    unknown = want - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(sorted(unknown))} ({', '.join(GROUPS)})")
    r = Runner(console)
    t0 = time.monotonic()
    if want & {"engine", "node-image", "lab-images"}:
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
        f"[dim](recorded in {manifest_path()}, logs in {r.logs})[/]",
        highlight=False,
    )
    return r.products


def _debootstraps(r: Runner, want: set[str], node_rootfs: bool) -> dict[str, str]:
    """The node root filesystem (when a node image is built here) and the lab base and
    workload images: what needs Docker and Debian's packages but no Go build."""
    made: dict[str, str] = {}
    if node_rootfs:
        rootfs = "clusters/nodeimage/rootfs.sh"
        r.step("Node root filesystem (debootstrap)",
               lambda: r.script("node rootfs", "node-rootfs", rootfs))  # fmt: skip
    if "lab-images" in want:
        for which, title in (("base", "Lab base image (debootstrap)"),
                             ("workload", "Workload image (busybox)")):  # fmt: skip
            made.update(r.step(title, lambda w=which: _image(r, w)))
    return made


def _image(r: Runner, which: str, env: dict[str, str] | None = None) -> dict[str, str]:
    out = r.script(f"{which} image", f"image-{which}", "clusters/images/build.sh", which, env=env)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _run(r: Runner, want: set[str], chosen: dict[str, str],
         lane: Future[dict[str, str]]) -> None:  # fmt: skip
    p = r.products
    if "kind" in want:
        p.kind = r.step(
            f"kind {versions.get('KIND_VERSION')}",
            lambda: r.script("kind", "kind", "clusters/scripts/kind.sh").splitlines()[-1],
        )
        p.save()
    if "helm" in want:
        p.helm = r.step(
            f"helm {versions.get('HELM_VERSION')} (Go)",
            lambda: r.script("helm", "helm", "clusters/scripts/helm.sh").splitlines()[-1],
        )
        p.save()
        for module in chart_modules():
            r.step(f"Chart module {module}",
                   lambda m=module: r.script(f"module {m}", f"module-{m.replace('/', '_')}",
                                             "clusters/scripts/helm.sh", "module", m))  # fmt: skip
    if want & {"nvidia-plugins", "lab-images"}:
        for v in versions.nvidia_plugin_versions():
            p.nvidia[v] = r.step(
                f"NVIDIA device plugin {v} (Go)",
                lambda v=v: r.script(
                    f"NVIDIA plugin {v}",
                    f"nvidia-plugin-{v}",
                    "clusters/scripts/nvidia-plugin.sh",
                    v,
                ),
            )
            p.save()
        newest = Path(p.nvidia[versions.nvidia_plugin_versions()[0]]).parent
        p.toolkit = str((newest / "nvidia-container-runtime").resolve().parent)
        p.save()
    if "node-image" in want:
        for kube, choice in chosen.items():
            p.node_images[kube] = _node_image_of(r, kube, choice, lane)
            p.save()
    if "lab-images" in want:
        p.images.update(lane.result())
        _lab_images(r, p)
        p.save()
        # Subjects whose image is built from a Dockerfile: the examples, and those named in
        # $GPULAB_SUBJECTS (`make infra SUBJECT=path/to/subject.yaml`).
        # Subjects that run one build directory differently (its modes) share its image.
        built: dict[Path, tuple[str, str]] = {}
        for s in subjects_wanted():
            if s.spec.image.build is None:
                continue
            context = s.path(s.spec.image.build)
            if context in built:
                first, tag = built[context]
                p.subjects[s.name] = r.step(f"Subject {s.name}'s image: {first}'s",
                                            lambda t=tag: t)  # fmt: skip
            else:
                p.subjects[s.name] = r.step(f"Subject {s.name}'s image",
                                            lambda s=s: _build_subject(r, s, p))  # fmt: skip
                built[context] = (s.name, p.subjects[s.name])
            p.save()


def _engine(r: Runner) -> str:
    r.script("Docker engine", "docker", "clusters/scripts/docker.sh")
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
    choose = ("clusters/scripts/node-image.sh", "--choose")
    return {kube: r.step(f"Node image {kube}: pull or build",
                         lambda k=kube: r.script("node image", f"node-image-choose-{k}", *choose,
                                                 env={"GPULAB_KUBE_VERSION": k}))
            for kube in versions.kube_versions()}  # fmt: skip


def _node_image_of(r: Runner, kube: str, source: str, lane: Future[dict[str, str]]) -> str:
    """kind's own image of `kube` (chosen), else built here."""
    env = {"GPULAB_KUBE_VERSION": kube}
    if source.startswith("upstream "):
        return source.split(" ", 1)[1]
    build = "clusters/nodeimage/build.sh"
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


def _lab_images(r: Runner, p: Products) -> None:
    if paths.checkout() is None and not library.default_path().is_file():
        # An installed package builds its library here (a checkout's is `make install`'s).
        from fakenvml.native import build

        r.step("fakenvml library (gcc)", lambda: str(build.build("release", library.build_dir())))
    key = tree_key()
    for which, title, env in (
        ("gpulab", "gpulab image (fakenvml + plugin)", image_env(key)),
        ("nvidia", "NVIDIA plugin images", None),
        ("nfd", f"node-feature-discovery {versions.get('NFD_VERSION')} image (Go)", None),
        ("dra", f"NVIDIA DRA driver {versions.get('DRA_DRIVER_VERSION')} image (Go)", None),
    ):
        p.images.update(r.step(title, lambda w=which, e=env: _image(r, w, e)))
    p.tree_key = key


def subjects_wanted() -> list[Subject]:
    """The examples' subjects, and those named in $GPULAB_SUBJECTS (names or paths,
    comma-separated)."""
    named = [load_subject(n) for n in subject_names(os.environ.get("GPULAB_SUBJECTS", ""))]
    seen: dict[Path, Subject] = {s.source.resolve(): s for s in subject_examples()}
    for s in named:
        seen.setdefault(s.source.resolve(), s)
    return list(seen.values())


def chart_modules() -> list[str]:
    """The Go modules (module@version) whose charts the shipped and wanted subjects use."""
    found = subject_shipped() + subjects_wanted()
    return sorted(
        {s.spec.chart.go_module for s in found if s.spec.chart and s.spec.chart.go_module}
    )


def _subject_tag(s: Subject) -> str:
    """A tag named for the subject's build context and changing with any file of it: the
    subjects that build one directory share one image."""
    context = s.path(s.spec.image.build or ".")
    h = hashlib.sha256()
    for f in sorted(p for p in context.rglob("*") if p.is_file() and ".git" not in p.parts):
        h.update(str(f.relative_to(context)).encode() + b"\0" + f.read_bytes())
    name = re.sub(r"[^a-z0-9._-]+", "-", context.name.lower()).strip("-._") or "subject"
    return f"gpulab-subject/{name}:{h.hexdigest()[:12]}"


def _build_subject(r: Runner, s: Subject, p: Products) -> str:
    img = s.spec.image
    if img.prepare is not None:
        # Go's caches are gpulab's (lib.sh's), so a Go plugin builds from the modules
        # NVIDIA's plugin builds already fetched.
        go = cache_dir() / "go"
        env = {"GOMODCACHE": str(go / "mod"), "GOCACHE": str(go / "build"),
               "GOFLAGS": "-buildvcs=false -modcacherw"}  # fmt: skip
        r.script(f"{s.name}: {img.prepare}", f"subject-{s.name}-prepare",
                 str(s.path(img.prepare)), env=env)  # fmt: skip
    tag = _subject_tag(s)
    if not _image_present(tag):
        r.script(f"{s.name} image", f"subject-{s.name}", "/usr/bin/env", "docker", "build",
                 "-q", "-t", tag, "--build-arg", f"GPULAB_BASE_IMAGE={p.images['base']}",
                 str(s.path(img.build or ".")))  # fmt: skip
    return tag


# -- using it ----------------------------------------------------------------------------


def _docker_answers() -> bool:
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=20, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _image_present(ref: str) -> bool:
    return (
        subprocess.run(
            ["docker", "image", "inspect", ref], capture_output=True, check=False
        ).returncode
        == 0
    )


def require(images: Iterable[str] = ("gpulab", "workload"), kube: str | None = None) -> Products:
    """What a lab needs — the engine, kind, the node image of Kubernetes `kube` (default:
    the run's, versions.kube_version()) and `images` — checked in about a second;
    InfraMissing (one line naming `make infra`) for the first thing that is not there.
    Never builds."""
    p = Products.load()
    kube = kube or versions.kube_version()
    if not p.node_images:
        raise InfraMissing(f"no infrastructure recorded in {manifest_path()}; {MAKE_INFRA}")
    if not _docker_answers():
        raise InfraMissing(f"no Docker engine answers; {MAKE_INFRA} (it starts one)")
    if not (p.kind and os.access(p.kind, os.X_OK)):
        raise InfraMissing(f"kind is not built ({p.kind or 'none recorded'}); {MAKE_INFRA}")
    node = p.node_images.get(kube, "")
    if not node:
        raise InfraMissing(f"no kind node image of Kubernetes {kube} is built; {MAKE_INFRA} "
                           f"(GPULAB_KUBE_VERSION={kube} builds it)")  # fmt: skip
    if not _image_present(node):
        raise InfraMissing(f"the kind node image {node} is not in the Docker engine; {MAKE_INFRA}")
    for name in images:
        ref = p.images.get(name, "")
        if not ref or not _image_present(ref):
            raise InfraMissing(
                f"the {name} image {ref or '(none recorded)'} is not in the "
                f"Docker engine; {MAKE_INFRA}"
            )
    if "gpulab" in images and p.tree_key != tree_key():
        raise InfraMissing(
            f"the gpulab image {p.images.get('gpulab')} was built from other "
            f"sources than this checkout's; {MAKE_INFRA}"
        )
    return p


def helm() -> str:
    """The helm binary `make infra` built; InfraMissing when it did not."""
    path = Products.load().helm
    if not (path and os.access(path, os.X_OK)):
        raise InfraMissing(f"helm is not built ({path or 'none recorded'}); {MAKE_INFRA}")
    return path


def subject_image(s: Subject, p: Products) -> str:
    """The image a subject runs, present in the engine; InfraMissing saying how to get it."""
    img = s.spec.image
    if img.infra is not None:
        ref = p.images.get(img.infra, "")
        if not ref or not _image_present(ref):
            raise InfraMissing(f"subject {s.name}: the {img.infra} image is not built; "
                               f"{MAKE_INFRA}")  # fmt: skip
        return ref
    if img.ref is not None:
        if not _image_present(img.ref):
            raise InfraMissing(f"subject {s.name}: image {img.ref} is not in the Docker "
                               "engine (no registry here: build or load it first)")  # fmt: skip
        return img.ref
    tag = _subject_tag(s)
    if not _image_present(tag):
        raise InfraMissing(f"subject {s.name}: its image is not built; run "
                           f"`make infra SUBJECT={s.source}`")  # fmt: skip
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
    print(f"cache: {cache_dir()}  record: {manifest_path()}")
    return 1 if missing else 0


def main(argv: list[str] | None = None, prog: str = "python -m clusters.infra") -> int:
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
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] and argv[0] in ("export", "import", "key"):  # the CI cache's commands
        from clusters import infracache  # it imports this module: not at the top

        return infracache.main(argv, prog)
    args = ap.parse_args(argv)
    if args.list:
        if unknown := set(args.groups) - set(GROUPS):
            print(f"infra: error: unknown group(s) {', '.join(sorted(unknown))} "
                  f"({', '.join(GROUPS)})", file=sys.stderr)  # fmt: skip
            return 2
        return _list(args.groups or GROUPS)
    if args.groups == ["tree-key"]:
        print(tree_key())
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


if __name__ == "__main__":
    raise SystemExit(main())
