"""The kubelet's own metrics of a node, read through the API server's node proxy: what the
restart suites assert on and how a lab knows a plugin registered, plugin-agnostic (no log
line to agree on)."""

from __future__ import annotations

from typing import NamedTuple

from kubernetes import client


class DeviceMetrics(NamedTuple):
    started: float  # process_start_time_seconds: a new value means a new kubelet
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
