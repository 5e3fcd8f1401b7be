"""GPU profiles: what one board of a given model reports through NVML.

Every value comes from a public source, cited beside it: the H100 from the capture in
tests/fakenvml/data/h100/, the other boards from `nvidia-smi -q` / deviceQuery outputs that
people posted in public issue threads and repositories, NVIDIA's documentation and the PCI
ID repository (pci.ids). A value no public source gave keeps what the profile had and says
`unsourced:` and why. tests/fakenvml/test_profile_facts.py holds each profile to its cited
facts. Profiles are facts only: identity (UUID, serial, bus id) and topology are the
inventory's job.
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
    # One link's speed, MBps per direction: NVML's field 90 (NVLINK_SPEED_MBPS_COMMON) and
    # field 164 per link, which `nvidia-smi nvlink -s` prints in GB/s.
    nvlink_mbps: int = 0
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
            nvlink_board=self.nvlinks,
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

# MIG tables of the other MIG boards. Sources:
# [mug] NVIDIA's MIG user guide, "Supported MIG Profiles"
#   (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
#   the A100-SXM4-40GB table (names, fraction of memory and SMs, NVDEC/JPEG/OFA, copy
#   engines, instances) and "for A100-SXM4-80GB ... 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb,
#   3g.40gb, 4g.40gb, 7g.80gb"; the same placement figure for A100 and H100 (the
#   8-memory-slice tree the H100 capture's placements show).
# [hp] github.com/aws/sagemaker-hyperpod-cli PR 403 (constants.py, MIG configs): B200's
#   mig-1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb; H200's 1g.18gb, 2g.35gb.
# Derived, not read: each profile's MiB is the H100 capture's fraction of board memory for
# the same memory slices, applied to this board (so NVIDIA's naming rule gives the names
# above: tests/plugin/test_mig_names.py); H200/B200 SM and engine counts are the H100's
# (unsourced: no capture of those boards in MIG mode).
_H100_MIG_MIB = {1: 9984, 2: 20096, 4: 40448, 8: 81152}  # memory slices -> MiB, [capture]
_H100_BOARD_MIB = 81559


_Engines = tuple[tuple[int, int, int, int, int], ...]


def _mig_board(board_mib: int, names: tuple[str, ...], sms: tuple[int, ...],
               engines: _Engines) -> list[MigProfile]:  # fmt: skip
    """The 7 profiles in the H100's order (1g, 2g, 3g, 4g, 7g, 1g+me, 1g with 2 memory
    slices), with this board's names, SMs, (CE, NVDEC, NVENC, NVJPG, OFA) and memory."""
    shape = [  # (profile, id, slices, instances, memory slices, placement starts)
        (0, 19, 1, 7, 1, (0, 1, 2, 3, 4, 5, 6)), (1, 14, 2, 3, 2, (0, 2, 4)),
        (2, 9, 3, 2, 4, (0, 4)), (3, 5, 4, 1, 4, (0,)), (4, 0, 7, 1, 8, (0,)),
        (7, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)), (9, 15, 1, 4, 2, (0, 2, 4, 6)),
    ]  # fmt: skip
    out = []
    for (prof, pid, slices, count, mem, starts), name, sm, eng in zip(
        shape, names, sms, engines, strict=True
    ):
        mib = _H100_MIG_MIB[mem] * board_mib // _H100_BOARD_MIB // 64 * 64
        ce, dec, enc, jpg, ofa = eng
        out.append(_mig(prof, pid, f"MIG {name}", slices, count, sm, mib, (ce, dec, enc, jpg),
                        ofa, mem, starts))  # fmt: skip
    return out


# [mug] A100: 1g 0 NVDEC/0 JPEG/0 OFA, +me 1/1/1, 1g.2-slice-memory 1 NVDEC, 2g 1 NVDEC,
# 3g and 4g 2 NVDECs, 7g 5 NVDECs/1 JPEG/1 OFA; copy engines = compute slices; SMs 1/7 of
# 98 per compute slice (unsourced: the SM count of the MIG 7g instance).
_A100_ENGINES = ((1, 0, 0, 0, 0), (2, 1, 0, 0, 0), (3, 2, 0, 0, 0), (4, 2, 0, 0, 0),
                 (7, 5, 0, 1, 1), (1, 1, 0, 1, 1), (1, 1, 0, 0, 0))  # fmt: skip
_A100_SMS = (14, 28, 42, 56, 98, 14, 14)
_H100_ENGINES = ((1, 1, 0, 1, 0), (2, 2, 0, 2, 0), (3, 3, 0, 3, 0), (4, 4, 0, 4, 0),
                 (8, 7, 0, 7, 1), (1, 1, 0, 1, 1), (1, 1, 0, 1, 0))  # fmt: skip
_H100_SMS = (16, 32, 60, 64, 132, 16, 26)
A100_40_MIG = _mig_board(40960, ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
                                 "1g.5gb+me", "1g.10gb"), _A100_SMS, _A100_ENGINES)  # fmt: skip
A100_80_MIG = _mig_board(81920, ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
                                 "1g.10gb+me", "1g.20gb"), _A100_SMS, _A100_ENGINES)  # fmt: skip
H200_MIG = _mig_board(143771, ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
                               "1g.18gb+me", "1g.35gb"), _H100_SMS, _H100_ENGINES)  # fmt: skip
B200_MIG = _mig_board(183359, ("1g.23gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
                               "1g.23gb+me", "1g.45gb"), _H100_SMS, _H100_ENGINES)  # fmt: skip

# Boards held to public captures. Each profile lists its sources once, as [tag] = where and
# what it is; a value's comment names the tag it was read from. "derived" values are
# arithmetic on a cited capture (the rule is on the line); "unsourced" values were found
# in no public capture and keep what the profile had, with the reason.
#
# How nvidia-smi -q maps to fields: FB Memory Total/Reserved -> memory_mib/reserved_mib,
# BAR1 Total -> bar1_mib, Default/Min/Max Power Limit -> power_w, Clocks at idle -> clocks,
# Max Clocks -> max_clocks, Default Applications Clocks -> app_clocks (graphics, memory),
# Max Customer Boost Clocks -> boost_clocks (graphics), Bank Remap Availability Histogram
# Max -> row_remap_max. nvidia-smi prints no SM/video application clock nor an SM boost
# clock: those follow the H100 capture's shape (SM = graphics; video and memory boost
# NOT_SUPPORTED, i.e. 0).
#
# Newer drivers print temperature limits relative to T.Limit ("Shutdown T.Limit Temp: -8
# C"). The H100 capture has both forms (h100-smi-q.txt and h100-walk.json): its absolute
# GPU max operating limit is current + "GPU T.Limit Temp" (46 + 41 = 87) and shutdown /
# slowdown are that limit minus their T.Limit values (87 + 8 = 95, 87 + 2 = 89), which
# is how the absolute thresholds of T.Limit-only captures are derived below.


def _apps(graphics: int, memory: int) -> tuple[int, int, int, int]:
    """Application clocks from nvidia-smi's two numbers, in the H100 capture's shape."""
    return (graphics, graphics, memory, 0)


def _boost(graphics: int) -> tuple[int, int, int, int]:
    return (graphics, graphics, 0, 0)


_ALL = [
    # [x] github.com/XueSongTap/XueSongTap.github.io _posts/2024-01-04-nvidia-smi-more.md:
    #     nvidia-smi -q of 8 A100-SXM4-40GB at idle, driver 535.129.03
    # [d] https://github.com/NVIDIA/nvidia-docker/issues/1648: nvidia-smi -q of A100-SXM4-40GB
    # [dq] github.com/thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py (an A100-SXM4-80GB;
    #     the die, GA100, is the same)
    # [mig] https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html
    # [n] https://github.com/NVIDIA/nccl-tests/issues/228: nvidia-smi nvlink -s of
    #     A100-SXM4-80GB (the same NVLink 3 as the 40 GB board)
    Profile(
        key="A100-SXM4-40GB",
        name="NVIDIA A100-SXM4-40GB",  # [x] Product Name
        memory_mib=40960,  # [x] FB Memory Usage Total
        reserved_mib=620,  # [x] Reserved 620 MiB
        cc=(8, 0),  # [mig] A100-SXM4 40GB: compute capability 8.0
        arch=ARCH_AMPERE,  # [x] Product Architecture: Ampere
        pci_device_id=0x20B010DE,  # [x] Device Id
        pci_subsystem_id=0x134F10DE,  # [x] Sub System Id
        part_number="692-2G506-0200-002",  # [x] Board Part Number
        vbios="92.00.36.00.04",  # [x] VBIOS Version
        inforom="G506.0200.00.04",  # [x] Inforom Image Version
        bar1_mib=65536,  # [x] BAR1 Total
        power_w=(400, 100, 400),  # [x][d] Default / Min / Max Power Limit
        idle_power_w=52,  # [x] Power Draw 52.12 W at P0, idle
        pstate=0,  # [x] Performance State P0
        clocks=(210, 210, 1215, 585),  # [x] Clocks at idle
        max_clocks=(1410, 1410, 1215, 1290),  # [x][d] Max Clocks
        temps=(25, 89, 92, 85, 95),  # [x] shutdown 92, slowdown 89, max op 85, mem max 95
        cuda_cores=6912,  # [dq] 108 SMs x 64
        memory_bus_width=5120,  # [dq] Memory Bus Width 5120-bit
        pcie=(4, 16),  # [x] PCIe Generation Device Max 4, Link Width Max 16x
        nvlinks=12,  # [x] nvidia-smi topo -m: NV12 between every pair
        nvlink_gen=3,  # unsourced: NVLink 3 is NVIDIA's A100 marketing, no capture prints it
        nvlink_mbps=25000,  # [n] of A100-SXM4-80GB: Link 0: 25 GB/s
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,  # unsourced: HGX A100 datasheet figure, not a capture
        caps={
            "app_clocks": _apps(1095, 1215),  # [x][d] Default Applications Clocks
            "boost_clocks": _boost(1410),  # [x] Max Customer Boost Clocks
            "row_remap_max": 640,  # [x] Bank Remap Availability Histogram Max 640
            "mig_profiles": A100_40_MIG,  # [mug], derived MiB (above)
        },
    ),
    # The 400 W A100-SXM4-80GB (subsystem 0x1463); the 500 W board is 0x147F.
    # [m4] github.com/huggingface/m4-logs tr_141-hanging/
    #     tr_141_cm409xPMD01_scale_leap_of_faith_v5_num_workers_0-try3/README.md:
    #     nvidia-smi -q of an A100-SXM4-80GB 400 W board, driver 525.60.13, under load
    # [t] github.com/thamada/nvidia-smi gls/A100SXMx4_smi.py: nvidia-smi -q of four
    #     A100-SXM4-80GB 500 W boards (0x147F) at idle, driver 555.42.02
    # [dq] github.com/thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py
    # [c] https://github.com/NVIDIA/CUDALibrarySamples/issues/104: nvidia-smi -a, same VBIOS
    # [n] https://github.com/NVIDIA/nccl-tests/issues/228: nvidia-smi nvlink -s
    Profile(
        key="A100-SXM4-80GB",
        name="NVIDIA A100-SXM4-80GB",  # [m4][t][c] Product Name
        memory_mib=81920,  # [m4][t] FB Memory Usage Total
        reserved_mib=763,  # [t] Reserved 763 MiB (driver 555; [m4] 834 MiB on driver 525)
        cc=(8, 0),  # [dq] CUDA Capability 8.0
        arch=ARCH_AMPERE,  # [t] Product Architecture: Ampere
        pci_device_id=0x20B210DE,  # [m4][t] Device Id
        pci_subsystem_id=0x146310DE,  # [m4] Sub System Id (the 400 W board)
        part_number="692-2G506-0210-002",  # [m4] Board Part Number
        vbios="92.00.45.00.05",  # [m4][c] VBIOS Version
        inforom="G506.0210.00.03",  # [m4] Inforom Image Version
        bar1_mib=131072,  # [m4][t] BAR1 Total
        power_w=(400, 100, 400),  # [m4] Default / Min / Max Power Limit
        idle_power_w=60,  # [t] 58-60 W at idle (the 500 W board; [m4] was under load)
        pstate=0,  # [m4][t] Performance State P0
        clocks=(210, 210, 1593, 585),  # [t] Clocks at idle
        max_clocks=(1410, 1410, 1593, 1290),  # [m4][t] Max Clocks
        temps=(28, 89, 92, 85, 95),  # [m4] current 28, shutdown 92, slowdown 89, 85, mem 95
        cuda_cores=6912,  # [dq] 108 SMs x 64
        memory_bus_width=5120,  # [dq] Memory Bus Width 5120-bit
        pcie=(4, 16),  # [m4][t] PCIe Generation Device Max 4, Link Width Max 16x
        nvlinks=12,  # [x] of A100-SXM4-40GB above: NV12 on the same HGX A100 baseboard
        nvlink_gen=3,  # unsourced: NVLink 3 is NVIDIA's A100 marketing, no capture prints it
        nvlink_mbps=25000,  # [n] Link 0: 25 GB/s
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,  # unsourced: HGX A100 datasheet figure, not a capture
        caps={
            "app_clocks": _apps(1155, 1593),  # [m4] Default Applications Clocks
            "boost_clocks": _boost(1410),  # [m4][t] Max Customer Boost Clocks
            "row_remap_max": 640,  # [m4][t] Bank Remap Availability Histogram Max 640
            "mig_profiles": A100_80_MIG,  # [mug], derived MiB (above)
        },
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
        # unsourced: the capture's VM shows no NVLink. Half of NVLink 5's 53.125 GB/s [b],
        # as NVLink 5 doubled the per-link rate (900 GB/s to 1.8 TB/s over 18 links).
        nvlink_mbps=26562,
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,
        caps=H100_CAPS,
    ),
    # [g] github.com/thamada/gls gls/H200_smi.py: nvidia-smi -q of an H200 at idle, driver
    #     550.90.12 (passthrough VM)
    # [gq] github.com/thamada/gls gls/H200_deviceQuery.py
    Profile(
        key="H200",
        name="NVIDIA H200",  # [g] Product Name
        memory_mib=143771,  # [g] FB Memory Usage Total
        reserved_mib=700,  # [g] Reserved 700 MiB
        cc=(9, 0),  # [gq] CUDA Capability 9.0
        arch=ARCH_HOPPER,  # [g] Product Architecture: Hopper
        pci_device_id=0x233510DE,  # [g] Device Id
        pci_subsystem_id=0x18BE10DE,  # [g] Sub System Id
        part_number="695-2G520-0280-000",  # [g] Board Part Number
        vbios="96.00.A5.00.03",  # [g] VBIOS Version
        inforom="G520.0280.02.02",  # [g] Inforom Image Version
        bar1_mib=262144,  # [g] BAR1 Total
        power_w=(700, 200, 700),  # [g] Default / Min / Max Power Limit
        idle_power_w=74,  # [g] Power Draw 74.58 W
        pstate=0,  # [g] Performance State P0
        clocks=(345, 345, 3199, 765),  # [g] Clocks at idle
        max_clocks=(1980, 1980, 3201, 1545),  # [g] Max Clocks
        # derived from [g]: current 28 + T.Limit 59 = max op 87; shutdown 87 + 8 = 95,
        # slowdown 87 + 2 = 89; memory "Max Operating T.Limit 0" as on the H100, whose
        # absolute memory limit is 95.
        temps=(28, 89, 95, 87, 95),
        cuda_cores=16896,  # [gq] 132 SMs x 128
        memory_bus_width=6144,  # [gq] Memory Bus Width 6144-bit
        pcie=(5, 16),  # [g] PCIe Generation Device Max 5, Link Width Max 16x
        nvlinks=18,  # unsourced: HGX H200 datasheet (18 links); the capture's VM shows none
        nvlink_gen=4,  # unsourced: NVIDIA's marketing generation, no capture prints it
        nvlink_mbps=26562,  # unsourced: H100's (same NVLink 4), see there
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,  # unsourced: HGX H200 datasheet figure
        caps={
            "app_clocks": _apps(1980, 3201),  # [g] Default Applications Clocks
            "boost_clocks": _boost(1980),  # [g] Max Customer Boost Clocks
            "row_remap_max": 3072,  # [g] Bank Remap Availability Histogram Max 3072
            "mig_profiles": H200_MIG,  # [mug][hp], derived MiB (above)
        },
    ),
    # No public nvidia-smi -q of a B200 was found; what is public:
    # [cv] https://chegva.com/6622.html: nvidia-smi of 8 NVIDIA B200, driver 580.95.05:
    #     "NVIDIA B200", 136-140 W / 1000 W, 183359MiB, P0
    # [mp] NVIDIA's default MIG config (gpu-operator / mig-parted config-default.yaml):
    #     "# B200", device-filter 0x290110DE
    # [mig] https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html:
    #     B200, Blackwell, compute capability 10.0
    # [b] https://github.com/NVIDIA/k8s-test-infra/issues/371: nvidia-smi nvlink -s of a
    #     GB200 (NVLink 5, as B200): Link 0..17: 53.125 GB/s
    Profile(
        key="B200",
        name="NVIDIA B200",  # [cv] Name
        memory_mib=183359,  # [cv] Memory-Usage total
        reserved_mib=1000,  # unsourced: no capture prints it
        cc=(10, 0),  # [mig] compute capability 10.0
        arch=ARCH_BLACKWELL,  # [mig] Blackwell
        pci_device_id=0x290110DE,  # [mp] device-filter of the B200 entry
        pci_subsystem_id=0x199910DE,  # unsourced: no capture prints it
        part_number="692-2G525-0220-000",  # unsourced: NVIDIA's pattern, not seen in a capture
        vbios="97.00.9A.00.0F",  # unsourced: no capture prints it
        inforom="G525.0220.00.03",  # unsourced: no capture prints it
        bar1_mib=262144,  # unsourced: no capture prints it
        power_w=(1000, 200, 1000),  # [cv] cap 1000 W; unsourced: min 200 (H100's)
        idle_power_w=140,  # [cv] 136-140 W at P0, idle
        pstate=0,  # [cv] P0
        clocks=(120, 120, 3996, 600),  # unsourced: no capture prints them
        max_clocks=(1965, 1965, 3996, 1635),  # unsourced: no capture prints them
        temps=(30, 89, 92, 87, 95),  # unsourced: no capture prints them ([cv]: 25-27 C)
        cuda_cores=18944,  # unsourced: 148 SMs x 128, from no capture
        memory_bus_width=8192,  # unsourced: no capture prints it
        pcie=(5, 16),  # unsourced: HGX B200 datasheet (PCIe Gen5 x16), not a capture
        nvlinks=18,  # unsourced: DGX B200 datasheet (18 links per GPU), not a capture
        nvlink_gen=5,  # unsourced: NVIDIA's marketing generation
        nvlink_mbps=53125,  # [b] of GB200 (the same NVLink 5): Link 0: 53.125 GB/s
        nvswitch_device_id=NVSWITCH_UNKNOWN,
        nvswitches_per_board=2,  # unsourced: DGX B200 datasheet, two NVLink 5 switch chips
        caps={"mig_profiles": B200_MIG},  # [hp] names, derived MiB (above)
    ),
    # [l] github.com/thamada/nvidia-smi nvsim/L40S_smi.py: nvidia-smi -q of an L40S at idle,
    #     driver 550.127.05
    # [lq] github.com/thamada/nvidia-smi nvsim/L40S_deviceQuery.py
    Profile(
        key="L40S",
        name="NVIDIA L40S",  # [l] Product Name
        memory_mib=46068,  # [l] FB Memory Usage Total
        reserved_mib=479,  # [l] Reserved 479 MiB
        cc=(8, 9),  # [lq] CUDA Capability 8.9
        arch=ARCH_ADA,  # [l] Product Architecture: Ada Lovelace
        pci_device_id=0x26B910DE,  # [l] Device Id
        pci_subsystem_id=0x185110DE,  # [l] Sub System Id
        part_number="900-2G133-0080-000",  # [l] Board Part Number
        vbios="95.02.66.00.02",  # [l] VBIOS Version
        inforom="G133.0242.00.03",  # [l] Inforom Image Version
        bar1_mib=65536,  # [l] BAR1 Total
        power_w=(350, 100, 350),  # [l] Default / Min / Max Power Limit
        idle_power_w=33,  # [l] Power Draw 33.44 W
        pstate=8,  # [l] Performance State P8
        clocks=(210, 210, 405, 1185),  # [l] Clocks at idle
        max_clocks=(2520, 2520, 9001, 1965),  # [l] Max Clocks
        # derived from [l]: current 30 + T.Limit 57 = max op 87; shutdown 87 + 5 = 92,
        # slowdown 87 + 2 = 89; GDDR6: Memory Max Operating N/A (0)
        temps=(30, 89, 92, 87, 0),
        cuda_cores=18176,  # [lq] 142 SMs x 128
        memory_bus_width=384,  # [lq] Memory Bus Width 384-bit
        pcie=(4, 16),  # [l] PCIe Generation Device Max 4, Link Width Max 16x
        caps={
            "app_clocks": _apps(2520, 9001),  # [l] Default Applications Clocks
            "boost_clocks": _boost(2520),  # [l] Max Customer Boost Clocks
            "row_remap_max": 192,  # [l] Bank Remap Availability Histogram Max 192
        },
    ),
    # [n] https://github.com/NVIDIA/nvidia-docker/issues/1446: nvidia-smi -q of a Tesla T4
    #     (VBIOS, part number, inforom)
    # [ct] https://github.com/NVIDIA/nvidia-container-toolkit/issues/465: nvidia-smi -q of an
    #     AWS T4 (Device Id, Sub System Id, PCIe Max 3, 16x)
    # [ml] https://github.com/mlcommons/inference_results_v0.5/issues/20: nvidia-smi -q -d
    #     SUPPORTED_CLOCKS of a T4: Memory 5001 MHz, Graphics up to 1590 MHz
    # [z] a public Chinese nvidia-smi walkthrough (repository not identified; find_string id
    #     22551222574 in this project's search index): nvidia-smi -q of a Tesla T4 at idle,
    #     driver 530.30.02; every number below matches it
    Profile(
        key="T4",
        name="Tesla T4",  # [n][ct][z] Product Name
        memory_mib=15360,  # [z] FB Memory Usage Total
        reserved_mib=393,  # [z] Reserved 393 MiB
        cc=(7, 5),  # unsourced here: CUDA's compute capability table lists T4 as 7.5
        arch=ARCH_TURING,  # [z] Product Architecture: Turing
        pci_device_id=0x1EB810DE,  # [ct][z] Device Id
        pci_subsystem_id=0x12A210DE,  # [ct][z] Sub System Id
        part_number="900-2G183-0000-001",  # [n][z] GPU Part Number
        vbios="90.04.38.00.03",  # [n][z] VBIOS Version
        inforom="G183.0200.00.02",  # [n][z] Inforom Image Version
        bar1_mib=256,  # [z] BAR1 Total
        power_w=(70, 60, 70),  # [z] Default / Min / Max Power Limit
        idle_power_w=14,  # [z] Power Draw 14.04 W
        pstate=8,  # [z] Performance State P8
        clocks=(300, 300, 405, 540),  # [z] Clocks at idle
        max_clocks=(1590, 1590, 5001, 1470),  # [z][ml] Max Clocks
        temps=(38, 93, 96, 85, 0),  # [z] shutdown 96, slowdown 93, max op 85, memory N/A
        cuda_cores=2560,  # unsourced: 40 SMs x 64, NVIDIA's T4 datasheet, not a capture
        memory_bus_width=256,  # unsourced: NVIDIA's T4 datasheet, not a capture
        pcie=(3, 16),  # [ct][z] PCIe Generation Max 3, Link Width Max 16x
        caps={
            "app_clocks": _apps(585, 5001),  # [z] Default Applications Clocks
            "boost_clocks": _boost(1590),  # [z] Max Customer Boost Clocks
        },
    ),
    # [k] https://github.com/NVIDIA/k8s-device-plugin/issues/344: nvidia-smi -q of an AWS g5
    #     A10G, driver 510.85.02 (Product Name, VBIOS)
    # [w] a public issue thread (an NVIDIA/DCGM question by geraldstanje1, May 2025, as
    #     mirrored in this project's search index as find_string id 70772490119; original URL
    #     not found): nvidia-smi -q of an AWS g5 A10G under load, driver 535.247.01
    # [a10] github.com/leptonai/gpud e2e/mock/nvidia-smi/test_data.go: an A10 (GA102, same
    #     die): 23028MiB
    Profile(
        key="A10G",
        name="NVIDIA A10G",  # [k][w] Product Name
        memory_mib=23028,  # [w] FB Memory Usage Total
        reserved_mib=304,  # [w] Reserved 304 MiB
        cc=(8, 6),  # unsourced here: CUDA's compute capability table lists GA102 as 8.6
        arch=ARCH_AMPERE,  # [k] Product Architecture: Ampere
        pci_device_id=0x223710DE,  # [w] Device Id
        pci_subsystem_id=0x152F10DE,  # [w] Sub System Id
        part_number="900-2G133-A840-000",  # [w] Board Part Number
        vbios="94.02.75.00.01",  # [k][w] VBIOS Version
        inforom="G133.0210.00.04",  # [w] Inforom Image Version
        bar1_mib=32768,  # [w] BAR1 Total
        power_w=(300, 100, 300),  # [w] Default / Min / Max Power Limit
        idle_power_w=25,  # unsourced: [w] is under load (60.30 W)
        pstate=8,  # unsourced: [w] is under load (P0); P8 is what idle GA102 boards show
        clocks=(210, 210, 405, 555),  # unsourced: [w] is under load; GA102's idle clocks
        max_clocks=(1710, 1710, 6251, 1500),  # [w] Max Clocks
        temps=(27, 95, 98, 88, 0),  # [w] current 27, shutdown 98, slowdown 95, max op 88
        cuda_cores=10240,  # unsourced: 80 SMs x 128, NVIDIA's A10G figure, not a capture
        memory_bus_width=384,  # unsourced: GA102's bus, not a capture
        pcie=(4, 16),  # [w] PCIe Generation Device Max 4, Link Width Max 16x
        fans=1,  # [w] Fan Speed "0 %", not N/A
        caps={
            "app_clocks": _apps(1710, 6251),  # [w] Default Applications Clocks
            "boost_clocks": _boost(1710),  # [w] Max Customer Boost Clocks
            "row_remap_max": 192,  # [w] Bank Remap Availability Histogram Max 192
        },
    ),
    # [b] https://github.com/mrirecon/bart/issues/323: nvidia-smi -q of RTX A6000s at idle
    # [p] https://github.com/NVIDIA/k8s-device-plugin/issues/324: nvidia-smi -q of an RTX
    #     A6000, driver 515.48.07 (Product Name, VBIOS)
    # [r] github.com/thamada/gls gls/RTX_A6000_x9_smi.py: nvidia-smi of 9 RTX A6000, driver
    #     550.127.05: 30% fan, 28-29C, P8, 18-28W / 300W, 46068MiB
    # [rq] github.com/thamada/gls gls/RTX_A6000_x9_deviceQuery.py
    Profile(
        key="RTX-A6000",
        name="NVIDIA RTX A6000",  # [b][p][r] Product Name
        memory_mib=46068,  # [r] Memory-Usage total
        # derived from [r]/[rq] (one driver): deviceQuery's global memory is total minus
        # reserved plus 1 MiB on L40S, H200 and A100 captures; 46068 - 45619 + 1 = 450
        reserved_mib=450,
        cc=(8, 6),  # [rq] CUDA Capability 8.6
        arch=ARCH_AMPERE,  # [b] Product Architecture: Ampere
        pci_device_id=0x223010DE,  # pci.ids: 10de 2230 "GA102GL [RTX A6000]"
        pci_subsystem_id=0x145910DE,  # unsourced: no capture seen shows it
        part_number="900-5G133-1700-000",  # [b] GPU Part Number
        vbios="94.02.5C.00.02",  # [b][p] VBIOS Version
        inforom="G133.0500.00.05",  # unsourced: no capture seen shows it
        bar1_mib=65536,  # unsourced: no capture seen shows it
        power_w=(300, 100, 300),  # [b] Default / Min / Max Power Limit
        idle_power_w=24,  # [r] 18-28 W at P8
        pstate=8,  # [r] P8
        clocks=(210, 210, 405, 555),  # [b] Clocks at idle
        max_clocks=(2100, 2100, 8001, 1950),  # [b] Max Clocks
        temps=(28, 95, 98, 93, 0),  # [b] max op 93; unsourced: slowdown 95, shutdown 98
        cuda_cores=10752,  # [rq] 84 SMs x 128
        memory_bus_width=384,  # [rq] Memory Bus Width 384-bit
        pcie=(4, 16),  # unsourced: NVIDIA's datasheet (PCIe 4.0 x16), not a capture
        nvlinks=4,  # unsourced: two-card NVLink bridge, NVIDIA's datasheet
        nvlink_gen=3,  # unsourced: GA102 bridges are NVLink 3 per NVIDIA, no capture prints it
        nvlink_mbps=14062,  # unsourced: NVIDIA's GA102 whitepaper, 14.0625 GB/s per direction
        fans=1,  # [r] Fan 30%
        fan_speed=30,  # [r] 30%
        caps={
            "app_clocks": _apps(1800, 8001),  # [b] Default Applications Clocks
            "boost_clocks": (0, 0, 0, 0),  # [b] Max Customer Boost Clocks: N/A
        },
    ),
]


PROFILES: dict[str, Profile] = {p.key: p for p in _ALL}


def get(key: str) -> Profile:
    """A profile by key, case-insensitively; FakeNvmlError lists the known keys."""
    for p in _ALL:
        if p.key.lower() == key.strip().lower():
            return p
    raise FakeNvmlError(f"unknown profile {key!r} (known: {', '.join(PROFILES)})")
