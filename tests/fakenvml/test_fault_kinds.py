"""One spelling per fault kind, from one table (fakenvml/journal.py's Kind), mirrored by
the C library's record kinds and used by the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fakenvml import cli, faults
from fakenvml.journal import SHIPPED_ALIASES, Kind, ecc_kind

HEADER = Path(cli.__file__).parent / "src" / "state_format.h"


def test_the_c_record_kinds_have_the_same_names_and_numbers() -> None:
    enum = re.search(r"enum fnv_record_kind \{(.*?)\};", HEADER.read_text(), re.S)
    assert enum, "enum fnv_record_kind not found in state_format.h"
    in_c = {name: int(n) for name, n in re.findall(r"FNV_(\w+) = (\d+)", enum.group(1))}
    assert in_c == {k.name: k.value for k in Kind}


def test_each_kind_has_one_spelling_and_reads_back() -> None:
    spellings = [k.spelling for k in Kind]
    assert spellings == [
        "xid", "ecc-single", "ecc-double", "lost", "fallen-off-bus", "recover", "recovery-action",
        "set", "process-add", "process-remove", "fail", "delay", "clear", "mig-mode",
        "gpu-reset", "gi-create", "gi-destroy", "ci-create", "ci-destroy", "fail-when",
    ]  # fmt: skip
    faults = [k for k in Kind if k.is_fault]
    assert [Kind.named(k.spelling) for k in faults] == faults == list(Kind)[:7]


def test_spellings_that_shipped_before_read_as_their_kind() -> None:
    assert Kind.named("ecc_dbe") is Kind.ECC_DOUBLE and Kind.named("ecc_sbe") is Kind.ECC_SINGLE
    assert not set(SHIPPED_ALIASES) & {k.spelling for k in Kind}


@pytest.mark.parametrize("text", ["ECC-DOUBLE", "dbe", "ecc", "", "lost ", "set", "fail"])
def test_anything_else_is_refused_naming_the_kinds(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected a fault kind \(xid, .*, recovery-action\)$"):
        Kind.named(text)


def test_the_cli_injects_by_the_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inject", "ecc-double", "0"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    choices = [f.name for f in faults.FAULTS if faults.command(f)[0] == "inject"]
    assert f"(choose from {', '.join(map(repr, choices))})" in err
    assert (ecc_kind(True), ecc_kind(False)) == (Kind.ECC_DOUBLE, Kind.ECC_SINGLE)
