"""Keep the docs' list of implemented NVML functions equal to what the build found.

python -m fakenvml.native.readme          # rewrite the block in docs/fakenvml.md, and
                                          # fakenvml/nvml_functions.txt (the exports)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMPLEMENTED = REPO / "build" / "gen" / "implemented.txt"
# The page that lists them ("Implemented NVML functions: N functions").
DOC = REPO / "docs" / "fakenvml.md"
START, END = "<!-- implemented:start -->", "<!-- implemented:end -->"
_BLOCK = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
_COUNT_PREFIX = "## Implemented NVML functions: "
_COUNT = re.compile(re.escape(_COUNT_PREFIX) + r"\d+ functions")


def implemented() -> list[str]:
    return sorted(IMPLEMENTED.read_text().split())


def block(names: list[str]) -> str:
    return f"{START}\n```\n" + "\n".join(names) + f"\n```\n{END}"


def listed(doc: str) -> list[str]:
    m = _BLOCK.search(doc)
    if not m:
        return []
    return [ln for ln in m.group(0).splitlines()[1:-1] if ln.startswith("nvml")]


def main() -> None:
    text = DOC.read_text()
    names = implemented()
    text = _BLOCK.sub(lambda _: block(names), text)
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
