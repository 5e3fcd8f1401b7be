"""The README stays a front page, and its links (and the changelog's) lead somewhere.

The pages under docs/ are checked by `make docs` (mkdocs --strict with link and anchor
validation); README.md and CHANGELOG.md live outside the site, so their relative links and
#anchors are checked here, with GitHub's anchors (where both are read).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """Markdown without code blocks and code spans: links there are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (mkdocs.yml makes the site's the same)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(prose(path.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_lead_to_a_file_and_heading(name: str) -> None:
    source = REPO / name
    broken = []
    for target in links(source):
        file_part, _, anchor = target.partition("#")
        dest = (source.parent / file_part).resolve() if file_part else source
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{name}: " + "; ".join(broken)


def test_the_readme_is_a_front_page() -> None:
    text = (REPO / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the guides go in docs/"
    # .ci/run runs `make test`: the README names it as the test command.
    assert "`make test`" in text and ".ci/run" in text


_TARGET = re.compile(r"^([a-z][a-z0-9-]*):(?!=)", re.M)
_TABLE_COMMAND = re.compile(r"`make ([a-z][a-z0-9-]*)")


def make_targets() -> tuple[set[str], set[str]]:
    """(every target of the Makefile and the files it includes, the internal ones)."""
    files = [REPO / "Makefile", REPO / "ci" / "cluster.mk"]
    targets = {t for f in files for t in _TARGET.findall(f.read_text())}
    internal = re.search(r"^INTERNAL_TARGETS := (.*)$", files[0].read_text(), re.M)
    assert internal, "Makefile: no INTERNAL_TARGETS line"
    return targets, set(internal[1].split())


def table_commands(path: Path) -> set[str]:
    """The `make X` commands named in the first cell of a table row."""
    lines = path.read_text().splitlines()
    rows = (line.split("|")[1] for line in lines if line.startswith("| `make"))
    return {t for cell in rows for t in _TABLE_COMMAND.findall(cell)}


@pytest.mark.parametrize("name", ["README.md", "docs/index.md"])
def test_the_command_table_lists_every_make_target_but_the_internal_ones(name: str) -> None:
    targets, internal = make_targets()
    assert internal <= targets, f"INTERNAL_TARGETS names no target: {internal - targets}"
    listed = table_commands(REPO / name)
    assert listed - targets == set(), f"{name} lists commands the Makefile lacks"
    assert targets - internal - listed == set(), f"{name}'s command table lacks these"


_LAB_LIST = re.compile(r"the ([a-z][\w-]*(?:, [a-z][\w-]*)*,? and [a-z][\w-]*) labs")
_LAB_FILES = re.compile(r"`clusters/labs/\{([a-z,-]+)\}\.yaml`")


def lab_lists(text: str) -> list[set[str]]:
    """Each line's labs as prose names them ("the seed, hetero and mig labs", all such
    lists of the line together) or as a file pattern (`clusters/labs/{seed,hetero}.yaml`)."""
    found = []
    for line in text.splitlines():
        names = {n for m in _LAB_LIST.findall(line) for n in re.split(r",? and |, ", m)}
        names |= {n for m in _LAB_FILES.findall(line) for n in m.split(",")}
        if names:
            found.append(names)
    return found


@pytest.mark.parametrize("name", ["README.md", "docs/index.md", "docs/labs.md"])
def test_lists_of_the_labs_name_every_shipped_lab(name: str) -> None:
    shipped = {p.stem for p in (REPO / "clusters/labs").glob("*.yaml")}
    lists = lab_lists((REPO / name).read_text())
    assert lists, f"{name} lists no labs: the check reads nothing"
    for names in lists:
        assert names == shipped, f"{name}: a list of labs says {sorted(names)}"


def test_the_checks_see_links_and_anchors(tmp_path: Path) -> None:
    """The helpers above against a page whose answers are known."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## CDI: `nvidia-cdi` (NVIDIA's `cdi-cri` strategy)\n\n## A — B / C\n\n"
        "## Top\n\n[x](other.md#y) `[not](a-link.md)` [web](https://example.com)\n"
        "```\n[in](code.md)\n```\n"
    )
    assert anchors(page) == {
        "top",
        "cdi-nvidia-cdi-nvidias-cdi-cri-strategy",
        "a--b--c",
        "top-1",
    }
    assert links(page) == ["other.md#y"]
    assert lab_lists("then the seed, hetero and mig labs; the dra and stock labs\n"
                     "specs (`clusters/labs/{seed,wide}.yaml`)") == [
        {"seed", "hetero", "mig", "dra", "stock"}, {"seed", "wide"}]  # fmt: skip
