"""A device plugin's pod restart on a real cluster: the `seed` lab with each subject, the
plugin's pod on the first GPU node deleted (gracefully, as `kubectl delete pod` does) and
the Node watched until its allocatable drops and is full again, which is what every
restart scenario in the suites waits for; and when the new pod logged its registration
(the subject's `logs: registered` line, the container runtime's timestamp). Needs `make
infra`; the lab is reused when up.

The kubelet writes allocatable in a status pass each second, so "full again" moves in
whole passes; the pause between restarts is random so that the delete does not lock to
that pass's phase (with a fixed pause every sample fell on the same side of it, and a
registration 0.8 s earlier showed no difference).

    python -m bench.restart_bench [--subjects gpulab,nvidia] [--restarts 10]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from datetime import datetime

from kubernetes import client, watch

from bench.rows import Row, pct
from clusters.labs.lab import Lab

SUBJECTS = ("gpulab", "nvidia")
RESTARTS = 10
DEADLINE_S = 60.0
SETTLE_S = 3.0  # between restarts, plus up to one status pass: the DaemonSet settles


def _allocatable(node: client.V1Node, resource: str) -> str | None:
    return (node.status.allocatable or {}).get(resource)


def restart_once(lab: Lab, node: str, resource: str) -> tuple[float, float]:
    """Seconds from the delete to the new pod's registration line, and to the Node's
    allocatable full again after it dropped."""
    core = lab.core
    nodes = core.list_node(field_selector=f"metadata.name={node}")
    full = _allocatable(nodes.items[0], resource)
    pod = lab.plugin_pods(node)[0]
    t0, wall0 = time.monotonic(), time.time()
    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    dropped, back = False, None
    w = watch.Watch()
    for event in w.stream(core.list_node, field_selector=f"metadata.name={node}",
                          resource_version=nodes.metadata.resource_version,
                          timeout_seconds=int(DEADLINE_S)):  # fmt: skip
        now = _allocatable(event["object"], resource)
        dropped = dropped or now != full
        if dropped and now == full:
            back = time.monotonic() - t0
            w.stop()
    if back is None:
        raise RuntimeError(f"{node}: {resource} not back to {full} within {DEADLINE_S:.0f}s "
                           f"({'it dropped' if dropped else 'it never dropped'})")  # fmt: skip
    return registered_at(lab, node) - wall0, back


def registered_at(lab: Lab, node: str) -> float:
    """The wall-clock time of the node's plugin pod's registration line."""
    pattern = lab.subject.logs.pattern("registered")
    if pattern is None:
        raise RuntimeError(f"{lab.subject.name} states no `registered` log line")
    for line in (lab.plugin_log(node, timestamps=True) or "").splitlines():
        stamp, _, text = line.partition(" ")
        if pattern.search(text):
            return datetime.fromisoformat(stamp).timestamp()  # the runtime's RFC 3339
    raise RuntimeError(f"no registration line in {node}'s plugin log")


def run(subjects: Sequence[str] = SUBJECTS, restarts: int = RESTARTS) -> list[Row]:
    rows: list[Row] = []
    for name in subjects:
        lab = Lab("seed", subject=name).up()
        node, resource = lab.lab.gpu_nodes[0].name, lab.subject.spec.resource
        registered, back = [], []
        for _ in range(restarts):
            r, b = restart_once(lab, node, resource)
            registered.append(r)
            back.append(b)
            time.sleep(SETTLE_S + random.random())
        for what, took in (("registered", registered), ("allocatable full", back)):
            label = f"{lab.subject.name}: plugin pod deleted -> {what} (seed, n={restarts})"
            rows += [
                {"metric": f"{label}, p50", "value": pct(took, 50), "unit": "s", "aim": ""},
                {"metric": f"{label}, max", "value": max(took), "unit": "s", "aim": ""},
            ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subjects", default=",".join(SUBJECTS))
    ap.add_argument("--restarts", type=int, default=RESTARTS)
    args = ap.parse_args()
    for row in run(args.subjects.split(","), args.restarts):
        print(f"{row['metric']:80} {row['value']:6.2f} {row['unit']}")


if __name__ == "__main__":
    main()
