"""The library build (fakenvml/native/build.py) builds again only when an input changed:
every `make` target that needs the library asks for it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fakenvml.native import build, header


def test_the_build_runs_again_only_for_a_changed_input_or_a_missing_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    shutil.copytree(build.SRC, src)
    monkeypatch.setattr(build, "SRC", src)
    out = tmp_path / "out"
    lib = build.build("release", out)
    first = lib.stat().st_mtime_ns
    assert "built" in capsys.readouterr().out

    assert build.build("release", out) == lib
    assert "is up to date" in capsys.readouterr().out
    assert lib.stat().st_mtime_ns == first

    # What the digest reads: a source, the flags (the variant's among them).
    key = build._inputs(build.CFLAGS, header.path())
    c = next(src.glob("*.c"))
    c.write_text(c.read_text() + "\n/* changed */\n")
    assert build._inputs(build.CFLAGS, header.path()) != key
    assert build._inputs([*build.CFLAGS, "-O3"], header.path()) != key
    c.write_text(c.read_text().removesuffix("\n/* changed */\n"))

    (out / "gen" / "implemented.txt").unlink()
    build.build("release", out)
    assert "built" in capsys.readouterr().out
    assert (out / "gen" / "implemented.txt").is_file()
