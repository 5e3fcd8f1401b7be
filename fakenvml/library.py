"""Locate the built libnvidia-ml.so.1 and make nvidia-ml-py bind to it.

pynvml loads "libnvidia-ml.so.1" by name. glibc's dlopen matches a name against the
SONAME of objects already loaded, so loading our file first (RTLD_GLOBAL) makes every
later CDLL("libnvidia-ml.so.1") in this process resolve to it, with no LD_LIBRARY_PATH.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from fakenvml.errors import FakeNvmlError

LIBRARY_ENV = "FAKENVML_LIBRARY"
SONAME = "libnvidia-ml.so.1"
_REPO_BUILD = Path(__file__).resolve().parent.parent / "build" / "release" / SONAME


def path() -> Path:
    """The library file: $FAKENVML_LIBRARY, else the repository's build/lib."""
    candidate = Path(os.environ.get(LIBRARY_ENV, _REPO_BUILD))
    if not candidate.is_file():
        raise FakeNvmlError(f"{candidate} not found: run `make install` (or set {LIBRARY_ENV})")
    return candidate


_loaded: ctypes.CDLL | None = None


def preload() -> ctypes.CDLL:
    """Load the fake library globally (once) so pynvml binds to it."""
    global _loaded
    if _loaded is None:
        _loaded = ctypes.CDLL(str(path()), mode=ctypes.RTLD_GLOBAL)
    return _loaded
