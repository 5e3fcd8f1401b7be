"""Fault timings the cluster-tier suites record: injected -> the plugin's ListAndWatch
update (its log) -> the API server's node allocatable (a watch), by journal sequence number.
"""

from __future__ import annotations

from kubernetes import client

from clusters.labs.lab import Lab
from clusters.steps import StepError
from e2e.pods import Pods
from e2e.runner import parse_log
from e2e.verdict import Verdict
from fakenvml.journal import Record


def plugin_update_ns(lab: Lab, node: str, after_ns: int) -> int | None:
    """When the plugin on `node` logged its first ListAndWatch update after `after_ns`
    (containerd's log timestamps; its update lines as its subject states them, `logs:`).
    None where it logged none, or its subject states none."""
    text = lab.plugin_log(node, timestamps=True)
    if text is None:
        return None
    lines = parse_log(text, node, 0, lab.serving.logs, lab.serving.resource)
    times = [int(line.t * 1e9) for line in lines if line.event == "update"]
    return min((t for t in times if t >= after_ns), default=None)


def fault_seen(verdict: Verdict, lab: Lab, node: str, rec: Record, allocatable: int,
               capacity: int) -> float:  # fmt: skip
    """Wait for the API to show the fault; record, by the fault's sequence number, when it
    was injected, when the plugin's ListAndWatch update logged it, and when the API's node
    allocatable showed it (that last one is also what the scenario saw)."""
    try:
        api_ns = lab.wait_allocatable(node, allocatable, capacity, deadline_s=60)
    except StepError:
        cap, alloc = lab.capacity(node)
        verdict.saw(f"allocatable {alloc}/{cap} after 60 s")
        raise
    injected_ns = rec.realtime_ns
    seq = rec.seq
    update_ns = plugin_update_ns(lab, node, injected_ns)
    if update_ns is not None:
        verdict.property(f"seq {seq}: injected -> plugin update (ms)",
                         round((update_ns - injected_ns) / 1e6, 1))  # fmt: skip
    latency = (api_ns - injected_ns) / 1e9
    verdict.property(f"seq {seq}: injected -> API allocatable {allocatable} (s)",
                     round(latency, 3))  # fmt: skip
    verdict.saw(f"{allocatable}/{capacity} in {latency:.1f}s")
    return latency


def pod_health_seen(verdict: Verdict, lab: Lab, pods: Pods, pod: str, gpu: str, health: str,
                    since: Record) -> float:  # fmt: skip
    """Watch until `pod` reports the device that names `gpu` (a UUID: Pods.health) as
    `health`; record injected -> pod status (s) by the record's sequence number, beside
    fault_seen's allocatable time."""

    def check(found: dict[str, client.V1Pod]) -> tuple[bool, str]:
        got = pods.health(found[pod]) if pod in found else {}
        return got.get(gpu) == health, f"{pod}: {got or 'no allocatedResourcesStatus'}"

    seen_ns = lab.kube.watch_until(
        f"pod {pod} to show {gpu} {health}",
        lab.core.list_namespaced_pod, check, 60, namespace=pods.ns,
        field_selector=f"metadata.name={pod}",
    )  # fmt: skip
    latency = (seen_ns - since.realtime_ns) / 1e9
    verdict.property(f"seq {since.seq}: injected -> pod status {health} (s)", round(latency, 3))
    return latency
