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

import re
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
    failure: str = ""  # a failed cell's assertion, one line
    trace: str = ""  # ... and pytest's whole report of it (the HTML report shows it)
    nodeid: str = ""

    @classmethod
    def of(cls, passed: bool, seconds: float, properties: list[tuple[str, object]],
           failure: str = "", *, trace: str = "", nodeid: str = "") -> Cell:  # fmt: skip
        cell = cls("PASS" if passed else "FAIL", seconds, nodeid=nodeid)
        for key, value in properties:
            if key == EXPECTED:
                cell.expected.append(str(value))
            elif key == SEEN:
                cell.seen.append(str(value))
            elif key == KUBERNETES:
                cell.kubernetes = str(value)
        if not passed:
            cell.failure = first_line(failure or trace)
            cell.trace = trace or failure
        return cell

    @property
    def short(self) -> str:
        """The grid's text: a failure's seconds are in its details, not the grid."""
        return f"PASS {self.seconds:.1f}s" if self.outcome == "PASS" else self.outcome


def first_line(message: str) -> str:
    """The assertion's own words: the first non-empty line, without pytest's `E` prefix
    and exception class."""
    for line in message.splitlines():
        line = line.strip().removeprefix("E").strip()
        if line:
            head, sep, rest = line.partition(": ")
            return rest if sep and head.endswith(("Error", "Exception")) else line
    return ""


def scenario_name(scenario: str) -> str:
    return scenario.removeprefix("test_")


def kubernetes(rows: dict[str, dict[str, Cell]]) -> list[str]:
    """The Kubernetes versions the scenarios ran on."""
    return sorted({c.kubernetes for r in rows.values() for c in r.values() if c.kubernetes})


def summary(rows: dict[str, dict[str, Cell]], subjects: list[str], width: int = 120) -> list[str]:
    """The terminal's summary: the grid, then the failed cells' details."""
    out = grid(rows, subjects, width)
    failed = failures(rows, subjects, width)
    return out + (["", *failed] if failed else [])


def grid(rows: dict[str, dict[str, Cell]], subjects: list[str], width: int = 120) -> list[str]:
    """Scenario x subject -> `PASS 1.6s` / `FAIL` / `-` (not run for that subject), at most
    `width` wide where it can be: when the subjects' names do not fit as headers they are
    numbered in a legend above, and scenario names wrap at their underscores (nine subjects
    and a 70-character scenario name would not fit any terminal on one line)."""
    versions = kubernetes(rows)
    # One version (the usual run) is said once above; several get a column.
    kcol = len(versions) > 1
    cells = {s: [r[c].short if c in r else "-" for c in subjects] for s, r in rows.items()}
    if kcol:
        for s, r in rows.items():
            cells[s].insert(0, ",".join(sorted({c.kubernetes for c in r.values()})) or "-")
    out = [f"kubernetes {versions[0]}"] if len(versions) == 1 else []

    def render(heads: list[str]) -> list[str]:
        heads = (["kubernetes"] if kcol else []) + heads
        cols = [max(len(h), *(len(c[i]) for c in cells.values())) for i, h in enumerate(heads)]
        longest = max(len("scenario"), *(len(scenario_name(s)) for s in rows))
        left = min(longest, max(24, width - sum(w + 2 for w in cols)))

        def line(name: str, texts: list[str]) -> str:
            return f"{name:<{left}}  " + "  ".join(
                f"{t:<{w}}" for t, w in zip(texts, cols, strict=True)
            )

        lines = [line("scenario", heads).rstrip()]
        for s, texts in cells.items():
            # Continuation lines indented: they must not read as scenarios of their own.
            name = scenario_name(s)
            parts = [name] if len(name) <= left else _wrap_name(name, left - 2)
            lines.append(line(parts[0], texts).rstrip())
            lines += [f"  {p}" for p in parts[1:]]
        return lines

    lines = render(subjects)
    if max(len(x) for x in lines) <= width:
        return out + lines
    legend = _pack([f"[{i}] {s}" for i, s in enumerate(subjects, 1)], width)
    return out + legend + render([f"[{i}]" for i in range(1, len(subjects) + 1)])


def failures(rows: dict[str, dict[str, Cell]], subjects: list[str], width: int = 120) -> list[str]:
    """What each failed cell expected, saw and failed on; nothing for the passed ones."""
    out: list[str] = []
    for scenario, results in rows.items():
        for subject in subjects:
            c = results.get(subject)
            if c is None or c.outcome == "PASS":
                continue
            version = f", kubernetes {c.kubernetes}" if c.kubernetes else ""
            out.append(f"FAIL {scenario_name(scenario)} on {subject} ({c.seconds:.1f}s{version})")
            for label, text in (("expected", "; ".join(c.expected)), ("seen", "; ".join(c.seen)),
                                ("failure", c.failure)):  # fmt: skip
                if text:
                    out += textwrap.wrap(text, width, initial_indent=f"    {label:<9} ",
                                         subsequent_indent=" " * 14)  # fmt: skip
    return out


def _wrap_name(name: str, width: int) -> list[str]:
    """`name` in lines of `width` at most, broken after underscores (and inside a part
    longer than a line): the lines joined give the name back."""
    parts = [p[i : i + width] for p in re.findall(r"[^_]*_|[^_]+$", name)
             for i in range(0, len(p), width)]  # fmt: skip
    return _pack(parts, width, sep="") or [""]


def _pack(parts: list[str], width: int, sep: str = "  ") -> list[str]:
    """`parts` joined by `sep` into as few lines of `width` at most as they fit (a part
    is never split)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines
