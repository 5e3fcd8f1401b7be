"""Locate the built libnvidia-ml.so.1 and make nvidia-ml-py bind to it.

pynvml loads "libnvidia-ml.so.1" by name. glibc's dlopen matches a name against the
SONAME of objects already loaded, so loading our file first (RTLD_GLOBAL) makes every
later CDLL("libnvidia-ml.so.1") in this process resolve to it, with no LD_LIBRARY_PATH.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

from fakenvml import paths
from fakenvml.errors import FakeNvmlError

LIBRARY_ENV = "FAKENVML_LIBRARY"
SONAME = "libnvidia-ml.so.1"
CUDA_SONAME = "libcuda.so.1"
SRC = Path(__file__).resolve().parent / "src"


def build_dir() -> Path:
    """Where `build()` puts its tree (release/, gen/, obj/): the checkout's build/, or for
    an installed package a cache directory keyed by the C sources, so an upgrade that
    changes them never finds an older library."""
    if (root := paths.checkout()) is not None:
        return root / "build"
    h = hashlib.sha256()
    for f in sorted(p for p in SRC.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(SRC)).encode() + b"\0" + f.read_bytes())
    return paths.cache_dir() / "fakenvml" / h.hexdigest()[:12]


def default_path() -> Path:
    return build_dir() / "release" / SONAME


def path() -> Path:
    """The library file: $FAKENVML_LIBRARY, else the release build of build_dir()."""
    candidate = Path(os.environ.get(LIBRARY_ENV) or default_path())
    if not candidate.is_file():
        how = "make install" if paths.checkout() else "fakenvml build"
        raise FakeNvmlError(f"{candidate} not found: run `{how}` (or set {LIBRARY_ENV})")
    return candidate


def cuda_path() -> Path:
    """The CUDA driver stub built beside the library (fakenvml/src/cuda/libcuda.c)."""
    candidate = path().parent / CUDA_SONAME
    if not candidate.is_file():
        raise FakeNvmlError(f"{candidate} not found: rebuild the library (make install)")
    return candidate


_loaded: ctypes.CDLL | None = None


def preload() -> ctypes.CDLL:
    """Load the fake library globally (once) so pynvml binds to it."""
    global _loaded
    if _loaded is None:
        _loaded = ctypes.CDLL(str(path()), mode=ctypes.RTLD_GLOBAL)
    return _loaded
