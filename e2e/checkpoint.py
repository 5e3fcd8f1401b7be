"""kubelet's device-manager checkpoint (/var/lib/kubelet/device-plugins/
kubelet_internal_checkpoint): which device IDs kubelet handed to which container."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence

from clusters.labs.lab import Lab

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


def allocated_nodes(lab: Lab, node: str) -> dict[tuple[str, str, str], tuple[list[str], list[str]]]:
    """{(pod uid, container, resource): (device IDs, the container paths of the device specs
    the plugin's Allocate answered with)}: kubelet keeps each answer (AllocResp, the
    ContainerAllocateResponse's bytes) beside the IDs."""
    from plugin.api.v1beta1 import api_pb2 as pb

    data = json.loads(lab.node_read(node, PATH))["Data"]
    out: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for e in data.get("PodDeviceEntries") or []:
        ids = [i for per_numa in (e.get("DeviceIDs") or {}).values() for i in per_numa]
        resp = pb.ContainerAllocateResponse.FromString(base64.b64decode(e.get("AllocResp") or ""))
        paths = [d.container_path for d in resp.devices]
        out[(e["PodUID"], e["ContainerName"], e["ResourceName"])] = (sorted(ids), paths)
    return out


class InconsistentIds(AssertionError):
    """One device id was handed with different GPUs: no mapping of ids to GPUs explains the
    plugin's answers (a real bug of the plugin's)."""


def solve(answers: Iterable[tuple[Sequence[str], Sequence[str]]]) -> dict[str, str]:
    """Opaque device id -> GPU, from Allocate answers (the ids, the GPUs their device specs
    name): an answer with one GPU left names its ids' GPU; ids solved are taken out of the
    others until nothing changes. Ids only ever handed out several at a time stay unsolved
    (their answers still name them as a group: Pods.gpus_of)."""
    left = [(set(ids), list(gpus)) for ids, gpus in answers]
    solved: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for ids, gpus in left:
            for i in [i for i in ids if i in solved]:
                if solved[i] not in gpus:
                    raise InconsistentIds(f"device id {i} came with {solved[i]} once and "
                                          f"with {sorted(gpus)} another time")  # fmt: skip
                ids.discard(i)
                gpus.remove(solved[i])
            if ids and len(set(gpus)) == 1:  # every id left is that GPU (replicas share one)
                solved.update(dict.fromkeys(ids, gpus[0]))
                ids.clear()
                gpus.clear()
                changed = True
    return solved
