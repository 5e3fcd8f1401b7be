"""Keep the docs' list of implemented NVML functions equal to what the build found.

python -m fakenvml.native.readme          # rewrite the block in docs/fakenvml.md, and
                                          # fakenvml/nvml_functions.txt (the exports)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fakenvml import docblock

REPO = Path(__file__).resolve().parents[2]
IMPLEMENTED = REPO / "build" / "gen" / "implemented.txt"
# The page that lists them ("Implemented NVML functions: N functions").
DOC = REPO / "docs" / "fakenvml.md"
BLOCK = "implemented"  # its <!-- implemented:start --> ... <!-- implemented:end -->
_COUNT_PREFIX = "## Implemented NVML functions: "
_COUNT = re.compile(re.escape(_COUNT_PREFIX) + r"\d+ functions")


def implemented() -> list[str]:
    return sorted(IMPLEMENTED.read_text().split())


def block(names: list[str]) -> str:
    return "```\n" + "\n".join(names) + "\n```"


def listed(doc: str) -> list[str]:
    inner = docblock.between(doc, BLOCK) or ""
    return [ln for ln in inner.splitlines() if ln.startswith("nvml")]


def main() -> None:
    text = DOC.read_text()
    names = implemented()
    text = docblock.rewrite(text, BLOCK, block(names))
    text = _COUNT.sub(f"{_COUNT_PREFIX}{len(names)} functions", text)
    DOC.write_text(text)
    print(f"{DOC.relative_to(REPO)} lists {len(names)} implemented functions")
    from fakenvml import knobs, library

    out = subprocess.run(["nm", "-D", "--defined-only", str(library.path())],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    symbols = (ln.split()[-1] for ln in out.splitlines())
    exported = sorted(n for n in symbols if n.startswith("nvml"))
    knobs.FUNCTIONS_FILE.write_text("".join(f"{n}\n" for n in exported))
    print(f"{knobs.FUNCTIONS_FILE.name} lists {len(exported)} exported functions")


if __name__ == "__main__":
    main()
