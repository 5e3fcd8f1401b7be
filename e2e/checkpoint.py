"""kubelet's device-manager checkpoint (/var/lib/kubelet/device-plugins/
kubelet_internal_checkpoint): which device IDs kubelet handed to which container."""

from __future__ import annotations

import json

from clusters.lab import Lab

PATH = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def allocations(lab: Lab, node: str) -> dict[tuple[str, str, str], list[str]]:
    """{(pod uid, container, resource): sorted device IDs} read inside the node."""
    data = json.loads(lab.node_read(node, PATH))["Data"]
    out: dict[tuple[str, str, str], list[str]] = {}
    for e in data.get("PodDeviceEntries") or []:
        # DeviceIDs maps NUMA node -> IDs (kubelet >= 1.20's checkpoint format).
        ids = [i for per_numa in (e.get("DeviceIDs") or {}).values() for i in per_numa]
        out[(e["PodUID"], e["ContainerName"], e["ResourceName"])] = sorted(ids)
    return out
