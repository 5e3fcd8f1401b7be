"""Optional Prometheus metrics: registrations, health transitions, allocated devices."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registrations = Counter("gpulab_plugin_registrations", "Registrations with kubelet",
                                     ["resource"], registry=self.registry)  # fmt: skip
        self.health_transitions = Counter(
            "gpulab_plugin_health_transitions", "Device health changes",
            ["resource", "to"], registry=self.registry,
        )  # fmt: skip
        self.allocations = Counter("gpulab_plugin_allocated_devices", "Devices allocated",
                                   ["resource"], registry=self.registry)  # fmt: skip

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
