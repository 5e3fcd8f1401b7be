"""The kubelet metrics parser, on text in the exposition format a kubelet serves."""

from __future__ import annotations

from clusters.labs.kubelet_metrics import DeviceMetrics, parse, same_kubelet

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


def test_a_kubelet_whose_start_time_moved_a_second_is_the_same_one() -> None:
    """btime, and with it process_start_time_seconds, moves with the wall clock."""
    before = DeviceMetrics(1.76409e9, 7, 3, 0.01)
    assert same_kubelet(before, before._replace(started=before.started + 1))
    assert same_kubelet(before, before._replace(started=before.started - 1, registrations=8))


def test_a_restarted_kubelet_is_a_new_one_by_its_start_or_its_counter() -> None:
    before = DeviceMetrics(1.76409e9, 7, 3, 0.01)
    assert not same_kubelet(before, DeviceMetrics(before.started + 600, 1, 0, 0.0))
    # Restarted within seconds: its registration counter began again at zero.
    assert not same_kubelet(before, DeviceMetrics(before.started + 2, 1, 0, 0.0))
