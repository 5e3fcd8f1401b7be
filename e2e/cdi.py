"""Reading CDI specs (the Container Device Interface files a plugin writes to /var/run/cdi):
which device nodes each device of a kind gives a container."""

from __future__ import annotations

from collections.abc import Iterable

import yaml


def device_nodes(specs: Iterable[str], kind: str) -> dict[str, list[str]]:
    """Device name -> its device nodes' container paths, over the specs (their text: CDI
    allows JSON or YAML) whose kind is `kind` (vendor/class)."""
    out: dict[str, list[str]] = {}
    for text in specs:
        spec = yaml.safe_load(text)
        if not isinstance(spec, dict) or spec.get("kind") != kind:
            continue
        for d in spec.get("devices", []):
            nodes = d.get("containerEdits", {}).get("deviceNodes", [])
            out[d["name"]] = [n["path"] for n in nodes]
    return out
