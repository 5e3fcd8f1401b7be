"""GPU profiles: what one board of a given model reports through NVML.

Values come from public `nvidia-smi -q` / deviceQuery captures of real boards and the PCI ID
repository (pci.ids). A few were not found in any public capture; those lines end in `# ~`
and hold a plausible value of the right shape. Profiles are facts only: identity (UUID,
serial, bus id) and topology are the inventory's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from fakenvml.errors import FakeNvmlError
from fakenvml.model import (
    FIELD_UNKNOWN,
    VALUE_DOUBLE,
    VALUE_SINT,
    VALUE_UINT,
    VALUE_ULL,
    FieldValue,
    Gpu,
    MigProfile,
)

MIB = 1 << 20

# NVML_DEVICE_ARCH_* (nvml.h)
ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10

# nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t, not the marketing generation.
NVLINK_VERSION_ENUM = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}

# NVSwitch PCI device ids (pci.ids: 1af1 "A100 NVSwitch", 22a3 "H100 NVSwitch").
NVSWITCH_GEN2 = 0x1AF110DE
NVSWITCH_GEN3 = 0x22A310DE
NVSWITCH_UNKNOWN = 0  # no public PCI id for the NVLink 5 switch of HGX B200


@dataclass(frozen=True)
class Profile:
    key: str  # what inventories name: "H100-SXM5-80GB"
    name: str  # nvmlDeviceGetName
    memory_mib: int  # FB total as NVML reports it (ECC on)
    reserved_mib: int
    cc: tuple[int, int]
    arch: int
    pci_device_id: int  # (device << 16) | 0x10DE
    pci_subsystem_id: int
    part_number: str
    vbios: str
    inforom: str
    bar1_mib: int
    power_w: tuple[int, int, int]  # default, min, max limit
    idle_power_w: int
    pstate: int  # idle performance state
    clocks: tuple[int, int, int, int]  # idle graphics, sm, mem, video (MHz)
    max_clocks: tuple[int, int, int, int]
    temps: tuple[int, int, int, int, int]  # idle, slowdown, shutdown, gpu max op, mem max op
    cuda_cores: int
    memory_bus_width: int
    pcie: tuple[int, int]  # generation, width
    nvlinks: int = 0
    nvlink_gen: int = 0
    nvswitch_device_id: int = NVSWITCH_UNKNOWN
    nvswitches_per_board: int = 0  # > 0: an HGX baseboard part (SXM)
    fans: int = 0  # SXM and passively cooled PCIe cards report no fans
    fan_speed: int = 0
    # Capabilities captured from a real board; a profile without a capture keeps the
    # defaults of model.Gpu (what the fake always answered).
    caps: dict[str, object] | None = None

    @property
    def sxm(self) -> bool:
        return self.nvswitches_per_board > 0

    def make_gpu(self, index: int, uuid: str, serial: str, bus: tuple[int, int, int, int]) -> Gpu:
        """A Gpu with this profile's values; topology fields are left for the inventory."""
        domain, pci_bus, device, function = bus
        default_w, min_w, max_w = self.power_w
        idle, slowdown, shutdown, gpu_max, mem_max = self.temps
        return Gpu(
            index=index,
            minor=index,  # /dev/nvidiaN follows the index on a freshly booted node
            uuid=uuid,
            name=self.name,
            serial=serial,
            pci_domain=domain,
            pci_bus=pci_bus,
            pci_device=device,
            pci_function=function,
            pci_device_id=self.pci_device_id,
            pci_subsystem_id=self.pci_subsystem_id,
            memory_total=self.memory_mib * MIB,
            memory_reserved=self.reserved_mib * MIB,
            cc_major=self.cc[0],
            cc_minor=self.cc[1],
            arch=self.arch,
            part_number=self.part_number,
            vbios=self.vbios,
            inforom=self.inforom,
            bar1_total=self.bar1_mib * MIB,
            power_usage_mw=self.idle_power_w * 1000,
            power_limit_mw=default_w * 1000,
            power_default_mw=default_w * 1000,
            power_min_mw=min_w * 1000,
            power_max_mw=max_w * 1000,
            temp_gpu=idle,
            temp_slowdown=slowdown,
            temp_shutdown=shutdown,
            temp_gpu_max=gpu_max,
            temp_mem_max=mem_max,
            fan_count=self.fans,
            fan_speed=self.fan_speed,
            clocks=self.clocks,
            max_clocks=self.max_clocks,
            pstate=self.pstate,
            pcie_gen=self.pcie[0],
            pcie_width=self.pcie[1],
            # Real boards report (bus << 8) as board id; the domain keeps ours unique.
            board_id=(domain << 16) | (pci_bus << 8) | device,
            nvlink_version=NVLINK_VERSION_ENUM.get(self.nvlink_gen, 0),
            num_cores=self.cuda_cores,
            memory_bus_width=self.memory_bus_width,
            **(self.caps or {}),  # type: ignore[arg-type]
        )


def _mig(
    profile: int, id: int, name: str, slices: int, count: int, sms: int, mib: int,
    engines: tuple[int, int, int, int], ofas: int, size: int, starts: tuple[int, ...],
) -> MigProfile:  # fmt: skip
    ce, dec, enc, jpg = engines
    return MigProfile(
        profile=profile, id=id, name=name, slice_count=slices, instance_count=count,
        multiprocessors=sms, memory_mib=mib, copy_engines=ce, decoders=dec, encoders=enc,
        jpegs=jpg, ofas=ofas, placement_size=size, placement_starts=starts,
    )  # fmt: skip


def _fields(kind: int, values: dict[int, int | float]) -> dict[int, FieldValue]:
    return {i: (kind, v) for i, v in values.items()}


# The real H100 80GB HBM3 of tests/fakenvml/data/h100/h100-walk.json, every value from that
# capture (key in brackets). Static values are the capture's; counters of time, traffic
# and energy start at 0 on a fake, and the library answers power, ECC and remapping fields
# from the state.
H100_CAPS: dict[str, object] = {
    "event_types": 0xFF9F,  # [_supported_events] 65439
    "clock_event_reasons": 0x1FF,  # [nvmlDeviceGetSupportedClocksEventReasons] 511
    "ecc_locations": 1 << 2 | 1 << 7,  # [nvmlDeviceGetMemoryErrorCounter(*,*,2|7)]: DRAM, SRAM
    "display_mode": 1,  # [nvmlDeviceGetDisplayMode]
    "app_clocks": (1980, 1980, 2619, 0),  # [nvmlDeviceGetApplicationsClock(0..3)]; video: N/S
    "boost_clocks": (1980, 1980, 0, 0),  # [nvmlDeviceGetMaxCustomerBoostClock(0..3)]
    "mem_clocks": (2619, 1593),  # [nvmlDeviceGetSupportedMemoryClocks]
    # [nvmlDeviceGetSupportedGraphicsClocks(maxmem)]: 1980 down in 15 MHz steps; the lowest,
    # 345, is nvclockmin of [nvmlDeviceGetCurrentClockFreqs]
    "gfx_clock_min": 345,
    "gfx_clock_step": 15,
    "pstates": (2, 0),  # [nvmlDeviceGetSupportedPerformanceStates], in the driver's order
    "row_remap_max": 2560,  # [nvmlDeviceGetRowRemapperHistogram] max
    "conf_compute": True,  # [nvmlSystemGetConfComputeCapabilities] gpusCaps 1
    # [nvmlDeviceGetGpuInstanceProfileInfo(p)] and [...PossiblePlacements(id)]:
    # (profile, id, name, slices, instances, SMs, MiB, (CE, NVDEC, NVENC, NVJPG), OFA,
    #  placement size, placement starts)
    "mig_profiles": [
        _mig(0, 19, "MIG 1g.10gb", 1, 7, 16, 9984, (1, 1, 0, 1), 0, 1, (0, 1, 2, 3, 4, 5, 6)),
        _mig(1, 14, "MIG 2g.20gb", 2, 3, 32, 20096, (2, 2, 0, 2), 0, 2, (0, 2, 4)),
        _mig(2, 9, "MIG 3g.40gb", 3, 2, 60, 40448, (3, 3, 0, 3), 0, 4, (0, 4)),
        _mig(3, 5, "MIG 4g.40gb", 4, 1, 64, 40448, (4, 4, 0, 4), 0, 4, (0,)),
        _mig(4, 0, "MIG 7g.80gb", 7, 1, 132, 81152, (8, 7, 0, 7), 1, 8, (0,)),
        _mig(7, 20, "MIG 1g.10gb+me", 1, 1, 16, 9984, (1, 1, 0, 1), 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        _mig(9, 15, "MIG 1g.20gb", 1, 4, 26, 20096, (1, 1, 0, 1), 0, 2, (0, 2, 4, 6)),
    ],
    # [field[N]]: every id the real GPU answers, with its value type; ids the driver
    # rejects (INVALID_ARGUMENT) are FIELD_UNKNOWN; the rest answer NOT_SUPPORTED.
    "fields": {
        **_fields(VALUE_ULL, {1: 1, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0}),
        **_fields(VALUE_ULL, {74: 0, 75: 0, 76: 0, 77: 0, 78: 0, 79: 0, 80: 0, 81: 0, 83: 0}),
        **_fields(VALUE_UINT, {82: 50, 94: 0, 95: 0}),
        **_fields(VALUE_ULL, {142: 0, 143: 0, 144: 0, 145: 0, 269: 0, 270: 0, 271: 0}),
        147: (VALUE_DOUBLE, 0.0),
        **_fields(VALUE_UINT, {169: 0, **{i: 0 for i in range(173, 184)}, 184: 1}),
        **_fields(VALUE_UINT, {185: 0, 186: 0, 187: 0, 188: 0, 189: 0, 190: 0, 192: 0}),
        191: (VALUE_ULL, 0),
        **_fields(VALUE_SINT, {193: -8, 194: -2, 195: 0, 196: 0}),
        **_fields(VALUE_UINT, {197: 0, 198: 0, 199: 1, 226: 0, 227: 0, 228: 0, 229: 0}),
        230: (VALUE_UINT, 0),
        **{i: (FIELD_UNKNOWN, 0) for i in (0, 274, 289, 290, 291, 292, 293, 296, 297, 298, 299)},
    },
}

_ALL = [
    Profile(
        key="A100-SXM4-40GB",
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        reserved_mib=620,
        cc=(8, 0),
        arch=ARCH_AMPERE,
        pci_device_id=0x20B010DE,
        pci_subsystem_id=0x134F10DE,
        part_number="692-2G506-0200-002",
        vbios="92.00.36.00.04",
        inforom="G506.0200.00.04",
        bar1_mib=65536,
        power_w=(400, 100, 400),
        idle_power_w=52,
        pstate=0,
        clocks=(210, 210, 1215, 585),
        max_clocks=(1410, 1410, 1215, 1290),
        temps=(25, 89, 92, 85, 95),
        cuda_cores=6912,
        memory_bus_width=5120,
        pcie=(4, 16),
        nvlinks=12,
        nvlink_gen=3,
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,
    ),
    Profile(
        key="A100-SXM4-80GB",
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        reserved_mib=763,
        cc=(8, 0),
        arch=ARCH_AMPERE,
        pci_device_id=0x20B210DE,
        pci_subsystem_id=0x146310DE,  # the 400 W board (0x147F is the 500 W one)
        part_number="692-2G506-0210-002",
        vbios="92.00.45.00.05",
        inforom="G506.0210.00.03",
        bar1_mib=131072,
        power_w=(400, 100, 400),
        idle_power_w=60,
        pstate=0,
        clocks=(210, 210, 1593, 585),
        max_clocks=(1410, 1410, 1593, 1290),
        temps=(28, 89, 92, 85, 95),
        cuda_cores=6912,
        memory_bus_width=5120,
        pcie=(4, 16),
        nvlinks=12,
        nvlink_gen=3,
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,
    ),
    Profile(
        key="H100-SXM5-80GB",
        name="NVIDIA H100 80GB HBM3",
        # Values below marked [walk] / [smi-q] come from the real H100 80GB HBM3 in
        # tests/fakenvml/data/h100/: h100-walk.json / h100-smi-q.txt (driver 580.159.04).
        memory_mib=81559,
        reserved_mib=480,  # [smi-q] FB Memory Usage: Reserved 480 MiB
        cc=(9, 0),
        arch=ARCH_HOPPER,
        pci_device_id=0x233010DE,
        pci_subsystem_id=0x16C110DE,
        part_number="692-2G520-0200-500",  # [walk] nvmlDeviceGetBoardPartNumber
        vbios="96.00.DA.00.0C",  # [walk] nvmlDeviceGetVbiosVersion
        inforom="G520.0200.00.05",
        bar1_mib=131072,
        power_w=(700, 200, 700),
        idle_power_w=72,  # [walk] nvmlDeviceGetPowerUsage 71836 mW at idle
        pstate=0,
        clocks=(345, 345, 2619, 765),
        max_clocks=(1980, 1980, 2619, 1545),
        temps=(46, 89, 95, 87, 95),  # [walk] nvmlDeviceGetTemperature(Threshold(0..3))
        cuda_cores=16896,
        memory_bus_width=5120,
        pcie=(5, 16),
        nvlinks=18,
        nvlink_gen=4,
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,
        caps=H100_CAPS,
    ),
    Profile(
        key="H200",
        name="NVIDIA H200",
        memory_mib=143771,
        reserved_mib=700,
        cc=(9, 0),
        arch=ARCH_HOPPER,
        pci_device_id=0x233510DE,
        pci_subsystem_id=0x18BE10DE,
        part_number="695-2G520-0280-000",
        vbios="96.00.A5.00.03",
        inforom="G520.0280.02.02",
        bar1_mib=262144,
        power_w=(700, 200, 700),
        idle_power_w=74,
        pstate=0,
        clocks=(345, 345, 3199, 765),
        max_clocks=(1980, 1980, 3201, 1545),
        temps=(28, 89, 92, 87, 95),  # ~ as H100
        cuda_cores=16896,
        memory_bus_width=6144,
        pcie=(5, 16),
        nvlinks=18,
        nvlink_gen=4,
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,
    ),
    Profile(
        key="B200",
        name="NVIDIA B200",
        memory_mib=183359,
        reserved_mib=1000,  # ~
        cc=(10, 0),
        arch=ARCH_BLACKWELL,
        pci_device_id=0x290110DE,
        pci_subsystem_id=0x199910DE,  # ~
        part_number="692-2G525-0220-000",  # ~ NVIDIA's pattern, not seen in a capture
        vbios="97.00.9A.00.0F",
        inforom="G525.0220.00.03",
        bar1_mib=262144,  # ~
        power_w=(1000, 200, 1000),  # ~ min
        idle_power_w=140,
        pstate=0,
        clocks=(120, 120, 3996, 600),  # ~
        max_clocks=(1965, 1965, 3996, 1635),  # ~
        temps=(30, 89, 92, 87, 95),  # ~
        cuda_cores=18944,  # 148 SMs x 128
        memory_bus_width=8192,
        pcie=(5, 16),
        nvlinks=18,
        nvlink_gen=5,
        nvswitch_device_id=NVSWITCH_UNKNOWN,
        nvswitches_per_board=2,  # DGX B200: two NVLink 5 switch chips
    ),
    Profile(
        key="L40S",
        name="NVIDIA L40S",
        memory_mib=46068,
        reserved_mib=479,
        cc=(8, 9),
        arch=ARCH_ADA,
        pci_device_id=0x26B910DE,
        pci_subsystem_id=0x185110DE,
        part_number="900-2G133-0080-000",
        vbios="95.02.66.00.02",
        inforom="G133.0242.00.03",
        bar1_mib=65536,
        power_w=(350, 100, 350),
        idle_power_w=33,
        pstate=8,
        clocks=(210, 210, 405, 1185),
        max_clocks=(2520, 2520, 9001, 1965),
        temps=(30, 95, 98, 88, 0),  # ~ limits; GDDR6 has no memory sensor (0 = N/A)
        cuda_cores=18176,
        memory_bus_width=384,
        pcie=(4, 16),
    ),
    Profile(
        key="T4",
        name="Tesla T4",
        memory_mib=15360,
        reserved_mib=393,
        cc=(7, 5),
        arch=ARCH_TURING,
        pci_device_id=0x1EB810DE,
        pci_subsystem_id=0x12A210DE,
        part_number="900-2G183-0000-001",
        vbios="90.04.38.00.03",
        inforom="G183.0200.00.02",
        bar1_mib=256,
        power_w=(70, 60, 70),
        idle_power_w=14,
        pstate=8,
        clocks=(300, 300, 405, 540),
        max_clocks=(1590, 1590, 5001, 1470),
        temps=(38, 93, 96, 85, 0),
        cuda_cores=2560,
        memory_bus_width=256,
        pcie=(3, 16),
    ),
    Profile(
        key="A10G",
        name="NVIDIA A10G",
        memory_mib=23028,
        reserved_mib=304,
        cc=(8, 6),
        arch=ARCH_AMPERE,
        pci_device_id=0x223710DE,
        pci_subsystem_id=0x152F10DE,
        part_number="900-2G133-A840-000",
        vbios="94.02.75.00.01",
        inforom="G133.0210.00.04",
        bar1_mib=32768,
        power_w=(300, 100, 300),
        idle_power_w=25,  # ~
        pstate=8,
        clocks=(210, 210, 405, 555),  # ~
        max_clocks=(1710, 1710, 6251, 1500),
        temps=(27, 95, 98, 88, 0),
        cuda_cores=10240,  # 80 SMs x 128
        memory_bus_width=384,
        pcie=(4, 16),
        fans=1,  # nvidia-smi shows "0 %", not N/A, on AWS g5
    ),
    Profile(
        key="RTX-A6000",
        name="NVIDIA RTX A6000",
        memory_mib=46068,
        reserved_mib=479,  # ~
        cc=(8, 6),
        arch=ARCH_AMPERE,
        pci_device_id=0x223010DE,
        pci_subsystem_id=0x145910DE,
        part_number="900-5G133-1700-000",
        vbios="94.02.5C.00.02",
        inforom="G133.0500.00.05",
        bar1_mib=65536,
        power_w=(300, 100, 300),
        idle_power_w=24,
        pstate=8,
        clocks=(210, 210, 405, 555),
        max_clocks=(2100, 2100, 8001, 1950),
        temps=(28, 95, 98, 93, 0),
        cuda_cores=10752,
        memory_bus_width=384,
        pcie=(4, 16),
        nvlinks=4,  # two-card NVLink bridge
        nvlink_gen=3,
        fans=1,  # blower card
        fan_speed=30,
    ),
]

PROFILES: dict[str, Profile] = {p.key: p for p in _ALL}


def get(key: str) -> Profile:
    """A profile by key, case-insensitively; FakeNvmlError lists the known keys."""
    for p in _ALL:
        if p.key.lower() == key.strip().lower():
            return p
    raise FakeNvmlError(f"unknown profile {key!r} (known: {', '.join(PROFILES)})")
