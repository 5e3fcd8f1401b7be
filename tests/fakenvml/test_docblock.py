"""fakenvml/docblock.py: the generated parts of the docs, read and rewritten."""

from __future__ import annotations

import pytest

from fakenvml import docblock

PAGE = "intro\n<!-- t:start -->\n| a |\n|---|\n<!-- t:end -->\noutro\n"


def test_a_block_reads_back_what_was_written() -> None:
    assert docblock.between(PAGE, "t") == "| a |\n|---|"
    new = docblock.rewrite(PAGE, "t", "| b |")
    assert new == "intro\n<!-- t:start -->\n| b |\n<!-- t:end -->\noutro\n"
    assert docblock.between(new, "t") == "| b |"
    assert docblock.rewrite(PAGE, "t", "| a |\n|---|") == PAGE


def test_a_page_without_the_block_is_refused_and_read_as_none() -> None:
    assert docblock.between(PAGE, "other") is None
    with pytest.raises(ValueError, match="no <!-- other:start -->"):
        docblock.rewrite(PAGE, "other", "x")
