"""Generated parts of the docs: the text between `<!-- NAME:start -->` and
`<!-- NAME:end -->` in a Markdown page, which a generator rewrites and a test reads back
(the boards table, the implemented functions, the DRA driver's suite)."""

from __future__ import annotations

import re


def _pattern(name: str) -> re.Pattern[str]:
    start, end = (re.escape(f"<!-- {name}:{edge} -->") for edge in ("start", "end"))
    return re.compile(rf"{start}\n(.*?)\n?{end}", re.S)


def between(text: str, name: str) -> str | None:
    """The block's text (without its markers), or None where the page has none."""
    m = _pattern(name).search(text)
    return m.group(1) if m else None


def rewrite(text: str, name: str, inner: str) -> str:
    """`text` with the block's text replaced by `inner`; ValueError where it has none."""
    pattern = _pattern(name)
    if not pattern.search(text):
        raise ValueError(f"no <!-- {name}:start --> ... <!-- {name}:end --> block")
    block = f"<!-- {name}:start -->\n{inner}\n<!-- {name}:end -->"
    return pattern.sub(lambda _: block, text, count=1)
