"""Every profile answers NVML with the facts its public sources give.

FACTS holds, per profile, only values a cited source states (or derives by the arithmetic
written beside it in fakenvml/profiles.py, where the tags in brackets point); the values a
profile lists in its `unsourced` are deliberately absent. Each profile is read back through
nvidia-ml-py from a node whose inventory holds one GPU of that profile, so the test fails
when a profile drifts from its sources and when the library stops serving a fact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as nv
import pytest

from fakenvml.node import NodeDir
from fakenvml.profiles import PROFILES

MIB = 1 << 20
NS = "NOT_SUPPORTED"  # what nvidia-smi prints as N/A

# key -> fact -> value. Units: MiB, W, MHz, Celsius. clocks: (graphics, sm, memory, video);
# temps: (shutdown, slowdown, gpu max operating, memory max operating or NS).
FACTS: dict[str, dict[str, object]] = {
    "A100-SXM4-40GB": {  # [x] XueSongTap.github.io nvidia-smi -q; [d] nvidia-docker#1648
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "reserved_mib": 620,
        "bar1_mib": 65536,
        "pci": (0x20B010DE, 0x134F10DE),
        "cc": (8, 0),
        "board": ("692-2G506-0200-002", "92.00.36.00.04", "G506.0200.00.04"),
        "power_w": (400, 100, 400),
        "max_clocks": (1410, 1410, 1215, 1290),
        "app_clocks": (1095, 1215),
        "boost_mhz": 1410,
        "temps": (92, 89, 85, 95),
        "pcie": (4, 16),
        "cores_bus": (6912, 5120),
        "pstate": 0,
        "row_remap_max": 640,
        "mig": [  # [lgip] nvidia-smi mig -lgip, GiB to MiB
            ("MIG 1g.5gb", 4864),
            ("MIG 2g.10gb", 9984),
            ("MIG 3g.20gb", 20096),
            ("MIG 4g.20gb", 20096),
            ("MIG 7g.40gb", 40320),
            ("MIG 1g.5gb+me", 4864),
            ("MIG 1g.10gb", 9984),
        ],
    },
    "A100-SXM4-80GB": {  # [m4] huggingface/m4-logs; [t] thamada/nvidia-smi A100SXMx4
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "reserved_mib": 763,
        "bar1_mib": 131072,
        "pci": (0x20B210DE, 0x146310DE),
        "cc": (8, 0),
        "board": ("692-2G506-0210-002", "92.00.45.00.05", "G506.0210.00.03"),
        "power_w": (400, 100, 400),
        "max_clocks": (1410, 1410, 1593, 1290),
        "app_clocks": (1155, 1593),
        "boost_mhz": 1410,
        "temps": (92, 89, 85, 95),
        "pcie": (4, 16),
        "cores_bus": (6912, 5120),
        "pstate": 0,
        "row_remap_max": 640,
        "mem_clocks": [1593],  # [sc] Supported Clocks
        "mem_temp": 43,  # [t] Memory Current Temp
        "mig": [  # [lgip] nvidia-smi mig -lgip, GiB to MiB
            ("MIG 1g.10gb", 9728),
            ("MIG 2g.20gb", 19968),
            ("MIG 3g.40gb", 40192),
            ("MIG 4g.40gb", 40192),
            ("MIG 7g.80gb", 80896),
            ("MIG 1g.10gb+me", 9728),
            ("MIG 1g.20gb", 19968),
        ],
    },
    "H100-SXM5-80GB": {  # tests/fakenvml/data/h100/ (h100-walk.json, h100-smi-q.txt)
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "reserved_mib": 480,
        "bar1_mib": 131072,
        "pci": (0x233010DE, 0x16C110DE),
        "cc": (9, 0),
        "board": ("692-2G520-0200-500", "96.00.DA.00.0C", "G520.0200.00.05"),
        "power_w": (700, 200, 700),
        "max_clocks": (1980, 1980, 2619, 1545),
        "app_clocks": (1980, 2619),
        "boost_mhz": 1980,
        "temps": (95, 89, 87, 95),
        "pcie": (5, 16),
        "cores_bus": (16896, 5120),
        "pstate": 0,
        "row_remap_max": 2560,
        "mem_clocks": [2619, 1593],
        "mem_temp": 50,
        "display": 1,
        "mig": [
            ("MIG 1g.10gb", 9984),
            ("MIG 2g.20gb", 20096),
            ("MIG 3g.40gb", 40448),
            ("MIG 4g.40gb", 40448),
            ("MIG 7g.80gb", 81152),
            ("MIG 1g.10gb+me", 9984),
            ("MIG 1g.20gb", 20096),
        ],
    },
    "H200": {  # [g] thamada/gls H200_smi.py, H200_deviceQuery.py
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "reserved_mib": 700,
        "bar1_mib": 262144,
        "pci": (0x233510DE, 0x18BE10DE),
        "cc": (9, 0),
        "board": ("695-2G520-0280-000", "96.00.A5.00.03", "G520.0280.02.02"),
        "power_w": (700, 200, 700),
        "max_clocks": (1980, 1980, 3201, 1545),
        "app_clocks": (1980, 3201),
        "boost_mhz": 1980,
        "temps": (95, 89, 87, 95),  # derived from the T.Limit form, as on the H100
        "pcie": (5, 16),
        "cores_bus": (16896, 6144),
        "pstate": 0,
        "row_remap_max": 3072,
        "mem_temp": 25,  # Memory Current Temp
        "display": 0,  # Display Mode: Disabled
        "mig_mib_of": {  # [lgip] nvidia-smi mig -lgip, GiB to MiB
            "MIG 1g.18gb": 16384,
            "MIG 1g.18gb+me": 16384,
            "MIG 2g.35gb": 33280,
            "MIG 7g.141gb": 143360,
        },
    },
    "B200": {  # [cv] chegva.com/6622.html; [mp] NVIDIA's MIG config; [mig] MIG user guide
        "name": "NVIDIA B200",
        "memory_mib": 183359,
        "pci_device": 0x290110DE,
        "cc": (10, 0),
        "power_default_w": 1000,
        "pstate": 0,
    },
    "L40S": {  # [l] thamada/nvidia-smi L40S_smi.py, L40S_deviceQuery.py
        "name": "NVIDIA L40S",
        "memory_mib": 46068,
        "reserved_mib": 479,
        "bar1_mib": 65536,
        "pci": (0x26B910DE, 0x185110DE),
        "cc": (8, 9),
        "board": ("900-2G133-0080-000", "95.02.66.00.02", "G133.0242.00.03"),
        "power_w": (350, 100, 350),
        "max_clocks": (2520, 2520, 9001, 1965),
        "app_clocks": (2520, 9001),
        "boost_mhz": 2520,
        "temps": (92, 89, 87, NS),  # derived from the T.Limit form
        "pcie": (4, 16),
        "cores_bus": (18176, 384),
        "pstate": 8,
        "row_remap_max": 192,
        "mem_temp": NS,  # Memory Current Temp: N/A
        "display": 1,  # Display Mode: Enabled
    },
    "T4": {  # [z] nvidia-smi -q walkthrough; [ct] nvidia-container-toolkit#465; [n] #1446
        "name": "Tesla T4",
        "memory_mib": 15360,
        "reserved_mib": 393,
        "bar1_mib": 256,
        "pci": (0x1EB810DE, 0x12A210DE),
        "board": ("900-2G183-0000-001", "90.04.38.00.03", "G183.0200.00.02"),
        "power_w": (70, 60, 70),
        "max_clocks": (1590, 1590, 5001, 1470),
        "app_clocks": (585, 5001),
        "boost_mhz": 1590,
        "temps": (96, 93, 85, NS),
        "pcie": (3, 16),
        "pstate": 8,
        "row_remap_max": NS,  # Turing retires pages instead ("Remapped Rows: N/A")
        "mem_clocks": [5001],  # [ml] Supported Clocks
        "mem_temp": NS,  # Memory Current Temp: N/A
        "display": 1,  # Display Mode: Enabled
    },
    "A10G": {  # [w] AWS g5 nvidia-smi -q (driver 535); [k] k8s-device-plugin#344
        "name": "NVIDIA A10G",
        "memory_mib": 23028,
        "reserved_mib": 304,
        "bar1_mib": 32768,
        "pci": (0x223710DE, 0x152F10DE),
        "board": ("900-2G133-A840-000", "94.02.75.00.01", "G133.0210.00.04"),
        "power_w": (300, 100, 300),
        "max_clocks": (1710, 1710, 6251, 1500),
        "app_clocks": (1710, 6251),
        "boost_mhz": 1710,
        "temps": (98, 95, 88, NS),
        "pcie": (4, 16),
        "row_remap_max": 192,
        "fan": True,
    },
    "RTX-A6000": {  # [b] bart#323; [r]/[rq] thamada/gls RTX_A6000_x9; pci.ids
        "name": "NVIDIA RTX A6000",
        "memory_mib": 46068,
        "reserved_mib": 450,  # derived: deviceQuery's 45619 MBytes
        "pci_device": 0x223010DE,
        "cc": (8, 6),
        "power_w": (300, 100, 300),
        "max_clocks": (2100, 2100, 8001, 1950),
        "app_clocks": (1800, 8001),
        "boost_mhz": NS,
        "cores_bus": (10752, 384),
        "pstate": 8,
        "fan": True,
    },
}


def _or_ns(call: Callable[..., Any], *args: object) -> object:
    try:
        return call(*args)
    except nv.NVMLError_NotSupported:
        return NS


def _mig(h: object) -> list[tuple[str, int]]:
    out = []
    for profile in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfoV(h, profile, 2)
        except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
            continue
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        out.append((name, info.memorySizeMB))
    return out


def _field(h: object, field_id: int) -> object:
    (v,) = nv.nvmlDeviceGetFieldValues(h, [field_id])
    return v.value.uiVal if v.nvmlReturn == nv.NVML_SUCCESS else NS


def _row_remap_max(h: object) -> object:
    histogram = _or_ns(nv.nvmlDeviceGetRowRemapperHistogram, h)
    return histogram if histogram == NS else histogram.max  # type: ignore[attr-defined]


# fact -> how nvidia-ml-py reads it from a device handle
READ: dict[str, Callable[[object], object]] = {
    "name": nv.nvmlDeviceGetName,
    "memory_mib": lambda h: nv.nvmlDeviceGetMemoryInfo(h).total // MIB,
    "reserved_mib": lambda h: (
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).reserved // MIB
    ),
    "bar1_mib": lambda h: nv.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total // MIB,
    "pci": lambda h: (
        nv.nvmlDeviceGetPciInfo(h).pciDeviceId,
        nv.nvmlDeviceGetPciInfo(h).pciSubSystemId,
    ),
    "pci_device": lambda h: nv.nvmlDeviceGetPciInfo(h).pciDeviceId,
    "cc": lambda h: tuple(nv.nvmlDeviceGetCudaComputeCapability(h)),
    "board": lambda h: (
        nv.nvmlDeviceGetBoardPartNumber(h),
        nv.nvmlDeviceGetVbiosVersion(h),
        nv.nvmlDeviceGetInforomImageVersion(h),
    ),
    "power_w": lambda h: (
        nv.nvmlDeviceGetPowerManagementDefaultLimit(h) // 1000,
        *(mw // 1000 for mw in nv.nvmlDeviceGetPowerManagementLimitConstraints(h)),
    ),
    "power_default_w": lambda h: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) // 1000,
    "max_clocks": lambda h: tuple(nv.nvmlDeviceGetMaxClockInfo(h, c) for c in range(4)),
    "app_clocks": lambda h: (
        nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_GRAPHICS),
        nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_MEM),
    ),
    "boost_mhz": lambda h: _or_ns(nv.nvmlDeviceGetMaxCustomerBoostClock, h, nv.NVML_CLOCK_GRAPHICS),
    "temps": lambda h: tuple(
        _or_ns(nv.nvmlDeviceGetTemperatureThreshold, h, t)
        for t in (
            nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
            nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
            nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
        )
    ),
    "pcie": lambda h: (
        nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        nv.nvmlDeviceGetMaxPcieLinkWidth(h),
    ),
    "cores_bus": lambda h: (nv.nvmlDeviceGetNumGpuCores(h), nv.nvmlDeviceGetMemoryBusWidth(h)),
    "pstate": nv.nvmlDeviceGetPerformanceState,
    "row_remap_max": _row_remap_max,
    "fan": lambda h: _or_ns(nv.nvmlDeviceGetFanSpeed, h) != NS,
    "mig": _mig,
    "mig_mib_of": lambda h: dict(_mig(h)),
    "mem_clocks": nv.nvmlDeviceGetSupportedMemoryClocks,
    "mem_temp": lambda h: _field(h, nv.NVML_FI_DEV_MEMORY_TEMP),
    "display": nv.nvmlDeviceGetDisplayMode,
}


def test_every_profile_has_a_table_of_sourced_facts() -> None:
    assert set(FACTS) == set(PROFILES)
    assert all(set(facts) <= set(READ) for facts in FACTS.values())


def _holds(seen: object, want: object) -> bool:
    """Equal, or for a dict of cited values, each of them as cited (the rest unsourced)."""
    if isinstance(want, dict) and isinstance(seen, dict):
        return all(seen.get(k) == v for k, v in want.items())
    return seen == want


@pytest.mark.parametrize("key", sorted(FACTS))
def test_profile_answers_its_sourced_facts(
    key: str, fake_library: object, make_state: Callable[..., NodeDir]
) -> None:
    make_state({"gpus": [{"profile": key}]}, name=f"facts-{key.lower()}")
    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        seen = {fact: READ[fact](h) for fact in FACTS[key]}
    finally:
        nv.nvmlShutdown()
    drift = {f: (seen[f], want) for f, want in FACTS[key].items() if not _holds(seen[f], want)}
    assert not drift, f"{key} drifted from its sources (seen, cited): {drift}"
