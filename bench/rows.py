"""What every benchmark returns: rows of (metric, value, unit, aim), and the percentile
they quote (nearest rank, as the tables have always used)."""

from __future__ import annotations

from collections.abc import Sequence

Row = dict[str, object]


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
