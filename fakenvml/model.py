"""The node model: what the control plane writes and the C library serves.

Plain dataclasses with no policy; profiles and inventories (YAML) build them, statefile
packs them. Field units follow NVML: bytes, milliwatts, millijoules, Celsius, MHz, percent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fakenvml.layout import (  # noqa: F401  (re-exported)
    FIELD_UNKNOWN,
    MAX_DEVICES,
    MAX_LINKS,
    PLATFORM_BARE_METAL,
    PLATFORM_VM_PASSTHROUGH,
)
from fakenvml.nvmlconst import (  # noqa: F401  (re-exported: the model's vocabulary)
    LINK_REMOTE_GPU,
    LINK_REMOTE_SWITCH,
    VALUE_DOUBLE,
    VALUE_SINT,
    VALUE_UINT,
    VALUE_ULL,
)


@dataclass
class Link:
    """One NVLink of a GPU: where it goes (a peer GPU or an NVSwitch)."""

    remote_kind: int = LINK_REMOTE_GPU
    remote_index: int = 0  # peer GPU index when remote_kind is a GPU
    remote_bus_id: str = ""  # "00000000:3B:00.0" of the peer or switch
    remote_device_id: int = 0  # PCI device id (device << 16 | vendor) of the peer or switch
    active: bool = True


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile a MIG-capable GPU offers (nvmlGpuInstanceProfileInfo_v2_t)."""

    profile: int  # NVML_GPU_INSTANCE_PROFILE_*: what callers ask with
    id: int
    name: str
    slice_count: int
    instance_count: int
    multiprocessors: int
    memory_mib: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placement_size: int  # slices one placement spans
    placement_starts: tuple[int, ...]  # first slice of each possible placement
    is_p2p: bool = False


FieldValue = tuple[int, int | float]  # (value type, value)


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    serial: str
    pci_domain: int
    pci_bus: int
    pci_device: int
    pci_device_id: int  # (device << 16) | 0x10DE, as nvmlPciInfo_t.pciDeviceId
    pci_subsystem_id: int
    memory_total: int  # bytes
    cc_major: int
    cc_minor: int
    arch: int  # NVML_DEVICE_ARCH_*
    minor: int = -1  # /dev/nvidiaN; defaults to index
    pci_function: int = 0
    brand: int = 14  # NVML_BRAND_NVIDIA
    part_number: str = ""
    vbios: str = ""
    inforom: str = ""
    memory_reserved: int = 0
    memory_used: int = 0
    bar1_total: int = 0
    power_usage_mw: int = 0
    power_limit_mw: int = 0
    power_min_mw: int = 0
    power_max_mw: int = 0
    power_default_mw: int = 0
    nvlink_board: int = 0  # the board's NVLinks, seen or not (links: those the driver shows)
    energy_mj: int = 0
    temp_gpu: int = 35
    temp_slowdown: int = 87
    temp_shutdown: int = 92
    temp_gpu_max: int = 85
    temp_mem_max: int = 95
    fan_count: int = 0  # SXM boards have no fans: fan getters answer NOT_SUPPORTED
    fan_speed: int = 0
    clocks: tuple[int, int, int, int] = (0, 0, 0, 0)  # current graphics, sm, mem, video
    max_clocks: tuple[int, int, int, int] = (0, 0, 0, 0)
    util_gpu: int = 0
    util_mem: int = 0
    pstate: int = 0
    ecc_enabled: bool = True
    persistence: bool = True
    compute_mode: int = 0  # NVML_COMPUTEMODE_DEFAULT
    numa_node: int = 0
    cpu_first: int = 0
    cpu_count: int = 0
    pcie_switch: int = 0  # GPUs behind the same switch are NVML_TOPOLOGY_SINGLE apart
    pcie_upper_switch: int = 0  # ... the same upper switch: NVML_TOPOLOGY_MULTIPLE
    host_bridge: int = 0  # ... the same host bridge: NVML_TOPOLOGY_HOSTBRIDGE
    pcie_gen: int = 4
    pcie_width: int = 16
    board_id: int = 0
    multi_gpu_board: bool = False
    nvlink_version: int = 0
    num_cores: int = 0
    memory_bus_width: int = 0
    links: list[Link] = field(default_factory=list)
    # Capabilities; the defaults are what every profile answered before they were captured.
    event_types: int = 0x800B  # Xid, recovery action, ECC (the library drops ECC when it is off)
    clock_event_reasons: int = 0x7FF  # nvmlClocksEventReasonAll
    ecc_locations: int = 0xFF  # bit per nvmlMemoryLocation_t
    display_mode: int = 0
    app_clocks: tuple[int, int, int, int] | None = None  # None: max_clocks; 0: NOT_SUPPORTED
    boost_clocks: tuple[int, int, int, int] | None = None
    mem_clocks: tuple[int, ...] = ()  # supported memory clocks, highest first; (): NOT_SUPPORTED
    gfx_clock_min: int = 0
    gfx_clock_step: int = 0
    pstates: tuple[int, ...] = ()  # supported P-states as the driver lists them
    row_remap_max: int = 0
    conf_compute: bool = False
    mig_profiles: list[MigProfile] = field(default_factory=list)
    # The inventory's `mig:` (fakenvml/mig.py: all-1g.10gb, or 3g.40gb,2g.20gb): made at
    # `init` as journal records, like any later change; not part of the state file.
    mig_layout: str = ""
    fields: dict[int, FieldValue] = field(default_factory=dict)  # id -> (type, value)

    def __post_init__(self) -> None:
        # Application and boost clocks default to the maximum, as before profiles said more.
        if self.app_clocks is None:
            self.app_clocks = self.max_clocks
        if self.boost_clocks is None:
            self.boost_clocks = self.max_clocks

    @property
    def bus_id(self) -> str:
        """NVML's busId form: 8-digit domain, upper-case hex."""
        return (
            f"{self.pci_domain:08X}:{self.pci_bus:02X}:{self.pci_device:02X}.{self.pci_function:X}"
        )


@dataclass
class Node:
    name: str
    gpus: list[Gpu]
    driver_version: str = "580.95.05"
    nvml_version: str = "13.580.95.05"
    cuda_driver_version: int = 13000  # CUDA 13.0, as nvmlSystemGetCudaDriverVersion
    driver_branch: str = ""  # nvmlSystemGetDriverBranch; "": "r" and the driver's major
    platform: int = PLATFORM_BARE_METAL  # fakenvml/platforms.py
