"""Build libnvidia-ml.so.1: compile the hand-written C, generate stubs for the rest of
nvml.h, link with SONAME libnvidia-ml.so.1 exporting only nvml* symbols. Beside it,
libcuda.so.1, the driver root's CUDA stub (src/cuda/libcuda.c).

    python -m fakenvml.native.build [--variant release|asan] [--out build]

Variants: release (-O2), asan (-fsanitize=address,undefined, for the sanitizer run of
the test suite). The fuzz target is built by the Makefile with clang (libFuzzer).
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import subprocess
import sys
import time
from pathlib import Path

from fakenvml.native import header, stubs
from fakenvml.paths import write_if_changed

SRC = Path(__file__).resolve().parent.parent / "src"
SONAME = "libnvidia-ml.so.1"
CUDA_SONAME = "libcuda.so.1"
CFLAGS = [
    "-std=gnu2x", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror",
    "-Wno-unused-parameter", "-fvisibility=default", *header.DEFINES,
]  # fmt: skip
VARIANTS = {
    "release": ["-O2", "-g"],
    "asan": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all"],
}  # fmt: skip
# Exported beyond nvml.h: the private interface NVIDIA's nvidia-smi needs (export_table.c).
INTERNAL = frozenset({"nvmlInternalGetExportTable"})


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"build failed: {shlex.join(cmd[:3])} ...")
    return res.stdout


def sources() -> list[Path]:
    return sorted(SRC.glob("*.c"))


def implemented(objects: list[Path]) -> set[str]:
    """nvml* functions the hand-written objects define (what `nm` sees, not a list we keep)."""
    out = _run(["nm", "--defined-only", *map(str, objects)])
    return {line.split()[-1] for line in out.splitlines() if " T nvml" in line}


def _inputs(flags: list[str], hdr: Path) -> str:
    """A digest of everything the build reads: the C sources and headers, nvml.h, this
    package's generators, the flags and the compiler."""
    h = hashlib.sha256()
    files = [p for p in sorted(SRC.rglob("*")) if p.is_file()]
    for p in [*files, hdr, *sorted(Path(__file__).parent.glob("*.py"))]:
        h.update(f"{p.name}\0".encode() + p.read_bytes())
    h.update(shlex.join(flags).encode() + _run(["gcc", "--version"]).encode())
    return h.hexdigest()


def build(variant: str, out: Path) -> Path:
    """The library of `variant` under `out`, built unless the one there was built from the
    same inputs (every `make` target that needs it asks: a warm `make test` built it eight
    times, 3 s each)."""
    t0 = time.monotonic()
    hdr = header.path()
    # Paths of the checkout out of the debug info: every clone builds the same bytes, so
    # the gpulab image (keyed by the library's content) is shared by clones of one commit.
    repo = SRC.parents[1]
    flags = [*CFLAGS, *VARIANTS[variant], f"-ffile-prefix-map={repo}=.",
             f"-ffile-prefix-map={out.resolve()}=build", f"-I{hdr.parent}", f"-I{SRC}"]  # fmt: skip
    obj_dir, gen_dir, lib_dir = out / "obj" / variant, out / "gen", out / variant
    lib, stamp = lib_dir / SONAME, lib_dir / ".inputs"
    key = _inputs(flags, hdr)
    made = (lib, lib_dir / CUDA_SONAME, gen_dir / "stubs.c", gen_dir / "implemented.txt")
    if stamp.is_file() and stamp.read_text() == key and all(p.is_file() for p in made):
        print(f"fakenvml: {lib} ({variant}) is up to date")
        return lib
    stamp.unlink(missing_ok=True)  # a build stopped halfway leaves no stamp
    for d in (obj_dir, gen_dir, lib_dir):
        d.mkdir(parents=True, exist_ok=True)
    objects = []
    for src in sources():
        obj = obj_dir / (src.stem + ".o")
        _run(["gcc", *flags, "-c", str(src), "-o", str(obj)])
        objects.append(obj)
    decls = header.declarations(hdr)
    declared = {d.name for d in decls}
    impl = implemented(objects) - INTERNAL
    unknown = impl - declared
    if unknown:
        raise SystemExit(f"build failed: not declared in nvml.h: {', '.join(sorted(unknown))}")
    stub_c = gen_dir / "stubs.c"
    # Both variants write gen/, and `make test` builds the ASan one while the unit tier
    # reads implemented.txt (tests/fakenvml/test_api.py): replaced whole, when it differs.
    write_if_changed(stub_c, stubs.stubs_source(decls, impl), 0o644)
    stub_o = obj_dir / "stubs.o"
    _run(["gcc", *flags, "-c", str(stub_c), "-o", str(stub_o)])
    write_if_changed(gen_dir / "implemented.txt", "".join(f"{n}\n" for n in sorted(impl)))
    _run([
        "gcc", "-shared", "-pthread", *VARIANTS[variant], f"-Wl,-soname,{SONAME}",
        f"-Wl,--version-script={SRC / 'exports.map'}", "-Wl,-z,defs",
        *stubs.alias_flags(header.aliases(hdr), declared),
        "-o", str(lib), *map(str, objects), str(stub_o),
    ])  # fmt: skip
    # The CUDA driver stub beside it (src/cuda: not part of libnvidia-ml).
    _run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", *VARIANTS[variant],
          f"-Wl,-soname,{CUDA_SONAME}", "-o", str(lib_dir / CUDA_SONAME),
          str(SRC / "cuda" / "libcuda.c")])  # fmt: skip
    stamp.write_text(key)
    print(
        f"fakenvml: built {lib} ({variant}): {len(impl)} implemented, "
        f"{len(declared) - len(impl)} stubs, {time.monotonic() - t0:.1f}s"
    )
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="release")
    ap.add_argument("--out", type=Path, default=Path("build"))
    args = ap.parse_args()
    build(args.variant, args.out)


if __name__ == "__main__":
    main()
