"""`make infra`'s products as one directory a CI runner can cache and restore.

    gpulab infra export DIR [--with-build-caches]   # images + product dirs + infra.json
    gpulab infra import DIR                          # restored here; `make infra` is then warm
    gpulab infra key                                 # what an export must match to be imported

An export holds every Docker image infra.json records (one `docker save` tar: the lab
images share the base image's layers), the product directories the build scripts look for
before they build (bin/, nvidia-device-plugin/, nvidia-container-toolkit/, mig-parted/,
nvidia-smi/, nvidia-cuda-mps/, dra-driver/, rootfs/, images/, go/mod/: one tar each),
infra.json, and manifest.json (written last: a directory without it is no export). Images
pinned by registry digest are not exported: `docker load` cannot give an image back its
registry digest, so `make infra` pulls them again where a registry answers (GitHub
runners) — the only thing it does not find.

Go's module cache goes in always: warm steps read module sources from it (NVIDIA's DRA
driver, the charts subjects use), so without it they would download. Go's build cache and
debootstrap's package cache only speed up builds whose inputs changed, and within one key
nothing of gpulab's changes; they are GBs, so only --with-build-caches adds them (a plugin
team whose own Go plugin is built by `prepare:` may want them).

Import checks before it changes anything: the manifest's key is this checkout's (the pins,
the build scripts, the machine; `key`), and every file is whole (size and sha256).
Otherwise one line and exit 2. Then it loads the images, moves each product directory
into $GPULAB_CACHE with a rename (never half a product: a product is there whole or not
at all), and writes infra.json last.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from clusters import built, versions
from clusters.infra import infra

FORMAT = 1
MANIFEST = "manifest.json"
IMAGES_TAR = "images.tar"
INFRA_JSON = "infra.json"
# What the cache key hashes besides the pins: every script that makes a product, so a
# changed recipe never restores products its old version made under the same names.
KEY_INPUTS = ("clusters/versions.env", "clusters/infra/scripts", "clusters/infra/nodeimage",
              "clusters/infra/images")  # fmt: skip


@dataclass(frozen=True)
class Part:
    path: str  # relative to $GPULAB_CACHE
    build_cache: bool = False  # only with --with-build-caches
    go: bool = False  # Go's own trees: exported byte for byte, nothing left out

    @property
    def tar(self) -> str:
        return f"parts/{self.path.replace('/', '-')}.tar"


PARTS = (
    Part("bin"),  # kind, helm, Kubernetes, etcd, CoreDNS, crictl, pause, nfd, actionlint
    Part("nvidia-device-plugin"),
    Part("nvidia-container-toolkit"),  # linked from nvidia-device-plugin/<v>/
    Part("mig-parted"),  # nvidia-mig-parted, nvidia-mig-manager (mig-parted.sh)
    Part("gpu-operator"),  # the operator, validator, its assets and chart (gpu-operator.sh)
    Part("nvidia-smi"),
    Part("nvidia-cuda-mps"),  # the MPS control daemon and server (ci/nvidia-smi.sh)
    Part("dra-driver"),
    Part("rootfs"),  # the node image's root filesystem tar
    Part("images"),  # control-plane image tars, the workload's busybox .deb
    Part("go/mod", go=True),
    Part("go/build", build_cache=True, go=True),
    Part("debootstrap-debs", build_cache=True),
)
# Work in progress and scratch the scripts leave beside their products (lib.sh's
# fresh_tmp, the .build.* dirs, docker build contexts, locks, logs): never products.
SCRATCH = ("*.tmp.*", ".build.*", "*.ctx", ".lock", "*.log", "wheels", "*.d", ".import.*")


class Refused(Exception):
    """Bad input or a state the command cannot start from; nothing was changed."""


def key() -> str:
    """sha256 of what decides whether an export's products are this checkout's: the pins
    and the versions they resolve to here ($GPULAB_KUBE_VERSION and the other overrides
    build more), the build scripts, the architecture and the OS release (binaries are
    built against the runner's glibc)."""
    h = hashlib.sha256()
    kube, nvidia = versions.kube_versions(), versions.nvidia_plugin_versions()
    kubelets = versions.kubelet_versions()
    h.update(f"format {FORMAT}\0kube {kube}\0kubelet {kubelets}\0nvidia {nvidia}\0".encode())
    h.update(f"{platform.machine()}\0{_os_release()}\0".encode())
    for rel in KEY_INPUTS:
        path = built.ROOT / rel
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            h.update(str(f.relative_to(built.ROOT)).encode() + b"\0")
            h.update(f.read_bytes() if f.exists() else b"<missing>")
    return h.hexdigest()


def _os_release() -> str:
    try:
        lines = Path("/etc/os-release").read_text().splitlines()
    except OSError:
        return "unknown"
    fields = dict(line.split("=", 1) for line in lines if "=" in line)
    return f"{fields.get('ID', '').strip(chr(34))} {fields.get('VERSION_ID', '').strip(chr(34))}"


# -- export ------------------------------------------------------------------------------


def export(out: Path, build_caches: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Write the cache's products, its images and infra.json to `out`; returns the manifest.
    Refused (nothing written) when there is nothing to export or `out` is someone else's."""
    cache = built.cache_dir()
    record = cache / INFRA_JSON
    if not record.is_file():
        raise Refused(f"nothing to export: no {record}; {built.MAKE_INFRA} first")
    if out.exists() and not (out.is_dir() and _ours(out)):
        raise Refused(f"{out} is not empty and holds no gpulab export; name a new or empty "
                      "directory")  # fmt: skip
    products = _read_json(record, "infra.json")
    refs = _recorded_images(products)
    if refs and not built.docker_answers():
        raise Refused(f"no Docker engine answers, and {len(refs)} recorded images are in it")
    r = infra.Runner(console)
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    # From here on the directory is no export until the new manifest is written.
    (out / MANIFEST).unlink(missing_ok=True)
    images, skipped = [], []
    for ref in refs:
        why = _not_exported(ref)
        if why:
            skipped.append({"ref": ref, "why": why})
            r.console.print(f"[yellow]-[/] Image {ref}: not exported ({why})", highlight=False)
            continue
        image = {"ref": ref, "id": ""}
        r.step(f"Image {ref}", lambda i=image: _short(i.update(id=_image_id(i["ref"])) or i["id"]))
        images.append(image)
    files: dict[str, dict[str, Any]] = {}
    if images:

        def save() -> str:
            tmp = out / f"{IMAGES_TAR}.tmp"
            r.script("docker save", "infra-export-images", "/usr/bin/env", "docker", "save",
                     "-o", str(tmp), *[i["ref"] for i in images])  # fmt: skip
            tmp.chmod(0o644)  # docker writes 0600; the CI cache saves as another user
            tmp.rename(out / IMAGES_TAR)
            return _size(out / IMAGES_TAR)

        r.step(f"docker save ({_n(len(images), 'image')}, shared layers once)", save)
        files[IMAGES_TAR] = {}
    parts = []
    for part in PARTS:
        if part.build_cache and not build_caches:
            continue
        names = _products(cache / part.path)
        if not names:
            continue
        r.step(f"Cache part {part.path} ({_n(len(names), 'entry', 'entries')})",
               lambda p=part, n=names: _pack(r, cache, p, n, out))  # fmt: skip
        parts.append({"path": part.path, "products": names})
        files[part.tar] = {}
    shutil.copyfile(record, out / INFRA_JSON)
    files[INFRA_JSON] = {}
    _remove_others(out, set(files))

    def checksums() -> str:
        for name in files:
            files[name] = {"size": (out / name).stat().st_size, "sha256": _sha256(out / name)}
        return _human(sum(f["size"] for f in files.values()))

    r.step(f"Checksums of {_n(len(files), 'file')}", checksums)
    manifest = {"format": FORMAT, "key": key(), "cache": str(cache),
                "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "images": images, "skipped_images": skipped,
                "parts": parts, "files": files}  # fmt: skip
    _write_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    r.console.print(f"[bold green]Exported[/] to {out} in {time.monotonic() - t0:.1f}s "
                    f"[dim](key {manifest['key'][:16]}…)[/]", highlight=False)  # fmt: skip
    return manifest


def _ours(out: Path) -> bool:
    """`out` is empty, or holds only what an export writes (an earlier one, finished or
    killed), which this one replaces."""
    names = {MANIFEST, IMAGES_TAR, f"{IMAGES_TAR}.tmp", INFRA_JSON, "parts"}
    return all(f.name in names or f.name.startswith(f"{MANIFEST}.tmp.") for f in out.iterdir())


def _recorded_images(products: dict[str, Any]) -> list[str]:
    """Every image infra.json names: node images, lab images, subject images."""
    refs: list[str] = []
    for field in ("node_images", "images", "subjects"):
        got = products.get(field) or {}
        if not isinstance(got, dict):
            raise Refused(f"infra.json: {field} is not a mapping; {built.MAKE_INFRA}")
        refs += [v for v in got.values() if isinstance(v, str) and v]
    return sorted(set(refs))


def _not_exported(ref: str) -> str:
    if "@sha256:" in ref:
        return "pinned by registry digest, which `docker load` cannot restore; make infra pulls it"
    if not built.image_present(ref):
        return "not in the Docker engine; make infra builds it"
    return ""


def _image_id(ref: str) -> str:
    got = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if got.returncode != 0:
        raise infra.InfraError(f"docker image inspect {ref}: {got.stderr.strip()}")
    return got.stdout.strip()


def _products(path: Path) -> list[str]:
    """The entries of a part directory that are products, not scratch."""
    if not path.is_dir():
        return []
    return sorted(
        p.name for p in path.iterdir() if not any(fnmatch.fnmatch(p.name, s) for s in SCRATCH)
    )


def _pack(r: infra.Runner, cache: Path, part: Part, names: list[str], out: Path) -> str:
    dest = out / part.tar
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tar.tmp")
    # Scratch inside product dirs too (nvidia-device-plugin/<v>/.build.*), but never
    # inside Go's trees, whose files are a module's or the compiler's, whatever their names.
    exclude = [] if part.go else [f"--exclude={s}" for s in ("*.tmp.*", ".build.*")]
    r.script(f"pack {part.path}", f"infra-export-{part.path.replace('/', '-')}", "/usr/bin/env",
             "tar", "-C", str(cache), "--numeric-owner", *exclude, "-cf", str(tmp),
             *[f"{part.path}/{n}" for n in names])  # fmt: skip
    tmp.rename(dest)
    return _size(dest)


def _remove_others(out: Path, keep: set[str]) -> None:
    """Files an earlier export left that this one does not list (a part now empty)."""
    for f in sorted(out.rglob("*"), reverse=True):
        rel = f.relative_to(out).as_posix()
        if f.is_file() and rel not in keep:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()


# -- import ------------------------------------------------------------------------------


def import_(src: Path, console: Console | None = None) -> dict[str, Any]:
    """Restore an export into $GPULAB_CACHE and the Docker engine; returns its manifest.
    Refused, with nothing changed, for a missing or broken export or another key."""
    manifest = check(src)
    cache = built.cache_dir()
    if manifest["images"] and not built.docker_answers():
        raise Refused("no Docker engine answers to load the images into; start one "
                      "(`gpulab infra engine`) and import again")  # fmt: skip
    r = infra.Runner(console)
    t0 = time.monotonic()
    if manifest["images"]:

        def load() -> str:
            r.script("docker load", "infra-import-images", "/usr/bin/env", "docker", "load",
                     "-q", "-i", str(src / IMAGES_TAR))  # fmt: skip
            return _size(src / IMAGES_TAR)

        r.step(f"docker load ({_n(len(manifest['images']), 'image')})", load)
        for image in manifest["images"]:
            r.step(f"Image {image['ref']}", lambda i=image: _same_image(i["ref"], i["id"]))
    cache.mkdir(parents=True, exist_ok=True)
    _clean_stale_imports(cache)
    work = cache / f".infra-import.{os.getpid()}"
    try:
        for part in manifest["parts"]:
            tar = next(p.tar for p in PARTS if p.path == part["path"])
            r.step(f"Cache part {part['path']} ({_n(len(part['products']), 'entry', 'entries')})",
                   lambda p=part, t=tar: _unpack(r, src / t, cache, work, p))  # fmt: skip
        text = (src / INFRA_JSON).read_text()
        if manifest["cache"] != str(cache):
            record = _relocated(json.loads(text), manifest["cache"], cache)
            text = json.dumps(record, indent=2) + "\n"
        _write_atomic(cache / INFRA_JSON, text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r.console.print(f"[bold green]Imported[/] {src} in {time.monotonic() - t0:.1f}s "
                    f"[dim](recorded in {cache / INFRA_JSON}; `make infra` finds it)[/]",
                    highlight=False)  # fmt: skip
    return manifest


def check(src: Path) -> dict[str, Any]:
    """The export's manifest, checked against this checkout and the files beside it;
    Refused with one line for anything amiss. Reads, changes nothing."""
    if not src.is_dir():
        raise Refused(f"{src} is not a directory")
    path = src / MANIFEST
    if not path.is_file():
        raise Refused(f"{src} holds no {MANIFEST}: not a gpulab export, or an unfinished one")
    m = _read_json(path, MANIFEST)
    with _shape(path):
        if m["format"] != FORMAT:
            raise Refused(f"{path}: format {m['format']!r}, this gpulab reads {FORMAT}")
        here = key()
        if m["key"] != here:
            raise Refused(f"{src} was exported for key {str(m['key'])[:16]}…, this checkout's "
                          f"is {here[:16]}… (pins, build scripts or machine differ); "
                          f"run `make infra` instead")  # fmt: skip
        _need(isinstance(m["cache"], str), "cache is not a path")
        images, parts, files = m["images"], m["parts"], m["files"]
        for i in images:
            _need(isinstance(i["ref"], str) and isinstance(i["id"], str), f"image {i!r}")
        tars = {p.path: p.tar for p in PARTS}
        for p in parts:
            _need(p["path"] in tars, f"unknown part {p['path']!r}")
            _need(all(map(_plain_name, p["products"])), f"an entry of {p['path']} is no name")
        want = {INFRA_JSON} | ({IMAGES_TAR} if images else set())
        want |= {tars[p["path"]] for p in parts}
        _need(set(files) == want, f"files {sorted(files)}, expected {sorted(want)}")
        for name, meta in files.items():
            f = src / name
            if not f.is_file():
                raise Refused(f"{f} is missing; the export is incomplete, export again")
            size = f.stat().st_size
            if size != meta["size"]:
                raise Refused(f"{f} has {size} bytes, the manifest says {meta['size']}: "
                              "cut short or changed; export again")  # fmt: skip
        for name, meta in files.items():
            if _sha256(src / name) != meta["sha256"]:
                raise Refused(f"{src / name} does not match its sha256 in the manifest; "
                              "export again")  # fmt: skip
    _read_json(src / INFRA_JSON, "infra.json")
    return m


@contextlib.contextmanager
def _shape(path: Path) -> Iterator[None]:
    """A manifest of the wrong shape (a field missing or of another type) as one line."""
    try:
        yield
    except (KeyError, TypeError, _Bad) as e:
        detail = f"no {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
        raise Refused(f"{path} is not a gpulab export manifest ({detail}); export again") from e


class _Bad(Exception):
    """A manifest field of the wrong shape."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise _Bad(what)


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


def _same_image(ref: str, want: str) -> str:
    got = _image_id(ref)
    if got != want:
        raise infra.InfraError(f"{ref} loaded as {got}, the export recorded {want}")
    return _short(got)


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _unpack(r: infra.Runner, tar: Path, cache: Path, work: Path, part: dict[str, Any]) -> str:
    """Extract beside the cache (same file system), then rename each product into place:
    an interrupted import leaves every product either the old one, absent, or the new one."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    name = part["path"].replace("/", "-")
    r.script(f"unpack {part['path']}", f"infra-import-{name}", "/usr/bin/env", "tar", "-C",
             str(work), "--numeric-owner", "-xf", str(tar))  # fmt: skip
    trash = work / ".replaced"
    trash.mkdir()
    for product in part["products"]:
        new, dest = work / part["path"] / product, cache / part["path"] / product
        if not new.exists() and not new.is_symlink():
            raise infra.InfraError(f"{tar} lacks {part['path']}/{product}, listed in the manifest")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() or dest.is_symlink():
            dest.rename(trash / product)
        new.rename(dest)
    shutil.rmtree(work, ignore_errors=True)
    return f"{len(part['products'])} restored"


def _clean_stale_imports(cache: Path) -> None:
    """Work directories of imports that were killed (their process is gone)."""
    for d in cache.glob(".infra-import.*"):
        pid = d.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _relocated(value: Any, old: str, new: Path) -> Any:
    """infra.json's paths under the exporting machine's cache, moved under this one's."""
    if isinstance(value, dict):
        return {k: _relocated(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, old, new) for v in value]
    if isinstance(value, str) and value.startswith(old.rstrip("/") + "/"):
        return str(new) + value[len(old.rstrip("/")) :]
    return value


# -- small helpers -----------------------------------------------------------------------


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Refused(f"{path} is not readable JSON ({e}); {what} is corrupt") from e
    if not isinstance(data, dict):
        raise Refused(f"{path} is not a JSON object; {what} is corrupt")
    return data


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _n(count: int, one: str, many: str = "") -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _size(path: Path) -> str:
    return _human(path.stat().st_size)


# -- command line ------------------------------------------------------------------------

COMMANDS = ("export", "import", "key")


def main(argv: list[str], prog: str = "gpulab infra") -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write the cache's products and images to DIR")
    ex.add_argument("dir", type=Path, metavar="DIR")
    ex.add_argument("--with-build-caches", action="store_true",
                    help="add Go's build cache and debootstrap's package cache (GBs)")  # fmt: skip
    im = sub.add_parser("import", help="restore an export into $GPULAB_CACHE and Docker")
    im.add_argument("dir", type=Path, metavar="DIR")
    sub.add_parser("key", help="print the key an export must carry to be imported here")
    args = ap.parse_args(argv)
    run: Callable[[], object]
    if args.cmd == "key":
        print(key())
        return 0
    if args.cmd == "export":
        run = lambda: export(args.dir, args.with_build_caches)  # noqa: E731
    else:
        run = lambda: import_(args.dir)  # noqa: E731
    try:
        run()
    except (Refused, built.InfraMissing) as e:
        print(f"infra {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except infra.InfraError:
        return 1  # the failed step's ✗ line and log tail are printed already
    except KeyboardInterrupt:
        return 130
    return 0
