"""The one duration grammar: `500ms`, `2s`, `1.5m`, or a bare number of seconds (`3`,
`0.25`, "3"). Its own module, free of pydantic and YAML, because the commands that take a
duration on the injection path (`fakenvml set ... 70..90/30s`, `delay`) must start fast;
fakenvml/yamlmodel.py builds its Duration field on it.
"""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}
_DURATION_HINT = "expected a duration such as 500ms, 2s, 1.5m or a number of seconds"


def seconds(value: object) -> float:
    """A duration in the one grammar, as seconds; ValueError (one line) otherwise."""
    if isinstance(value, bool):  # YAML `yes`: a bool is an int to Python, not a time
        raise ValueError(f"{value!r}: {_DURATION_HINT}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-") and _DURATION.fullmatch(text[1:]):
            raise ValueError(f"{value!r}: a duration cannot be negative")
        m = _DURATION.fullmatch(text)
        if not m:
            raise ValueError(f"{value!r}: {_DURATION_HINT}")
        number = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError(f"{value!r}: {_DURATION_HINT}")
    if not math.isfinite(number):
        raise ValueError(f"{value!r}: {_DURATION_HINT}")
    if number < 0:
        raise ValueError(f"{value!r}: a duration cannot be negative")
    return number


def duration_text(s: float) -> str:
    """Seconds back in the grammar: 2.0 -> "2s", 0.5 -> "500ms", 1.5 -> "1500ms".
    Go's time.ParseDuration reads these too (kubelet's config takes them)."""
    ms = round(s * 1000, 3)
    if ms % 1000 == 0:
        return f"{int(ms // 1000)}s"
    return f"{ms:.3f}".rstrip("0").rstrip(".") + "ms"  # never an exponent
