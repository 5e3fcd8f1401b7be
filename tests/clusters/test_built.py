"""The record of what `make infra` built, as labs and fixtures read it: `require()` names
`make infra` for whatever is missing, and the gpulab image's tree key follows its sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clusters import built, versions

REPO = Path(__file__).resolve().parents[2]
REAL_CACHE = built.cache_dir()  # before any test points GPULAB_CACHE elsewhere


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GPULAB_CACHE", str(d))
    return d


def test_require_without_infra_names_make_infra(cache: Path) -> None:
    with pytest.raises(built.InfraMissing, match=r"no infrastructure recorded .*run `make infra`"):
        built.require()


def test_require_names_a_missing_image(cache: Path) -> None:
    recorded = _recorded()
    absent = {versions.kube_version(): "gpulab/absent:node"}
    built.Products(**{**recorded, "node_images": absent}).save()
    with pytest.raises(
        built.InfraMissing,
        match=r"the kind node image gpulab/absent:node is not in the Docker engine; "
        r"run `make infra`",
    ):
        built.require([])
    built.Products(**{**recorded, "images": {"gpulab": "gpulab/absent:1"}}).save()
    with pytest.raises(
        built.InfraMissing,
        match=r"the gpulab image gpulab/absent:1 is not in "
        r"the Docker engine; run `make infra`",
    ):
        built.require(["gpulab"])


def test_require_names_a_missing_worker_image_and_what_builds_it(cache: Path) -> None:
    recorded = _recorded()
    kube = versions.kube_version()
    nodes = {k: v for k, v in recorded["node_images"].items() if "+kubelet-" not in k}
    built.Products(**{**recorded, "node_images": nodes}).save()
    with pytest.raises(
        built.InfraMissing,
        match=rf"^no worker node image of Kubernetes {kube} with kubelet v1.34.0 is built; "
        r"run `make infra` \(GPULAB_KUBELET_VERSION=v1.34.0 builds it\)$",
    ):
        built.require([], kube, "v1.34.0")
    assert built.require([], kube, kube).node_image(kube) == nodes[kube]


def _recorded() -> dict:
    """What `make infra` recorded in the real cache (the tests' own caches are empty)."""
    real = REAL_CACHE / "infra.json"
    recorded = json.loads(real.read_text()) if real.exists() else {}
    recorded = {k: v for k, v in recorded.items() if k in built.Products.__dataclass_fields__}
    if not recorded.get("images", {}).get("gpulab"):
        pytest.fail("no gpulab image recorded; run `make infra`", pytrace=False)
    return recorded


def test_require_catches_a_gpulab_image_older_than_the_checkout(cache: Path) -> None:
    recorded = _recorded()
    built.Products(**{**recorded, "tree_key": "0" * 16}).save()
    with pytest.raises(built.InfraMissing, match="built from other sources than this checkout"):
        built.require(["gpulab"])
    built.Products(**{**recorded, "tree_key": built.tree_key()}).save()
    assert built.require(["gpulab"]).images["gpulab"] == recorded["images"]["gpulab"]


def test_the_tree_key_follows_the_plugin_sources(tmp_path: Path) -> None:
    # On a copy: a probe written into the checkout made a lab test beside this one (another
    # xdist worker) see its gpulab image as stale (CI, 2026-12-06).
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for rel in ("pyproject.toml", "clusters/infra/images/gpulab.Dockerfile",
                "clusters/infra/images/build.sh"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    for pkg in built.NODE_PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=skip)
    assert built.tree_key(tmp_path) == built.tree_key()  # the same files, the same key
    probe = tmp_path / "plugin" / "_tree_key_probe.py"
    probe.write_text("# changes what the gpulab image is made of\n")
    assert built.tree_key(tmp_path) != built.tree_key()
    probe.unlink()
    assert built.tree_key(tmp_path) == built.tree_key()
