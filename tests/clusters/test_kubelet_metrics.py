"""The kubelet metrics parser, on text in the exposition format a kubelet serves."""

from __future__ import annotations

from clusters.labs.kubelet_metrics import DeviceMetrics, parse

TEXT = """\
# HELP kubelet_device_plugin_alloc_duration_seconds [ALPHA] Duration in seconds to serve ...
# TYPE kubelet_device_plugin_alloc_duration_seconds histogram
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="nvidia.com/gpu",le="0.005"} 2
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="nvidia.com/gpu",le="+Inf"} 3
kubelet_device_plugin_alloc_duration_seconds_sum{resource_name="nvidia.com/gpu"} 0.0125
kubelet_device_plugin_alloc_duration_seconds_count{resource_name="nvidia.com/gpu"} 3
kubelet_device_plugin_alloc_duration_seconds_count{resource_name="example.com/rdma"} 7
# TYPE kubelet_device_plugin_registration_total counter
kubelet_device_plugin_registration_total{resource_name="nvidia.com/gpu"} 2
kubelet_device_plugin_registration_total{resource_name="nvidia.com/gpu.shared"} 5
process_start_time_seconds 1.76409e+09
"""


def test_figures_are_per_resource() -> None:
    assert parse(TEXT, "nvidia.com/gpu") == DeviceMetrics(1.76409e9, 2, 3, 0.0125)
    # A prefix of another resource's name does not match it.
    assert parse(TEXT, "nvidia.com/gpu.shared").registrations == 5
    assert parse(TEXT, "example.com/rdma") == DeviceMetrics(1.76409e9, 0, 7, 0.0)


def test_a_kubelet_that_saw_no_plugin_has_zeros() -> None:
    assert parse("process_start_time_seconds 12\n", "nvidia.com/gpu") == DeviceMetrics(12, 0, 0, 0)
