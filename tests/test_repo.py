"""What the repository's tracked files must not hold, whoever wrote them: a citation no
reader can follow (a session's search-tool id), a path that exists on one machine only,
or a recipe that fetches or builds another project's source (a subject names the image
its user built: docs/subjects.md).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().relative_to(REPO).as_posix()

# A session's search-tool citation ("find" "_string" id ...), joined here so that no file,
# this one included, holds the literal the check looks for.
SEARCH_ID = "find" + "_string"
# An absolute path under one machine's checkout or home, where a path starts: after a
# space, quote, bracket, `=`, `:` or `,` (not `$tmp/root/...` or `lookup/root/root.go`).
MACHINE_PATH = re.compile(r"(?:^|[\s\"'`(\[{<=:,;])(/(?:work|root)/[^\s\"'`)]*)", re.M)
FETCH = re.compile(r"\bgit\s+clone\b")


def tracked() -> dict[str, str]:
    """Every text file (no NUL byte) git tracks, or would track once added (not ignored),
    path -> text, as the working tree has it."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True)  # fmt: skip
    files: dict[str, str] = {}
    for name in out.stdout.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():  # deleted in the working tree, or a submodule
            continue
        data = path.read_bytes()
        if b"\0" not in data:
            files[name] = data.decode("utf-8", "replace")
    return files


def is_script(name: str, text: str) -> bool:
    return name.endswith((".sh", ".bash")) or text.startswith("#!")


def machine_paths(text: str) -> list[str]:
    return [m.group(1) for m in MACHINE_PATH.finditer(text)]


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    found = tracked()
    assert "README.md" in found and HERE in found, "git ls-files did not list this checkout"
    return found


def test_no_file_cites_a_search_tool_id(files: dict[str, str]) -> None:
    cited = sorted(n for n, text in files.items() if SEARCH_ID in text)
    assert not cited, f"{SEARCH_ID} in {cited}: cite the public source by name, or state the fact"


# The team's design notes live beside the repository, not in it: no reader of the
# repository can follow a citation of them.
TEAM_NOTES = re.compile(r"\b(?:shared/design/|design/FACTS\.md|FACTS\.md)")


def test_no_file_cites_the_teams_notes(files: dict[str, str]) -> None:
    cited = sorted(n for n, text in files.items() if TEAM_NOTES.search(text)
                   and n not in (HERE, "CHANGELOG.md"))  # fmt: skip
    assert not cited, f"the team's notes cited in {cited}: cite the public source"


def test_no_file_names_a_path_of_one_machine(files: dict[str, str]) -> None:
    found = [f"{n}: {p}" for n, text in sorted(files.items()) for p in machine_paths(text)]
    assert not found, "paths of one machine (make them relative to the repository): " + (
        "; ".join(found)
    )


def test_no_script_fetches_or_builds_another_projects_source(files: dict[str, str]) -> None:
    third_party = sorted(n for n in files if n.startswith("docs/third-party/") and
                         is_script(n, files[n]))  # fmt: skip
    assert not third_party, f"build scripts for another project's code: {third_party}"
    fetching = sorted(n for n, text in files.items() if is_script(n, text) and FETCH.search(text))
    assert not fetching, f"scripts that clone a repository: {fetching}"


def test_the_checks_see_what_they_look_for() -> None:
    """The matchers against text whose answers are known."""
    home, checkout = "/".join(("", "root", "x")), "/".join(("", "work", "main", "a.txt"))
    assert machine_paths(f"see `{checkout}` and ({home})\n{home}") == [checkout, home, home]
    assert machine_paths('mv "$tmp/root/usr/bin/x" internal/lookup/root/root.go') == []
    assert is_script("ci/x.sh", "") and is_script("ci/run", "#!/bin/sh\n")
    assert not is_script("docs/x.md", "git clone it")
    assert FETCH.search("git  clone https://example.com/a.git") and not FETCH.search("git cloned")


CONFLICT = re.compile(r"^(<{7}|>{7}) ", re.M)


def test_no_file_holds_a_merge_conflict_marker(files: dict[str, str]) -> None:
    found = [name for name, text in files.items() if CONFLICT.search(text)]
    assert not found, f"unresolved merge conflicts in {found}"
    assert CONFLICT.search("a\n<<<<<<< HEAD\nb\n") and not CONFLICT.search("<<<<<<<< x")
