"""Small pieces the lab's steps are made of: kind, manifests, polls with deadlines.

The machine-level work (engine, kind, images) is clusters/infra/infra.py's (`make infra`); labs
do the cluster-level work through kind, the docker SDK and the kubernetes client. Every
wait has a deadline and says what it saw (node status is watched: clusters/labs/capacity.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import urllib3
import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = Path(__file__).resolve().parent / "charts" / "manifests"
T = TypeVar("T")


class StepError(Exception):
    """A step failed; the message says which and what was seen."""


def kind(kind_bin: str, *args: str, capture: bool = False) -> str:
    """kind's stdout when `capture`; its stderr (progress, and why it failed) is passed on
    after it ends and its tail is in the StepError: a lab that comes up in a background
    thread of the e2e session has its output captured by whichever test runs then, and a
    CI log's tail showed only "kind create cluster failed (exit 1)"."""
    res = subprocess.run([kind_bin, *args], text=True, stderr=subprocess.PIPE,
                         stdout=subprocess.PIPE if capture else None)  # fmt: skip
    sys.stderr.write(res.stderr)
    if res.returncode != 0:
        tail = "\n".join(res.stderr.rstrip().splitlines()[-KIND_TAIL:])
        raise StepError(f"kind {' '.join(args[:2])} failed (exit {res.returncode}):\n{tail}")
    return res.stdout or ""


# Lines of kind's stderr a failure keeps: kubeadm's last words sit at the end of its output.
KIND_TAIL = 25


def manifest(name: str, images: dict[str, str]) -> list[dict]:
    """A shipped manifest with its placeholder images replaced by the lab's local ones."""
    text = (MANIFESTS / name).read_text()
    for placeholder, image in images.items():
        text = text.replace(placeholder, image)
    return [d for d in yaml.safe_load_all(text) if d]


def settle(read: Callable[[], T], want: T, deadline_s: float = 120) -> T:
    """read() every half second until it is `want` or the deadline: the last value read.
    For waits whose shortfall the caller explains (poll raises instead)."""
    end = time.monotonic() + deadline_s
    while (got := read()) != want and time.monotonic() < end:
        time.sleep(0.5)
    return got


def poll(what: str, check: Callable[[], tuple[bool, str]], deadline_s: float,
         interval_s: float = 0.5) -> str:  # fmt: skip
    """Call check() until it says done; on timeout raise with the last thing it saw."""
    t0 = time.monotonic()
    seen = ""
    while True:
        try:
            done, seen = check()
        except (OSError, urllib3.exceptions.HTTPError) as e:  # the API server restarting
            done, seen = False, f"{type(e).__name__}: {str(e)[:200]}"
        if done:
            return seen
        if time.monotonic() - t0 > deadline_s:
            raise StepError(f"waited {deadline_s:.0f}s for {what}; last saw: {seen}")
        time.sleep(interval_s)
