"""A Helm post-renderer that puts a line first in one container's `bash -c` script: how a
static-MIG DRA lab bind-mounts the fake root's proc/driver over /proc/driver before NVIDIA's
kubelet plugin starts (clusters/dra.py; the chart has no value for the command).

Being part of the release, the change costs no second rollout and survives `helm upgrade`
(a patch after the install was undone by each upgrade and rolled the pods twice).

    python clusters/post_render.py <container> <line>   < manifests > manifests

Run by helm as a file, not a module (helm's working directory need not hold the package):
it imports nothing of gpulab's.
"""

from __future__ import annotations

import sys

import yaml


def with_first_line(script: str, line: str) -> str:
    """`script` with `line` first, once."""
    first = line + "\n"
    return script if script.startswith(first) else first + script


def render(docs: list[dict], container: str, line: str) -> int:
    """Prepend `line` to every `bash -c` container named `container` of the workloads in
    `docs` (in place); how many it changed."""
    changed = 0
    for doc in docs:
        pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in pod.get("containers") or []:
            if c.get("name") == container and c.get("command") == ["bash", "-c"] and c.get("args"):
                c["args"][0] = with_first_line(c["args"][0], line)
                changed += 1
    return changed


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: post_render.py <container> <line>", file=sys.stderr)
        return 2
    container, line = argv
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    if not render(docs, container, line):
        # A chart that changed its command: fail the install rather than run without.
        print(f"post_render: no `bash -c` container {container!r} in the manifests",
              file=sys.stderr)  # fmt: skip
        return 1
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
