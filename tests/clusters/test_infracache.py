"""`gpulab infra export` / `import`: `make infra`'s products as a directory a CI cache
keeps. A round trip gives back the same images (same IDs) and the same product files;
an export of another key, or one cut short, is refused with one line and changes nothing."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters import built
from clusters.infra import infracache
from gpulab import cli

DIGEST_PINNED = "kindest/node:v1.37.0@sha256:" + "a" * 64


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("GPULAB_CACHE", str(d))
    return d


@pytest.fixture
def image(tmp_path: Path) -> Iterator[str]:
    """A tiny image of its own (FROM scratch, one file), removed afterwards."""
    if not built.docker_answers():
        pytest.fail("no Docker engine answers; the container tier needs one (`make infra` "
                    "starts it)", pytrace=False)  # fmt: skip
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "payload").write_bytes(secrets.token_bytes(256))
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    tag = f"gpulab-test/infracache:{secrets.token_hex(6)}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True,
                   capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})  # fmt: skip
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def products(cache: Path, images: dict[str, str]) -> None:
    """A small cache shaped as `make infra` leaves it: products, scratch beside them (a
    killed build's tmp dir, a .build.* dir, a lock), infra.json with absolute paths."""
    files = {
        "bin/kind-v0.33.0/kind": secrets.token_bytes(64),
        "bin/kubernetes-v1.37.0/.done": b"",
        "nvidia-device-plugin/v0.19.3/nvidia-device-plugin": secrets.token_bytes(64),
        "nvidia-device-plugin/v0.17.4/gpu-feature-discovery.refused": b"403 Forbidden\n",
        "images/busybox/busybox-static_1.35.0-4+b3_amd64.deb": secrets.token_bytes(32),
        "go/mod/cache/download/example.com/m/@v/v1.0.0.zip": secrets.token_bytes(32),
        # Go's trees are copied whole, whatever a module's files are called.
        "go/mod/example.com/m@v1.0.0/testdata/run.log": b"a module's file\n",
        "go/build/00/cafe-d": b"only with --with-build-caches",
        "bin/kind-v0.33.0.tmp.4242/kind": b"half a build",
        "nvidia-device-plugin/v0.19.3/.build.Ab12/nvidia-ctk": b"half a build",
        "images/.lock": b"",
        "logs/kind.log": b"a log\n",
    }
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    (cache / "bin/kind-v0.33.0/kind").chmod(0o755)
    record = {"kind": f"{cache}/bin/kind-v0.33.0/kind", "helm": "",
              "node_images": {"v1.37.0": DIGEST_PINNED}, "images": images,
              "nvidia": {"v0.19.3": f"{cache}/nvidia-device-plugin/v0.19.3/nvidia-device-plugin"},
              "tree_key": "", "subjects": {}}  # fmt: skip
    (cache / "infra.json").write_text(json.dumps(record, indent=2) + "\n")


RESTORED = (
    "bin/kind-v0.33.0/kind",
    "bin/kubernetes-v1.37.0/.done",
    "nvidia-device-plugin/v0.19.3/nvidia-device-plugin",
    "nvidia-device-plugin/v0.17.4/gpu-feature-discovery.refused",
    "images/busybox/busybox-static_1.35.0-4+b3_amd64.deb",
    "go/mod/cache/download/example.com/m/@v/v1.0.0.zip",
    "go/mod/example.com/m@v1.0.0/testdata/run.log",
    "infra.json",
)
SCRATCH = (
    "bin/kind-v0.33.0.tmp.4242",
    "nvidia-device-plugin/v0.19.3/.build.Ab12",
    "images/.lock",
    "go/build",
)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root but the logs: its bytes and mode."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "logs" not in p.relative_to(root).parts
    }


def image_id(ref: str) -> str | None:
    got = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref],
                         capture_output=True, text=True, check=False)  # fmt: skip
    return got.stdout.strip() if got.returncode == 0 else None


def rmi(ref: str) -> None:
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, check=True)


def exported(cache: Path, tmp_path: Path, image: str) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """The fake cache exported to tmp_path/export; the cache's files before."""
    products(cache, {"base": image})
    before = snapshot(cache)
    out = tmp_path / "export"
    assert infracache.main(["export", str(out)]) == 0
    return out, before


def one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("infra import: error:"), err
    for w in words:
        assert w in err, err
    return err


def test_a_round_trip_restores_the_images_products_and_record(
    cache: Path, tmp_path: Path, image: str
) -> None:
    want_id = image_id(image)
    out, before = exported(cache, tmp_path, image)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["key"] == infracache.key()
    assert manifest["images"] == [{"ref": image, "id": want_id}]
    assert [i["ref"] for i in manifest["skipped_images"]] == [DIGEST_PINNED]

    rmi(image)
    shutil.rmtree(cache)
    assert infracache.main(["import", str(out)]) == 0

    assert image_id(image) == want_id
    after = snapshot(cache)
    assert {k: before[k] for k in RESTORED} == {k: after[k] for k in RESTORED}
    assert not [k for k in after if k.startswith(SCRATCH)], "scratch was exported"
    assert not list(cache.glob(".infra-import.*")), "the import's work dir was left"


def test_the_build_caches_travel_only_when_asked(cache: Path, tmp_path: Path) -> None:
    products(cache, {})
    assert infracache.main(["export", str(tmp_path / "a")]) == 0
    assert infracache.main(["export", str(tmp_path / "b"), "--with-build-caches"]) == 0
    assert not (tmp_path / "a/parts/go-build.tar").exists()
    assert (tmp_path / "b/parts/go-build.tar").is_file()


def test_an_import_elsewhere_moves_the_records_paths_under_the_new_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    products(cache, {})
    assert infracache.main(["export", str(tmp_path / "out")]) == 0
    other = tmp_path / "other-cache"
    monkeypatch.setenv("GPULAB_CACHE", str(other))
    assert infracache.main(["import", str(tmp_path / "out")]) == 0
    p = built.Products.load()
    assert p.kind == f"{other}/bin/kind-v0.33.0/kind"
    assert os.access(p.kind, os.X_OK)
    assert p.node_images == {"v1.37.0": DIGEST_PINNED}


def test_an_export_of_another_key_is_refused_and_changes_nothing(
    cache: Path, tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, before = exported(cache, tmp_path, image)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "key": "0" * 64}))
    rmi(image)
    capsys.readouterr()
    assert infracache.main(["import", str(out)]) == 2
    one_line_error(capsys, "exported for key 0000000000000000", infracache.key()[:16])
    assert snapshot(cache) == before
    assert image_id(image) is None, "refused, yet the image was loaded"


def test_a_truncated_manifest_is_refused_and_changes_nothing(
    cache: Path, tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, before = exported(cache, tmp_path, image)
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text[: len(text) // 2])
    rmi(image)
    capsys.readouterr()
    assert infracache.main(["import", str(out)]) == 2
    one_line_error(capsys, "manifest.json is not readable JSON")
    assert snapshot(cache) == before
    assert image_id(image) is None


def test_an_image_tar_cut_short_is_refused_before_anything_is_loaded(
    cache: Path, tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, before = exported(cache, tmp_path, image)
    tar = out / "images.tar"
    tar.write_bytes(tar.read_bytes()[:-1024])
    rmi(image)
    capsys.readouterr()
    assert infracache.main(["import", str(out)]) == 2
    one_line_error(capsys, "images.tar has", "cut short")
    assert snapshot(cache) == before
    assert image_id(image) is None


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        (None, ("holds no manifest.json",)),
        ('{"format": 1}', ("not a gpulab export manifest", "no 'key'")),
        ("[1, 2]", ("not a JSON object",)),
    ],
    ids=["no-manifest", "no-key", "not-an-object"],
)
def test_a_directory_that_is_no_export_is_refused_in_one_line(
    cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    manifest: str | None,
    words: tuple[str, ...],
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    if manifest is not None:
        (src / "manifest.json").write_text(manifest)
    assert infracache.main(["import", str(src)]) == 2
    one_line_error(capsys, *words)
    assert not cache.exists()


def test_a_missing_directory_is_refused_in_one_line(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert infracache.main(["import", str(tmp_path / "absent")]) == 2
    one_line_error(capsys, "is not a directory")
    assert not cache.exists()


def test_export_leaves_a_directory_that_is_not_an_export_alone(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    products(cache, {})
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert infracache.main(["export", str(out)]) == 2
    assert "is not empty and holds no gpulab export" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_the_key_follows_what_make_infra_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULAB_KUBE_VERSION", raising=False)
    pinned = infracache.key()
    assert len(pinned) == 64 and int(pinned, 16) >= 0
    monkeypatch.setenv("GPULAB_KUBE_VERSION", "v1.36.1")  # one more node image
    assert infracache.key() != pinned


def test_gpulab_infra_key_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["infra", "key"]) == 0
    assert capsys.readouterr().out.strip() == infracache.key()
