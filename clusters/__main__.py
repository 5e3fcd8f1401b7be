"""`python -m clusters up|down LAB [--plugin gpulab|nvidia]` (what `make cluster` runs)."""

from __future__ import annotations

import argparse
import sys

from clusters.lab import Lab
from clusters.spec import SpecError
from clusters.steps import StepError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clusters", description=__doc__)
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("lab", help="a name under clusters/ (seed, hetero, single, wide) or a path")
    ap.add_argument("--plugin", choices=["gpulab", "nvidia"])
    args = ap.parse_args(argv)
    try:
        lab = Lab(args.lab, plugin=args.plugin)
        lab.up() if args.action == "up" else lab.down()
    except (SpecError, StepError) as e:
        print(f"clusters: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, SpecError) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
