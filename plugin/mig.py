"""MIG devices through NVML, named and grouped the way NVIDIA's device plugin does.

Strategies (NVIDIA's `--mig-strategy`):
- none:   MIG is ignored; every GPU is one `nvidia.com/gpu`, MIG-enabled or not.
- single: every GPU has MIG enabled with one uniform profile; `nvidia.com/gpu` counts the
          MIG devices. A node mixing MIG and full GPUs, or two profiles, is refused.
- mixed:  full GPUs stay `nvidia.com/gpu`; each MIG profile is its own resource,
          `nvidia.com/mig-<profile>` (`nvidia.com/mig-1g.10gb`).

Profile names follow NVIDIA's rule (go-nvlib's MIG profile): `<g>g.<gb>gb`, or
`<c>c.<g>g.<gb>gb` when the compute instance is smaller than its GPU instance, where gb is
the slice's memory as a fraction of the board's, rounded up to eighths, times the board's
memory in whole GB; `+me`, `+me.all`, `+gfx` or `-me` follow from the GPU-instance profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pynvml as nv

from plugin.devices import Gpu

STRATEGIES = ("none", "single", "mixed")
_ONE_MIB, _ONE_GIB = 1 << 20, 1 << 30


@dataclass(frozen=True)
class MigDevice:
    parent: Gpu
    index: int  # among the parent's MIG devices, as GetMigDeviceHandleByIndex counts them
    uuid: str
    gi: int
    ci: int
    profile: str  # `1g.10gb`


MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")  # under the driver's root


def read_mig_minors(root: Path) -> dict[str, int]:
    """The driver's capability minors (`gpu0/gi3/ci0/access 31`), from <root>/proc/driver/
    nvidia-caps/mig-minors; empty where there is none (no MIG-capable driver)."""
    try:
        text = (root / MIG_MINORS).read_text()
    except OSError:
        return {}
    minors = {}
    for line in text.splitlines():
        name, _, minor = line.rpartition(" ")
        if name and minor.isdigit():
            minors[name] = int(minor)
    return minors


def cap_nodes(m: MigDevice, minors: dict[str, int]) -> list[str]:
    """The /dev nodes (relative to /dev) that give a container a MIG device's GPU and
    compute instance, as NVIDIA's plugin passes them: nvidia-caps/nvidia-cap<minor>."""
    prefix = f"gpu{m.parent.minor}/gi{m.gi}"
    keys = (f"{prefix}/access", f"{prefix}/ci{m.ci}/access")
    return [f"nvidia-caps/nvidia-cap{minors[k]}" for k in keys if k in minors]


class MigConfigError(Exception):
    """A MIG layout the strategy refuses; one line, NVIDIA's words where it has them."""


def _attribute_suffix(gi_profile_id: int) -> str:
    suffixes = {
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
    }
    for name, suffix in suffixes.items():
        if getattr(nv, name, None) == gi_profile_id:  # older bindings lack the newer ids
            return suffix
    return ""


def memory_gb(board_total_bytes: int, slice_mib: int) -> int:
    """The `<gb>` of a profile name, from the slice's and the board's memory."""
    fraction = slice_mib * _ONE_MIB / board_total_bytes
    fraction = math.ceil(fraction * 8) / 8
    board_gb = (board_total_bytes + _ONE_GIB - 1) // _ONE_GIB
    return math.floor(fraction * board_gb + 0.5)  # halves up, as Go's math.Round (3g.71gb)


def profile_name(g: int, c: int, gb: int, suffix: str = "") -> str:
    return f"{g}g.{gb}gb{suffix}" if c == g else f"{c}c.{g}g.{gb}gb{suffix}"


def _profile_index(parent: object, profile_id: int) -> int:
    """The NVML_GPU_INSTANCE_PROFILE_* whose profile has this id (an instance's info names
    the id, 19; the suffix follows from the profile constant, 0 for 1_SLICE)."""
    for i in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            if nv.nvmlDeviceGetGpuInstanceProfileInfo(parent, i).id == profile_id:
                return i
        except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
            continue
    return -1


def mig_enabled(handle: object) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except nv.NVMLError_NotSupported:
        return False
    return current == nv.NVML_DEVICE_MIG_ENABLE


def discover(gpu: Gpu) -> list[MigDevice]:
    """The MIG devices of one MIG-enabled GPU, in NVML's index order."""
    parent = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
    board = nv.nvmlDeviceGetMemoryInfo(parent).total
    out = []
    for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            h = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except nv.NVMLError_NotFound:
            continue  # a hole: that index has no instance now
        gi, ci = nv.nvmlDeviceGetGpuInstanceId(h), nv.nvmlDeviceGetComputeInstanceId(h)
        attrs = nv.nvmlDeviceGetAttributes(h)
        info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(parent, gi))
        name = profile_name(
            attrs.gpuInstanceSliceCount,
            attrs.computeInstanceSliceCount,
            memory_gb(board, attrs.memorySizeMB),
            _attribute_suffix(_profile_index(parent, info.profileId)),
        )
        out.append(MigDevice(gpu, i, nv.nvmlDeviceGetUUID(h), gi, ci, name))
    return out


def plan(strategy: str, gpus: list[Gpu], default: str) -> dict[str, list[Gpu | MigDevice]]:
    """Resource name -> its devices (full GPUs and MIG devices) under a strategy."""
    if strategy == "none":
        return {default: list(gpus)}
    full: list[Gpu] = []
    slices: list[MigDevice] = []
    for g in gpus:
        if mig_enabled(nv.nvmlDeviceGetHandleByUUID(g.uuid)):
            slices.extend(discover(g))
        else:
            full.append(g)
    if strategy == "single":
        if full and slices:
            raise MigConfigError(
                "all devices on the node must be configured with the same migEnabled value"
            )
        if not slices:
            return {default: list(full)}
        profiles = sorted({m.profile for m in slices})
        if len(profiles) > 1:
            raise MigConfigError(
                f"MIG strategy single needs one MIG profile on the node, found {profiles}"
            )
        return {default: list(slices)}
    out: dict[str, list[Gpu | MigDevice]] = {default: list(full)} if full else {}
    vendor = default.split("/")[0]
    for m in slices:
        out.setdefault(f"{vendor}/mig-{m.profile}", []).append(m)
    return out
