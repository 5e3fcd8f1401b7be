"""What a scenario expected of the subject and what it saw: the cells of the summary table.

A test states its expectation (read from the subject's `expects` where it depends on the
plugin) and what it observed; both land in the test's user properties, so they reach the
JUnit XML too. A failed test that recorded no observation shows its assertion instead.

    def test_gpu_lost(subject, lab, verdict):
        verdict.expect("allocatable 9/10")
        ...
        verdict.saw("allocatable 9/10 after 1.3 s")
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

EXPECTED, SEEN, KUBERNETES = "expected", "seen", "kubernetes"


class Verdict:
    """Writes `expected` and `seen` (and any other figure) into the test's properties."""

    def __init__(self, record_property: Callable[[str, object], None]) -> None:
        self.property = record_property

    def expect(self, text: str) -> None:
        self.property(EXPECTED, text)

    def saw(self, text: str) -> None:
        self.property(SEEN, text)


@dataclass
class Cell:
    """One scenario x subject result as the summary prints it."""

    outcome: str  # PASS | FAIL
    seconds: float
    expected: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    kubernetes: str = ""  # the version of the lab it ran on

    @classmethod
    def of(cls, passed: bool, seconds: float, properties: list[tuple[str, object]],
           failure: str = "") -> Cell:  # fmt: skip
        cell = cls("PASS" if passed else "FAIL", seconds)
        for key, value in properties:
            if key == EXPECTED:
                cell.expected.append(str(value))
            elif key == SEEN:
                cell.seen.append(str(value))
            elif key == KUBERNETES:
                cell.kubernetes = str(value)
        if not passed and failure:
            cell.seen.append(first_line(failure))
        return cell


def first_line(message: str) -> str:
    """The assertion's own words: the first non-empty line, without pytest's `E` prefix
    and exception class."""
    for line in message.splitlines():
        line = line.strip().removeprefix("E").strip()
        if line:
            head, sep, rest = line.partition(": ")
            return rest if sep and head.endswith(("Error", "Exception")) else line
    return ""


def table(rows: dict[str, dict[str, Cell]], subjects: list[str], width: int = 120) -> list[str]:
    """Lines of the scenario x subject table, `width` wide at most: each scenario's result
    row with the Kubernetes version(s) its lab ran, then what each subject was expected to do
    and what it did, wrapped in its column."""
    names = {s: s.removeprefix("test_") for s in rows}
    kube = {s: ",".join(sorted({c.kubernetes for c in r.values() if c.kubernetes})) or "-"
            for s, r in rows.items()}  # fmt: skip
    left = max(len("scenario"), *(len(n) for n in names.values()))
    kcol = max(len("kubernetes"), *(len(k) for k in kube.values()))
    col = max(24, (width - left - kcol - 4) // max(len(subjects), 1) - 2)

    def lines(label: str, version: str, cells: list[str]) -> list[str]:
        wrapped = [textwrap.wrap(c, col) or [""] for c in cells]
        out = []
        for i in range(max(len(w) for w in wrapped)):
            parts = [w[i] if i < len(w) else "" for w in wrapped]
            out.append(f"{label if i == 0 else '':<{left}}  {version if i == 0 else '':<{kcol}}  "
                       + "  ".join(f"{p:<{col}}" for p in parts).rstrip())  # fmt: skip
        return out

    out = lines("scenario", "kubernetes", subjects)
    for scenario, results in rows.items():
        got = [results.get(s) for s in subjects]
        out += lines(names[scenario], kube[scenario],
                     [f"{c.outcome} {c.seconds:.1f}s" if c else "-" for c in got])  # fmt: skip
        for label, attr in (("  expected", "expected"), ("  seen", "seen")):
            texts = ["; ".join(getattr(c, attr)) if c else "" for c in got]
            if any(texts):
                out += lines(label, "", texts)
    return out
