"""Install the fake library into a node's driver root, the way a driver container does.

    <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1   (and libnvidia-ml.so -> .so.1)

NVIDIA's plugin looks for libnvidia-ml.so.1 under its container driver root (/driver-root)
before the normal search path; our plugin is pointed there with LD_LIBRARY_PATH.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fakenvml import library
from fakenvml.errors import FakeNvmlError

LIB_DIR = Path("usr/lib/x86_64-linux-gnu")


def install(root: Path) -> Path:
    """Copy the library under `root` atomically (a running plugin keeps its mapped copy)."""
    src = library.path()
    dest_dir = root / LIB_DIR
    dest = dest_dir / library.SONAME
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", dir=dest_dir)
        os.close(fd)
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
        link = dest_dir / "libnvidia-ml.so"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(library.SONAME)
    except OSError as e:
        raise FakeNvmlError(f"cannot install the library under {root}: {e.strerror}") from None
    return dest
