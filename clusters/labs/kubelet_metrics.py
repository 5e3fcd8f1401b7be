"""The kubelet's own metrics of a node, read through the API server's node proxy: what the
restart suites assert on and how a lab knows a plugin registered, plugin-agnostic (no log
line to agree on)."""

from __future__ import annotations

from typing import NamedTuple

from kubernetes import client


class DeviceMetrics(NamedTuple):
    started: float  # process_start_time_seconds (see same_kubelet)
    registrations: int  # kubelet_device_plugin_registration_total for the resource
    allocations: int  # kubelet_device_plugin_alloc_duration_seconds_count for it
    alloc_seconds: float  # ..._sum: time the kubelet spent in the plugin's Allocate


def scrape(core: client.CoreV1Api, node: str, resource: str) -> DeviceMetrics:
    """`resource`'s device-plugin metrics since the node's kubelet started."""
    return parse(core.connect_get_node_proxy_with_path(node, "metrics", _request_timeout=(5, 10)),
                 resource)  # fmt: skip


def parse(text: str, resource: str) -> DeviceMetrics:
    """Prometheus text exposition -> the figures above (0 where a series is absent: a
    kubelet that saw no registration or Allocate yet has no sample for the resource)."""
    started, regs, allocs, secs = 0.0, 0, 0, 0.0
    label = f'resource_name="{resource}"'
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        if metric == "process_start_time_seconds":
            started = float(value)
        elif label not in name:
            continue
        elif metric == "kubelet_device_plugin_registration_total":
            regs += int(float(value))
        elif metric == "kubelet_device_plugin_alloc_duration_seconds_count":
            allocs += int(float(value))
        elif metric == "kubelet_device_plugin_alloc_duration_seconds_sum":
            secs += float(value)
    return DeviceMetrics(started, regs, allocs, secs)


# A kubelet started within this many seconds of the one scraped before is taken for it.
SAME_START_S = 5.0


def same_kubelet(before: DeviceMetrics, now: DeviceMetrics) -> bool:
    """Whether two scrapes of a node came from one kubelet process. Its
    process_start_time_seconds is its start in ticks since boot plus /proc/stat's btime,
    which the kernel derives from the wall clock on each read, so one process's value moves
    as the clock is adjusted (prometheus/client_golang#289). CI saw it move: a registration
    wait took the kubelet for a new one, counted from zero and passed before the plugin had
    registered. So: a start within SAME_START_S of the first, and a registration counter
    that did not go back (a new kubelet's starts at zero)."""
    return (abs(now.started - before.started) < SAME_START_S
            and now.registrations >= before.registrations)  # fmt: skip
