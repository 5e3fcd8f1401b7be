"""The platform layer of the board model: where a node's GPUs run, bare metal or passed
through to a virtual machine. An inventory names it (`platform: vm-passthrough`); the
state header carries it, and the library answers from it what a platform decides rather
than the board: the virtualization mode, whether the GPU has a NUMA node of its own, the
PCIe tree around the GPU, and whether the driver shows the NVLink fabric.

The other layers: fakenvml/branches.py (the driver), fakenvml/families.py (the
architecture), fakenvml/profiles.py (the board, built from them).
"""

from __future__ import annotations

from dataclasses import dataclass

from fakenvml.errors import FakeNvmlError
from fakenvml.layout import PLATFORM_BARE_METAL, PLATFORM_VM_PASSTHROUGH


@dataclass(frozen=True)
class Platform:
    key: str  # what inventories name
    code: int  # the state header's platform (FNV_PLATFORM_*), which the library reads
    # The driver shows no NVLink at all (no fabric in the VM): the inventory's GPUs get no
    # links unless its topology says otherwise; link indices are still checked against
    # the board's links.
    hides_nvlink: bool
    # What the library answers on it, with the source: call -> (answer, source).
    answers: tuple[tuple[str, str, str], ...]


BARE_METAL = Platform(
    key="bare-metal",
    code=PLATFORM_BARE_METAL,
    hides_nvlink=False,
    answers=(
        ("nvmlDeviceGetVirtualizationMode", "NONE (0)",
         "nvidia-smi -q of A100 [t] and L40S [l] on bare metal: Virtualization Mode: None"),
    ),
)  # fmt: skip

VM_PASSTHROUGH = Platform(
    key="vm-passthrough",
    code=PLATFORM_VM_PASSTHROUGH,
    hides_nvlink=True,
    answers=(
        ("nvmlDeviceGetVirtualizationMode", "PASSTHROUGH (1)",
         "the H100 capture (h100-walk.json: 1; h100-smi-q.txt: Pass-Through), and nvidia-smi "
         "-q of an H200 [g] and a T4 [z] in VMs: Virtualization Mode: Pass-Through"),
        ("nvmlDeviceGetNumaNodeId", "NOT_SUPPORTED", "the H100 capture"),
        ("nvmlDeviceGetTopologyCommonAncestor (the GPU with itself)", "NOT_SUPPORTED",
         "the H100 capture; unsourced for two GPUs of one VM (their PCIe levels stay)"),
        ("NVLink getters", "NOT_SUPPORTED; capability probes past the board's last link "
         "INVALID_ARGUMENT", "the H100 capture (NVLink not active in its VM)"),
    ),
)  # fmt: skip

PLATFORMS: dict[str, Platform] = {p.key: p for p in (BARE_METAL, VM_PASSTHROUGH)}


def get(key: str) -> Platform:
    """A platform by key; FakeNvmlError lists the known keys."""
    try:
        return PLATFORMS[key]
    except KeyError:
        raise FakeNvmlError(f"unknown platform {key!r} (known: {', '.join(PLATFORMS)})") from None


def of(code: int) -> Platform:
    """The platform a state header's code names (bare metal for unknown codes)."""
    return next((p for p in PLATFORMS.values() if p.code == code), BARE_METAL)
