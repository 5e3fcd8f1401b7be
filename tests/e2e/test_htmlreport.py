"""The HTML report: one well-formed file with the grid, every failure's whole text
(escaped), this run's experiment timelines inline, and nothing fetched from elsewhere."""

from __future__ import annotations

import base64
import os
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from e2e import htmlreport
from e2e.verdict import Cell

VOID = {"meta", "img", "br", "hr", "link", "input", "wbr", "source"}
TRACE = (
    "e2e/test_seed.py:42: in test_lost\n    assert seen == want\n"
    "E   AssertionError: <b>8</b> != 10 & 'x'"
)
PNG = bytes.fromhex("89504e470d0a1a0a") + b"not a real picture, only its bytes"


class Page(HTMLParser):
    """Checks nesting as it parses (every element closed, in order) and keeps what a
    test asks about: the cells by class, the text, every src and href."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.cells: list[tuple[str, str]] = []  # (class, summary text)
        self.refs: list[str] = []
        self.text: list[str] = []
        self._td = ""
        self.feed(text)
        self.close()
        assert not self.open, f"never closed: {self.open}"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.refs += [v or "" for k, v in attrs if k in ("src", "href")]
        if tag == "td":
            self._td = a.get("class") or ""
            if self._td == "none":
                self.cells.append(("none", "-"))
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.open and self.open[-1] == "summary":
            self.cells.append((self._td, data))


def run(timelines: list[Path] | None = None) -> htmlreport.Run:
    lost = Cell.of(False, 61.0, [("expected", "0/10"), ("seen", "10/10 after 60 s")],
                   "AssertionError: <b>8</b> != 10 & 'x'", trace=TRACE,
                   nodeid="e2e/test_seed.py::test_lost[nvidia]")  # fmt: skip
    lost.kubernetes = "v1.37.0"
    rows = {
        "test_lost": {
            "gpulab": Cell("PASS", 3.04, ["9/10"], ["9/10 in 1.3s"], "v1.37.0"),
            "nvidia": lost,
        },
        "test_capacity": {"gpulab": Cell("PASS", 0.2, kubernetes="v1.37.0")},
    }
    dra = {"test_slices [dra]": {"nvidia-dra-driver": Cell("PASS", 5.0)}}
    return htmlreport.Run(
        started=1_700_000_000.0,
        seconds=754.0,
        subjects=["gpulab", "nvidia"],
        sections=[
            ("scenario x subject", rows, ["gpulab", "nvidia"]),
            ("NVIDIA's DRA driver", dra, ["nvidia-dra-driver"]),
        ],
        totals={"passed": 3, "failed": 1},
        timelines=timelines or [],
    )


def test_the_report_is_well_formed_with_a_cell_per_scenario_and_subject() -> None:
    page = Page(htmlreport.render(run()))
    assert page.cells == [("pass", "PASS 3.0s"), ("fail", "FAIL 61.0s"),
                          ("pass", "PASS 0.2s"), ("none", "-"), ("pass", "PASS 5.0s")]  # fmt: skip
    text = "".join(page.text)
    for fact in ("v1.37.0", "gpulab, nvidia, nvidia-dra-driver", "3 passed, 1 failed",
                 "12 min 34 s", "NVIDIA's DRA driver", "10/10 after 60 s"):  # fmt: skip
        assert fact in text


def test_a_failure_is_shown_whole_and_escaped_and_a_pass_has_no_failure_section() -> None:
    html = htmlreport.render(run())
    assert "<b>8</b>" not in html and "&lt;b&gt;8&lt;/b&gt; != 10 &amp; &#x27;x&#x27;" in html
    page = Page(html)
    assert TRACE in "".join(page.text)  # the whole of it, as pytest wrote it
    assert html.count('class="failure"') == 1 and "FAIL lost on nvidia" in html
    assert "#failure-1" in page.refs and 'id="failure-1"' in html


def test_a_timeline_written_during_the_run_is_embedded_and_an_older_one_is_not(
    tmp_path: Path,
) -> None:
    new, old = tmp_path / "xid-storm-gpulab", tmp_path / "dra-taints"
    for d in (new, old):
        d.mkdir()
        (d / "timeline.png").write_bytes(PNG)
    (new / "report.md").write_text("# xid-storm · gpulab plugin · ✅ PASS (5/5)\n\nmore\n")
    since = time.time() - 5
    os.utime(old / "timeline.png", (since - 3600, since - 3600))
    found = htmlreport.timelines(tmp_path, since)
    assert found == [new / "timeline.png"]
    assert htmlreport.timelines(tmp_path / "absent", since) == []

    html = htmlreport.render(run(found))
    page = Page(html)
    images = [r for r in page.refs if r.startswith("data:image/png;base64,")]
    assert [base64.b64decode(r.partition(",")[2]) for r in images] == [PNG]
    assert "xid-storm · gpulab plugin · ✅ PASS (5/5)" in "".join(page.text)


def test_nothing_is_fetched_from_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "timeline.png").write_bytes(PNG)
    page = Page(htmlreport.render(run([tmp_path / "timeline.png"])))
    assert page.refs and all(r.startswith(("#", "data:")) for r in page.refs)
    assert "<script" not in htmlreport.render(run())


def test_the_report_goes_beside_the_junit_xml_or_to_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert htmlreport.path_for("build/e2e-junit.xml") == Path("build/e2e-junit.html")
    assert htmlreport.path_for(None) == Path("out/e2e-report.html")
    path = htmlreport.write(run(), tmp_path / "new" / "e2e-junit.html")
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    monkeypatch.setenv("GPULAB_REPORTS", str(tmp_path))
    assert htmlreport.reports_root() == tmp_path
    monkeypatch.delenv("GPULAB_REPORTS")
    assert htmlreport.reports_root() == Path("out/experiments")


def test_totals_are_pytests_nonzero_counts() -> None:
    stats = {"passed": [1, 2], "failed": [3], "skipped": [], "deselected": [4], "": [5]}
    assert htmlreport.totals(stats) == {"passed": 2, "failed": 1, "deselected": 1}
