"""The README's list of implemented NVML functions is the build's, not a wish list."""

from fakenvml.native import readme


def test_readme_lists_exactly_the_implemented_functions() -> None:
    text = (readme.REPO / "README.md").read_text()
    names = readme.implemented()
    assert readme.listed(text) == names, "run `python -m fakenvml.native.readme`"
    assert f"{len(names)} functions" in text, "the README states the count"
