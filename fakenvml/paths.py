"""Where gpulab's tools write, the same in a checkout and in an installed package.

Nothing is ever written next to the code: an installed package lives in site-packages,
which may be read-only and is shared by every user of the environment.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "GPULAB_CACHE"
SYSTEM_CACHE = Path("/var/cache/gpulab")


def write_if_changed(path: Path, text: str, mode: int = 0o444) -> None:
    """`path` holds `text` afterwards, replaced whole (a reader sees the old file or the
    new one, never a part) and only when it differs."""
    if path.is_file() and path.read_text() == text:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def writable(path: Path) -> bool:
    """path is (or could be created as) a directory this process may write."""
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def user_or_system(system: Path, user: Path) -> Path:
    """The machine-wide place where this process may write there (root on the lab and CI
    machines, so every clone shares one cache), else the per-user one."""
    return system if writable(system) else user


def cache_dir() -> Path:
    """$GPULAB_CACHE; else /var/cache/gpulab where writable; else ~/.cache/gpulab."""
    if given := os.environ.get(CACHE_ENV):
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return user_or_system(SYSTEM_CACHE, Path(xdg) / "gpulab")


def checkout() -> Path | None:
    """The source checkout these packages run from, or None for an installed package."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None
