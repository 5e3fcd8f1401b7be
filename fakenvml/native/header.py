"""NVIDIA's nvml.h, from the pinned PyPI package nvidia-nvml-dev, and what it declares.

Declarations come from the compiler itself (gcc -aux-info), not from regexes over the
header text, so macros, attributes and line breaks are handled exactly as a C consumer
sees them. NVML_NO_UNVERSIONED_FUNC_DEFS makes every versioned and legacy name a
declaration of its own (nvmlInit and nvmlInit_v2, ...), which is what we must export.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fakenvml.errors import FakeNvmlError

DEFINES = ["-DNVML_NO_UNVERSIONED_FUNC_DEFS"]


@dataclass(frozen=True)
class Declaration:
    name: str
    returns: str
    params: str  # the parameter type list as gcc prints it


def path() -> Path:
    """nvml.h inside the installed nvidia-nvml-dev wheel."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        for candidate in sorted(Path(root).glob("cu*/include/nvml.h")):
            return candidate
    raise FakeNvmlError("nvml.h not found: pip install the `build` extra (nvidia-nvml-dev)")


# One line of gcc -aux-info: /* path:line:flags */ extern <ret> <name> (<params>);
_AUX = re.compile(
    r"^/\* (?P<file>[^:]+):\d+:\w+ \*/ extern (?P<ret>.+?)\b(?P<name>nvml\w+) \((?P<params>.*)\);$"
)


def declarations(header: Path) -> list[Declaration]:
    """Every function nvml.h declares, in header order."""
    with tempfile.TemporaryDirectory() as tmp:
        aux = Path(tmp) / "aux.txt"
        subprocess.run(
            ["gcc", *DEFINES, "-fsyntax-only", "-aux-info", str(aux), "-x", "c", str(header)],
            check=True,
        )
        lines = aux.read_text().splitlines()
    out = []
    for line in lines:
        m = _AUX.match(line)
        if m and Path(m["file"]).name == "nvml.h":
            out.append(Declaration(m["name"], m["ret"].strip(), m["params"]))
    return out


_ALIAS = re.compile(r"^\s*#define\s+(nvml\w+)\s+(nvml\w+)\s*$")


def aliases(header: Path) -> dict[str, str]:
    """The unversioned -> versioned function names the header maps with #define."""
    text = header.read_text()
    start = text.index("#ifndef NVML_NO_UNVERSIONED_FUNC_DEFS")
    block = text[start : text.index("#endif", start)]
    return {m[1]: m[2] for line in block.splitlines() if (m := _ALIAS.match(line))}
