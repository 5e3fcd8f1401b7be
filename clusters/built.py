"""What `make infra` built, as labs, subjects and tests read it.

The build steps (clusters/infra/infra.py) record what they made in $GPULAB_CACHE/infra.json
(`Products`). Labs and test fixtures only *use* it, through `require()` and `helm()`:
when something is missing they fail at once with one line that names `make infra`
(`InfraMissing`). Nothing here builds, so no test timeout ever wraps a build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clusters import versions
from clusters.steps import StepError
from fakenvml import library, paths

# The scripts are package data (clusters/infra/scripts, clusters/infra/nodeimage,
# clusters/infra/images), named relative to ROOT: the checkout, or site-packages for an
# installed package.
ROOT = Path(__file__).resolve().parents[1]
MAKE_INFRA = "run `make infra`" if paths.checkout() else "run `gpulab infra`"
# What a GPU node runs, and all the gpulab image holds of gpulab (with the `[project]
# dependencies`, the library and nvidia-smi): its tree key hashes them.
NODE_PACKAGES = ("fakenvml", "plugin")


def cache_dir() -> Path:
    return paths.cache_dir()


def manifest_path() -> Path:
    return cache_dir() / "infra.json"


class InfraMissing(StepError):
    """Something the cluster tier needs is not there; the message says what makes it."""


@dataclass
class Products:
    """What `make infra` made, as labs and fixtures need it."""

    kind: str = ""
    helm: str = ""  # renders subjects deployed from a Helm chart
    # Kubernetes version -> image; versions.node_image_key(): worker images, older kubelets
    node_images: dict[str, str] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)  # base, gpulab, workload, nvidia-<v>
    nvidia: dict[str, str] = field(default_factory=dict)  # version -> binary
    # The NVIDIA Container Toolkit's dir (nvidia-container-runtime, nvidia-cdi-hook,
    # nvidia-ctk) that the newest pinned plugin requires: what lab GPU nodes run.
    toolkit: str = ""
    # NVIDIA's mig-parted: nvidia-mig-parted, nvidia-mig-manager, config-default.yaml
    mig_parted: str = ""
    tree_key: str = ""  # the checkout state the gpulab image was built from
    subjects: dict[str, str] = field(default_factory=dict)  # subject name -> image built
    # node image -> it with the lab images in its containerd (PRELOADED): what a new lab's
    # nodes start from; labs record and compare the node image itself (Host.create).
    preloaded: dict[str, str] = field(default_factory=dict)

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

    def node_image(self, kube: str, kubelet: str | None = None) -> str:
        """The image of a node running Kubernetes `kube` with `kubelet` (None: kube's own)."""
        return self.node_images[versions.node_image_key(kube, kubelet)]

    def lab_node_images(self) -> dict[str, str]:
        """node image -> its preloaded image, for those whose preloaded image is in the
        engine (an infra cache restores node images, never these)."""
        return {k: v for k, v in self.preloaded.items() if v and image_present(v)}

    def save(self) -> None:
        path = manifest_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)


# The recorded images (Products.images) a lab's nodes run, preloaded into every node image
# so that a lab loads none of them; the others (base, bats-base, bats) run on the host.
PRELOADED = ("gpulab", "workload", "nfd", "dra", "nvidia-*")


def tree_key(root: Path = ROOT) -> str:
    """A hash of everything the gpulab image is made of: the node's packages
    (NODE_PACKAGES), the pins (pyproject.toml, or an installed package's METADATA), the
    built library and how the image is built. `root`: another tree of the same layout (a
    test's copy: a probe written into the checkout raced the tests beside it)."""
    h = hashlib.sha256()
    pins = root / "pyproject.toml" if paths.checkout() else _dist_info() / "METADATA"
    files: list[Path] = [
        pins,
        root / "clusters/infra/images/gpulab.Dockerfile",
        root / "clusters/infra/images/build.sh",
        library.default_path(),
    ]
    for pkg in NODE_PACKAGES:
        files += sorted(
            p
            for p in (root / pkg).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    for p in files:
        name = p.relative_to(root) if p.is_relative_to(root) else Path("build/release", p.name)
        h.update(str(name).encode() + b"\0")
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()[:16]


def _dist_info() -> Path:
    """The installed package's .dist-info directory."""
    files = importlib.metadata.distribution("gpulab").files or []
    return Path(str(next(f for f in files if f.name == "METADATA").locate())).parent


def docker_answers() -> bool:
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=20, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def image_present(ref: str) -> bool:
    return (
        subprocess.run(
            ["docker", "image", "inspect", ref], capture_output=True, check=False
        ).returncode
        == 0
    )


def require(images: Iterable[str] = ("gpulab", "workload"), kube: str | None = None,
            kubelet: str | None = None) -> Products:  # fmt: skip
    """What a lab needs — the engine, kind, the node image of Kubernetes `kube` (default:
    the run's, versions.kube_version()), the workers' image with an older `kubelet` where
    one is named, and `images` — checked in about a second; InfraMissing (one line naming
    `make infra`) for the first thing that is not there. Never builds."""
    p = Products.load()
    kube = kube or versions.kube_version()
    if not p.node_images:
        raise InfraMissing(f"no infrastructure recorded in {manifest_path()}; {MAKE_INFRA}")
    if not docker_answers():
        raise InfraMissing(f"no Docker engine answers; {MAKE_INFRA} (it starts one)")
    if not (p.kind and os.access(p.kind, os.X_OK)):
        raise InfraMissing(f"kind is not built ({p.kind or 'none recorded'}); {MAKE_INFRA}")
    for key in dict.fromkeys((kube, versions.node_image_key(kube, kubelet))):
        node = p.node_images.get(key, "")
        if not node and key == kube:
            raise InfraMissing(f"no kind node image of Kubernetes {kube} is built; {MAKE_INFRA} "
                               f"(GPULAB_KUBE_VERSION={kube} builds it)")  # fmt: skip
        if not node:
            raise InfraMissing(f"no worker node image of Kubernetes {kube} with kubelet "
                               f"{kubelet} is built; {MAKE_INFRA} "
                               f"(GPULAB_KUBELET_VERSION={kubelet} builds it)")  # fmt: skip
        if not image_present(node):
            raise InfraMissing(f"the kind node image {node} is not in the Docker engine; "
                               f"{MAKE_INFRA}")  # fmt: skip
    for name in images:
        ref = p.images.get(name, "")
        if not ref or not image_present(ref):
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
