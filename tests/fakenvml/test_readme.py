"""The docs' list of implemented NVML functions is the build's, not a wish list."""

from fakenvml.native import readme


def test_the_docs_list_exactly_the_implemented_functions() -> None:
    text = readme.DOC.read_text()
    names = readme.implemented()
    assert readme.listed(text) == names, "run `python -m fakenvml.native.readme`"
    assert f"{len(names)} functions" in text, "docs/fakenvml.md states the count"
