"""Walk every profile through the library and count what its layers answer and source: the
table "How each profile answers" in docs/fakenvml.md and the README, written from here so it
cannot go stale (tests/fakenvml/test_boards.py holds both pages to it).

    python -m fakenvml.boards       # rewrite the table in both pages (needs the build)

Each profile is one GPU on a bare-metal node under the default driver, walked as
fakenvml.walk walks a real GPU (~830 calls).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fakenvml import branches, docblock, families, inventory, profiles
from fakenvml.model import Gpu, Node

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "fakenvml.md"
PAGES = (DOC, REPO / "README.md")  # the guide, and the front page's summary of it
BLOCK = "boards"  # the pages' <!-- boards:start --> ... <!-- boards:end -->
SUCCESS = "SUCCESS"


def node_of(key: str) -> Node:
    """One GPU of profile `key` on a bare-metal node under the default driver."""
    return inventory.from_dict({"gpus": [{"profile": key}]}, f"walk-{key.lower()}")


@contextmanager
def state_of(node: Node, where: Path) -> Iterator[None]:
    """The library reads `node` (written under `where`) until the block ends."""
    from fakenvml.node import STATE_DIR_ENV, NodeDir

    d = NodeDir(where / node.name)
    d.init(node)
    before = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(d.path)
    try:
        yield
    finally:
        if before is None:
            del os.environ[STATE_DIR_ENV]
        else:
            os.environ[STATE_DIR_ENV] = before


def walk_node(node: Node, where: Path) -> dict[str, Any]:
    """fakenvml.walk of GPU 0 of `node` (the library loaded, NVML not initialised)."""
    import pynvml

    from fakenvml import walk

    with state_of(node, where):
        try:
            return walk.walk(0)
        finally:
            pynvml.nvmlShutdown()


@dataclass(frozen=True)
class Row:
    key: str
    family: str
    success: int  # calls the walk answered with SUCCESS
    walked: int
    declared: int  # the calls the family says a board of it answers
    declared_ok: int  # of those, answered with SUCCESS
    board_sourced: int
    board_unsourced: int
    family_sourced: int
    family_unsourced: int


def row(key: str, gpu: Gpu, walked: dict[str, Any]) -> Row:
    p = profiles.PROFILES[key]
    declared = p.family.answers(gpu)
    stated = profiles.stated(p)
    fam_stated = families.stated(p.family)
    return Row(
        key=key,
        family=p.family.key,
        success=sum(1 for a in walked.values() if a["rc"] == SUCCESS),
        walked=len(walked),
        declared=len(declared),
        declared_ok=sum(1 for k in declared if walked.get(k, {}).get("rc") == SUCCESS),
        board_sourced=len([v for v in stated if v not in p.unsourced]),
        board_unsourced=len([v for v in stated if v in p.unsourced]),
        family_sourced=len([v for v in fam_stated if v not in p.family.unsourced]),
        family_unsourced=len([v for v in fam_stated if v in p.family.unsourced]),
    )


def rows(where: Path) -> list[Row]:
    out = []
    for key in profiles.PROFILES:
        node = node_of(key)
        out.append(row(key, node.gpus[0], walk_node(node, where)))
    return out


def table(rows: list[Row]) -> str:
    branch = branches.R580
    lines = [
        "| profile | family | SUCCESS of the walk | the family's calls answered "
        "| board values sourced / unsourced | family values sourced / unsourced |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.key} | {r.family} | {r.success} of {r.walked} | {r.declared_ok} of "
            f"{r.declared} | {r.board_sourced} / {r.board_unsourced} "
            f"| {r.family_sourced} / {r.family_unsourced} |"
            for r in rows
        ),
        "",
        f"Driver layer (R{branch.major}, every profile): {len(branch.rejected_fields)} rejected "
        f"field-id ranges, {len(branch.refusals)} captured argument refusals, "
        f"{len(branch.unsourced)} unsourced values.",
    ]
    return "\n".join(lines)


def main() -> None:
    from fakenvml import library

    library.preload()
    with tempfile.TemporaryDirectory(prefix="fakenvml-boards-") as tmp:
        block = table(rows(Path(tmp)))
    for page in PAGES:
        try:
            page.write_text(docblock.rewrite(page.read_text(), BLOCK, block))
        except ValueError as e:
            raise SystemExit(f"{page}: {e} to rewrite") from None
        print(f"{page.relative_to(REPO)}: the table of {len(profiles.PROFILES)} profiles rewritten")


def listed(text: str) -> str | None:
    """The table a page (docs/fakenvml.md, the README) holds now, or None."""
    return docblock.between(text, BLOCK)


if __name__ == "__main__":
    main()
