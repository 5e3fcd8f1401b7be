"""`python -m clusters up|down LAB [--subject NAME|PATH]` (what `make cluster` runs)."""

from __future__ import annotations

import argparse
import sys

from clusters.lab import Lab
from clusters.spec import SpecError
from clusters.steps import StepError
from clusters.subject import SubjectError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clusters", description=__doc__)
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("lab", help="a lab under clusters/ (seed, hetero, mig, dra, ...) or a path")
    ap.add_argument("--subject", help="the plugin under test: gpulab, nvidia, nvidia-v0.17.4 "
                    "or a subject file, or none: fake GPUs only (default: the lab's)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        lab = Lab(args.lab, subject=args.subject)
        lab.up() if args.action == "up" else lab.down()
    except (SpecError, StepError, SubjectError) as e:
        print(f"clusters: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, StepError) else 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
