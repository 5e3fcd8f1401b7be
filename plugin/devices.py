"""GPU discovery through NVML (nvidia-ml-py) and the topology the allocator scores.

Only NVML is read, never /proc or /sys, so the plugin behaves the same on fakenvml and on
real GPUs. Pairwise PCIe levels are looked up lazily and cached: a 1024-GPU node needs no
million-call matrix at start-up.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import pynvml as nv

log = logging.getLogger("gpulab-plugin")
LINK_PROBE = 36  # NVML_NVLINK_MAX_LINKS; real boards answer INVALID_ARGUMENT past the last


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    bus_id: str
    numa: int | None
    name: str


def _numa(handle: object) -> int | None:
    try:
        return nv.nvmlDeviceGetNumaNodeId(handle)
    except nv.NVMLError:
        return None  # VMs and single-socket boxes: no NUMA affinity to report


class Topology:
    """NVLink counts and PCIe common-ancestor levels between GPUs, by index."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        by_bus = {g.bus_id.upper(): g.index for g in gpus}
        self.direct: dict[tuple[int, int], int] = {}
        self.switch_links: dict[int, int] = {}
        for g in gpus:
            handle = nv.nvmlDeviceGetHandleByIndex(g.index)
            for link in range(LINK_PROBE):
                try:
                    if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    kind = nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                    remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                except nv.NVMLError:
                    break  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last)
                if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    self.switch_links[g.index] = self.switch_links.get(g.index, 0) + 1
                elif (peer := by_bus.get(remote.upper())) is not None:
                    key = (g.index, peer)
                    self.direct[key] = self.direct.get(key, 0) + 1

    def nvlinks(self, a: int, b: int) -> int:
        via_switch = min(self.switch_links.get(a, 0), self.switch_links.get(b, 0))
        return self.direct.get((a, b), 0) + via_switch

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019  (one Topology per process)
    def level(self, a: int, b: int) -> int:
        ha, hb = nv.nvmlDeviceGetHandleByIndex(a), nv.nvmlDeviceGetHandleByIndex(b)
        return nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb)

    def score(self, a: int, b: int) -> int:
        """NVLink first (100 per link), then the nearest PCIe ancestor, which also tells
        NUMA apart (NODE 40 vs SYSTEM 50): 0..50 never outweighs one link."""
        return 100 * self.nvlinks(a, b) + (50 - self.level(a, b))


def discover() -> list[Gpu]:
    """Every GPU NVML can reach. A GPU already lost has no identity to advertise (its
    handle lookup fails), so it is left out, with a warning, instead of failing start-up."""
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError_GpuIsLost:
            log.warning("GPU %d is lost; not advertising it", i)
            continue
        gpus.append(
            Gpu(i, nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetMinorNumber(h),
                nv.nvmlDeviceGetPciInfo(h).busId, _numa(h), nv.nvmlDeviceGetName(h))
        )  # fmt: skip
    return gpus
