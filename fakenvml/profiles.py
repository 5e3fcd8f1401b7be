"""The board layer of the board model (a SKU): what one board of a given model reports
through NVML beyond what its family says. Every profile is built from its family
(fakenvml/families.py: Hopper, Ampere, ...) under a driver branch (fakenvml/branches.py),
so a fact learnt from one board of a family reaches every board of it; the board adds its
own numbers: names, memory, clocks, power, temperatures, part numbers, link counts and
the MIG profile sizes its driver reports. The platform (bare metal or a VM) is the
inventory's (fakenvml/platforms.py).

Every value comes from a public source, cited beside it: the H100 from the capture in
tests/fakenvml/data/h100/, the other boards from `nvidia-smi -q` / deviceQuery outputs that
people posted in public issue threads and repositories, NVIDIA's documentation and the PCI
ID repository (pci.ids). A value no public source gave keeps what the profile had and is
listed in the profile's `unsourced` with why. tests/fakenvml/test_profile_facts.py holds
each profile to its cited facts. Profiles are facts only: identity (UUID, serial, bus id)
and topology are the inventory's job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fakenvml import branches
from fakenvml.errors import FakeNvmlError
from fakenvml.families import (
    ADA,
    AMPERE,
    ARCH_ADA,
    ARCH_AMPERE,
    ARCH_BLACKWELL,
    ARCH_HOPPER,
    ARCH_TURING,
    BLACKWELL,
    HOPPER,
    MEMORY_TEMP_FIELD,
    MIG_CONFIG_EVENT,
    NVLINK_VERSION_ENUM,
    TURING,
    Family,
)
from fakenvml.model import VALUE_SINT, VALUE_UINT, FieldValue, Gpu, MigProfile

__all__ = ["ARCH_ADA", "ARCH_AMPERE", "ARCH_BLACKWELL", "ARCH_HOPPER", "ARCH_TURING"]

MIB = 1 << 20

# NVSwitch PCI device ids (pci.ids: 1af1 "A100 NVSwitch", 22a3 "H100 NVSwitch").
NVSWITCH_GEN2 = 0x1AF110DE
NVSWITCH_GEN3 = 0x22A310DE
NVSWITCH_UNKNOWN = 0  # no public PCI id for the NVLink 5 switch of HGX B200


@dataclass(frozen=True)
class Profile:
    key: str  # what inventories name: "H100-SXM5-80GB"
    name: str  # nvmlDeviceGetName
    family: Family
    memory_mib: int  # FB total as NVML reports it (ECC on)
    reserved_mib: int
    cc: tuple[int, int]
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
    # One link's speed, MBps per direction: NVML's field 90 (NVLINK_SPEED_MBPS_COMMON) and
    # field 164 per link, which `nvidia-smi nvlink -s` prints in GB/s.
    nvlink_mbps: int = 0
    nvswitch_device_id: int = NVSWITCH_UNKNOWN
    nvswitches_per_board: int = 0  # > 0: an HGX baseboard part (SXM)
    fans: int = 0  # SXM and passively cooled PCIe cards report no fans
    fan_speed: int = 0
    # Application and customer-boost clocks per clock type (graphics, sm, mem, video); 0:
    # NOT_SUPPORTED for that type; None: the maximum clocks.
    app_clocks: tuple[int, int, int, int] | None = None
    boost_clocks: tuple[int, int, int, int] | None = None
    row_remap_max: int = 0  # nvmlRowRemapperHistogramValues_t.max; 0: NOT_SUPPORTED
    # Supported memory clocks, highest first; None: the maximum memory clock alone (every
    # supported-clocks list seen starts with it: [walk], [sc] and [ml] of families.py).
    mem_clocks: tuple[int, ...] | None = None
    mem_temp: int = 0  # HBM temperature at idle (field 82); boards without HBM have none
    display_mode: int | None = None  # None: the family's
    # MIG: the driver's names and sizes (MiB) of the family's GPU-instance profiles, in the
    # family's order (1g, 2g, 3g, 4g, 7g, 1g+me, 1g with two memory slices); none: no MIG.
    mig_names: tuple[str, ...] = ()
    mig_mib: tuple[int, ...] = ()
    unsourced: dict[str, str] = field(default_factory=dict)  # value -> why no source gives it

    @property
    def arch(self) -> int:
        return self.family.arch

    @property
    def nvlink_gen(self) -> int:
        return self.family.nvlink_gen if self.nvlinks else 0

    @property
    def sxm(self) -> bool:
        return self.nvswitches_per_board > 0

    def mig_profiles(self) -> list[MigProfile]:
        shape = self.family.mig if self.mig_mib else ()
        return [m.profile_of(n, mib) for m, n, mib in zip(shape, self.mig_names, self.mig_mib,
                                                          strict=True)]  # fmt: skip

    def field_table(self, branch: branches.Branch) -> dict[int, FieldValue]:
        """The GPU's field table: the driver's, the family's, and the board's readings."""
        gpu_max, (_, slowdown, shutdown, _, mem_max) = self.temps[3], self.temps
        out = {**branch.field_table(), **self.family.fields}
        if mem_max:  # an HBM sensor ([t], [g], [walk]); GDDR boards print N/A ([z], [l])
            out[MEMORY_TEMP_FIELD] = (VALUE_UINT, self.mem_temp)
        if self.family.tlimit:  # relative to the max operating temperature ([walk]: -8, -2)
            out[193] = (VALUE_SINT, gpu_max - shutdown)
            out[194] = (VALUE_SINT, gpu_max - slowdown)
            out[196] = (VALUE_SINT, 0)
            if mem_max:
                out[195] = (VALUE_SINT, 0)
        return out

    def make_gpu(self, index: int, uuid: str, serial: str, bus: tuple[int, int, int, int],
                 branch: branches.Branch = branches.R580) -> Gpu:  # fmt: skip
        """A Gpu with this profile's values under `branch`; topology is the inventory's."""
        domain, pci_bus, device, function = bus
        default_w, min_w, max_w = self.power_w
        idle, slowdown, shutdown, gpu_max, mem_max = self.temps
        fam = self.family
        migs = self.mig_profiles()
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
            event_types=fam.event_types & (~0 if migs else ~MIG_CONFIG_EVENT),
            clock_event_reasons=fam.clock_event_reasons,
            ecc_locations=fam.ecc_locations,
            display_mode=fam.display_mode if self.display_mode is None else self.display_mode,
            app_clocks=self.app_clocks,
            boost_clocks=self.boost_clocks,
            mem_clocks=self.mem_clocks or (self.max_clocks[2],),
            gfx_clock_min=self.clocks[0],  # the idle clock ([sc]; [walk]: 345)
            gfx_clock_step=fam.gfx_clock_step,
            pstates=fam.pstates_of(self.pstate),
            row_remap_max=self.row_remap_max,
            conf_compute=fam.conf_compute,
            mig_profiles=migs,
            fields=self.field_table(branch),
        )


# What a board states, for counting sourced and unsourced values (docs/fakenvml.md).
VALUES = ("name", "memory_mib", "reserved_mib", "cc", "pci_device_id", "pci_subsystem_id",
          "part_number", "vbios", "inforom", "bar1_mib", "power_w", "idle_power_w", "pstate",
          "clocks", "max_clocks", "temps", "cuda_cores", "memory_bus_width", "pcie", "nvlinks",
          "nvlink_mbps", "nvswitches_per_board", "fans", "app_clocks", "boost_clocks",
          "row_remap_max", "mem_clocks", "mem_temp", "mig_mib")  # fmt: skip


def stated(p: Profile) -> list[str]:
    """The values a profile states: those it must, and those it sets to other than the
    default (no NVLink, no fans, no MIG: it states nothing there)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Profile)}
    return [v for v in VALUES if v not in defaults or getattr(p, v) != defaults[v]]


# How nvidia-smi -q maps to fields: FB Memory Usage Total/Reserved -> memory_mib/
# reserved_mib, BAR1 Total -> bar1_mib, Default/Min/Max Power Limit -> power_w, Clocks at
# idle -> clocks, Max Clocks -> max_clocks, Default Applications Clocks -> app_clocks
# (graphics, memory), Max Customer Boost Clocks -> boost_clocks (graphics), Bank Remap
# Availability Histogram Max -> row_remap_max, Memory Current Temp -> mem_temp; `nvidia-smi
# mig -lgip` Memory (GiB, two decimals) -> mig_mib. nvidia-smi prints no SM/video
# application clock nor an SM boost clock: those follow the H100 capture's shape (SM =
# graphics; video and memory boost NOT_SUPPORTED, i.e. 0).
#
# MIG sizes: every size the H100 capture reports is a multiple of 128 MiB (9984, 20096,
# 40448, 81152), so -lgip's two-decimal GiB give the MiB exactly (9.75 -> 9984).
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


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _gib(*sizes: float) -> tuple[int, ...]:
    """MiB from -lgip's GiB (multiples of 1/8 GiB, above)."""
    return tuple(round(g * 8) * 128 for g in sizes)


_ALL = [
    # [x] github.com/XueSongTap/XueSongTap.github.io _posts/2024-01-04-nvidia-smi-more.md:
    #     nvidia-smi -q of 8 A100-SXM4-40GB at idle, driver 535.129.03
    # [d] https://github.com/NVIDIA/nvidia-docker/issues/1648: nvidia-smi -q of A100-SXM4-40GB
    # [dq] github.com/thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py (an A100-SXM4-80GB;
    #     the die, GA100, is the same)
    # [mig] https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html
    # [n] https://github.com/NVIDIA/nccl-tests/issues/228: nvidia-smi nvlink -s of
    #     A100-SXM4-80GB (the same NVLink 3 as the 40 GB board)
    # [mug] NVIDIA's MIG user guide, "Supported MIG Profiles": the A100-SXM4-40GB names
    # [lgip] `nvidia-smi mig -lgip` of an A100-SXM4-40GB: 1g.5gb 4.75 GiB, 1g.5gb+me 4.75,
    #     1g.10gb 9.75, 2g.10gb 9.75, 3g.20gb 19.62, 4g.20gb 19.62, 7g.40gb 39.38; GFD's
    #     labels on an A100 40GB node agree (mig-1g.5gb.memory=4864, mig-2g.10gb.memory=9984)
    Profile(
        key="A100-SXM4-40GB",
        name="NVIDIA A100-SXM4-40GB",  # [x] Product Name
        family=AMPERE,  # [x] Product Architecture: Ampere
        memory_mib=40960,  # [x] FB Memory Usage Total
        reserved_mib=620,  # [x] Reserved 620 MiB
        cc=(8, 0),  # [mig] A100-SXM4 40GB: compute capability 8.0
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
        nvlink_mbps=25000,  # [n] of A100-SXM4-80GB: Link 0: 25 GB/s
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,
        app_clocks=_apps(1095, 1215),  # [x][d] Default Applications Clocks
        boost_clocks=_boost(1410),  # [x] Max Customer Boost Clocks
        row_remap_max=640,  # [x] Bank Remap Availability Histogram Max 640
        mem_temp=43,
        mig_names=_names("1g.5gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb 1g.5gb+me 1g.10gb"),  # [mug]
        mig_mib=_gib(4.75, 9.75, 19.62, 19.62, 39.38, 4.75, 9.75),  # [lgip]
        unsourced={
            "nvswitches_per_board": "HGX A100 datasheet figure, not a capture",
            "mem_temp": "the A100-SXM4-80GB's reading [t of families.py]: 43 C",
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
    # [sc] families.py's [sc]: Supported Clocks, Memory 1593 MHz alone
    # [lgip] `nvidia-smi mig -lgip` of an A100-SXM4-80GB: 1g.10gb 9.50 GiB, 1g.10gb+me 9.50,
    #     1g.20gb 19.50, 2g.20gb 19.50, 3g.40gb 39.25, 4g.40gb 39.25, 7g.80gb 79.00
    Profile(
        key="A100-SXM4-80GB",
        name="NVIDIA A100-SXM4-80GB",  # [m4][t][c] Product Name
        family=AMPERE,  # [t] Product Architecture: Ampere
        memory_mib=81920,  # [m4][t] FB Memory Usage Total
        reserved_mib=763,  # [t] Reserved 763 MiB (driver 555; [m4] 834 MiB on driver 525)
        cc=(8, 0),  # [dq] CUDA Capability 8.0
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
        nvlink_mbps=25000,  # [n] Link 0: 25 GB/s
        nvswitch_device_id=NVSWITCH_GEN2,
        nvswitches_per_board=6,
        app_clocks=_apps(1155, 1593),  # [m4] Default Applications Clocks
        boost_clocks=_boost(1410),  # [m4][t] Max Customer Boost Clocks
        row_remap_max=640,  # [m4][t] Bank Remap Availability Histogram Max 640
        mem_clocks=(1593,),  # [sc] Supported Clocks: Memory 1593 MHz
        mem_temp=43,  # [t] Memory Current Temp 43 C
        mig_names=_names("1g.10gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb 1g.10gb+me 1g.20gb"),  # [mug]
        mig_mib=_gib(9.50, 19.50, 39.25, 39.25, 79.00, 9.50, 19.50),  # [lgip]
        unsourced={"nvswitches_per_board": "HGX A100 datasheet figure, not a capture"},
    ),
    # Values marked [walk] / [smi-q] come from the real H100 80GB HBM3 in
    # tests/fakenvml/data/h100/: h100-walk.json / h100-smi-q.txt (driver 580.159.04); the
    # profile is that capture, every value not marked otherwise.
    # [b] https://github.com/NVIDIA/k8s-test-infra/issues/371: nvidia-smi nvlink -s of a
    #     GB200 (NVLink 5): Link 0..17: 53.125 GB/s
    Profile(
        key="H100-SXM5-80GB",
        name="NVIDIA H100 80GB HBM3",
        family=HOPPER,  # [walk] nvmlDeviceGetArchitecture 9
        memory_mib=81559,
        reserved_mib=480,  # [smi-q] FB Memory Usage: Reserved 480 MiB
        cc=(9, 0),
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
        nvlinks=18,  # [walk] NvLinkCapability answers INVALID_ARGUMENT from link 18 on
        nvlink_mbps=26562,
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,
        app_clocks=(1980, 1980, 2619, 0),  # [walk] nvmlDeviceGetApplicationsClock(0..3)
        boost_clocks=(1980, 1980, 0, 0),  # [walk] nvmlDeviceGetMaxCustomerBoostClock(0..3)
        row_remap_max=2560,  # [walk] nvmlDeviceGetRowRemapperHistogram max
        mem_clocks=(2619, 1593),  # [walk] nvmlDeviceGetSupportedMemoryClocks
        mem_temp=50,  # [walk] field[82]
        # [walk] nvmlDeviceGetGpuInstanceProfileInfoV(p): name
        mig_names=_names("1g.10gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb 1g.10gb+me 1g.20gb"),
        mig_mib=(9984, 20096, 40448, 40448, 81152, 9984, 20096),  # [walk] memorySizeMB
        unsourced={
            "nvlink_mbps": "the capture's VM shows no NVLink. Half of NVLink 5's 53.125 GB/s"
            " [b], as NVLink 5 doubled the per-link rate (900 GB/s to 1.8 TB/s"
            " over 18 links)",
            "nvswitches_per_board": "HGX H100 datasheet figure, not a capture",
        },
    ),
    # [g] github.com/thamada/gls gls/H200_smi.py: nvidia-smi -q of an H200 at idle, driver
    #     550.90.12 (passthrough VM)
    # [gq] github.com/thamada/gls gls/H200_deviceQuery.py
    # [hp] github.com/aws/sagemaker-hyperpod-cli PR 403 (constants.py, MIG configs): H200's
    #     mig-1g.18gb, 2g.35gb; [mug] NVIDIA's MIG user guide: 3g.71gb, 4g.71gb, 7g.141gb
    # [lgip] `nvidia-smi mig -lgip` of an H200: 1g.18gb 16.00 GiB, 1g.18gb+me 16.00,
    #     2g.35gb 32.50, 7g.141gb 140.00
    Profile(
        key="H200",
        name="NVIDIA H200",  # [g] Product Name
        family=HOPPER,  # [g] Product Architecture: Hopper
        memory_mib=143771,  # [g] FB Memory Usage Total
        reserved_mib=700,  # [g] Reserved 700 MiB
        cc=(9, 0),  # [gq] CUDA Capability 9.0
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
        nvlinks=18,
        nvlink_mbps=26562,
        nvswitch_device_id=NVSWITCH_GEN3,
        nvswitches_per_board=4,
        app_clocks=_apps(1980, 3201),  # [g] Default Applications Clocks
        boost_clocks=_boost(1980),  # [g] Max Customer Boost Clocks
        row_remap_max=3072,  # [g] Bank Remap Availability Histogram Max 3072
        mem_temp=25,  # [g] Memory Current Temp 25 C
        display_mode=0,  # [g] Display Mode: Disabled (the H100 capture's driver: 1)
        # [hp][mug]
        mig_names=_names("1g.18gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb 1g.18gb+me 1g.35gb"),
        # [lgip]; 1g.35gb has 2g.35gb's two memory slices (the H100's 1g.20gb has 2g.20gb's)
        mig_mib=(*_gib(16.00, 32.50), 66944, 66944, *_gib(140.00, 16.00, 32.50)),
        unsourced={
            "nvlinks": "HGX H200 datasheet (18 links); the capture's VM shows none",
            "nvlink_mbps": "H100's (the same NVLink 4), see there",
            "nvswitches_per_board": "HGX H200 datasheet figure",
            "mig_mib": "3g.71gb and 4g.71gb (66944): no -lgip seen shows them; twice 2g.35gb"
            " scaled as the H100's 4-slice size is to its 2-slice one",
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
    # [hp] github.com/aws/sagemaker-hyperpod-cli PR 403 (constants.py, MIG configs): B200's
    #     mig-1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb
    Profile(
        key="B200",
        name="NVIDIA B200",  # [cv] Name
        family=BLACKWELL,  # [mig] Blackwell
        memory_mib=183359,  # [cv] Memory-Usage total
        reserved_mib=1000,
        cc=(10, 0),  # [mig] compute capability 10.0
        pci_device_id=0x290110DE,  # [mp] device-filter of the B200 entry
        pci_subsystem_id=0x199910DE,
        part_number="692-2G525-0220-000",
        vbios="97.00.9A.00.0F",
        inforom="G525.0220.00.03",
        bar1_mib=262144,
        power_w=(1000, 200, 1000),  # [cv] cap 1000 W
        idle_power_w=140,  # [cv] 136-140 W at P0, idle
        pstate=0,  # [cv] P0
        clocks=(120, 120, 3996, 600),
        max_clocks=(1965, 1965, 3996, 1635),
        temps=(30, 89, 92, 87, 95),
        cuda_cores=18944,
        memory_bus_width=8192,
        pcie=(5, 16),
        nvlinks=18,
        nvlink_mbps=53125,  # [b] of GB200 (the same NVLink 5): Link 0: 53.125 GB/s
        nvswitch_device_id=NVSWITCH_UNKNOWN,
        nvswitches_per_board=2,
        app_clocks=_apps(1965, 3996),
        boost_clocks=_boost(1965),
        mem_temp=30,
        mig_names=_names("1g.23gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb 1g.23gb+me 1g.45gb"),  # [hp]
        mig_mib=(22400, 45120, 90880, 90880, 182400, 22400, 45120),
        unsourced={
            "reserved_mib": "no capture prints it",
            "pci_subsystem_id": "no capture prints it",
            "part_number": "NVIDIA's pattern, not seen in a capture",
            "vbios": "no capture prints it",
            "inforom": "no capture prints it",
            "bar1_mib": "no capture prints it",
            "power_w": "min 200 W is H100's; [cv] gives the 1000 W cap",
            "clocks": "no capture prints them",
            "max_clocks": "no capture prints them",
            "temps": "no capture prints them ([cv]: 25-27 C)",
            "cuda_cores": "148 SMs x 128, from no capture",
            "memory_bus_width": "no capture prints it",
            "pcie": "HGX B200 datasheet (PCIe Gen5 x16), not a capture",
            "nvlinks": "DGX B200 datasheet (18 links per GPU), not a capture",
            "nvswitches_per_board": "DGX B200 datasheet, two NVLink 5 switch chips",
            "app_clocks": "the maximum clocks, in the H100 capture's shape",
            "boost_clocks": "the maximum graphics clock, in the H100 capture's shape",
            "mem_temp": "no capture prints it",
            "mig_mib": "no -lgip of a B200 is public: the H100's sizes scaled to the board's"
            " memory, rounded down to 64 MiB",
        },
    ),
    # [l] github.com/thamada/nvidia-smi nvsim/L40S_smi.py: nvidia-smi -q of an L40S at idle,
    #     driver 550.127.05
    # [lq] github.com/thamada/nvidia-smi nvsim/L40S_deviceQuery.py
    Profile(
        key="L40S",
        name="NVIDIA L40S",  # [l] Product Name
        family=ADA,  # [l] Product Architecture: Ada Lovelace
        memory_mib=46068,  # [l] FB Memory Usage Total
        reserved_mib=479,  # [l] Reserved 479 MiB
        cc=(8, 9),  # [lq] CUDA Capability 8.9
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
        app_clocks=_apps(2520, 9001),  # [l] Default Applications Clocks
        boost_clocks=_boost(2520),  # [l] Max Customer Boost Clocks
        row_remap_max=192,  # [l] Bank Remap Availability Histogram Max 192
    ),
    # [n] https://github.com/NVIDIA/nvidia-docker/issues/1446: nvidia-smi -q of a Tesla T4
    #     (VBIOS, part number, inforom)
    # [ct] https://github.com/NVIDIA/nvidia-container-toolkit/issues/465: nvidia-smi -q of an
    #     AWS T4 (Device Id, Sub System Id, PCIe Max 3, 16x)
    # [ml] https://github.com/mlcommons/inference_results_v0.5/issues/20: nvidia-smi -q -d
    #     SUPPORTED_CLOCKS of a T4: Memory 5001 MHz, Graphics up to 1590 MHz
    # [z] nvidia-smi -q of a Tesla T4 at idle, driver 530.30.02; every number below matches
    #     it
    Profile(
        key="T4",
        name="Tesla T4",  # [n][ct][z] Product Name
        family=TURING,  # [z] Product Architecture: Turing
        memory_mib=15360,  # [z] FB Memory Usage Total
        reserved_mib=393,  # [z] Reserved 393 MiB
        cc=(7, 5),
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
        cuda_cores=2560,
        memory_bus_width=256,
        pcie=(3, 16),  # [ct][z] PCIe Generation Max 3, Link Width Max 16x
        app_clocks=_apps(585, 5001),  # [z] Default Applications Clocks
        boost_clocks=_boost(1590),  # [z] Max Customer Boost Clocks
        mem_clocks=(5001,),  # [ml] Supported Clocks: Memory 5001 MHz
        unsourced={
            "cc": "CUDA's compute capability table lists T4 as 7.5; no capture prints it",
            "cuda_cores": "40 SMs x 64, NVIDIA's T4 datasheet, not a capture",
            "memory_bus_width": "NVIDIA's T4 datasheet, not a capture",
        },
    ),
    # [k] https://github.com/NVIDIA/k8s-device-plugin/issues/344: nvidia-smi -q of an AWS g5
    #     A10G, driver 510.85.02 (Product Name, VBIOS)
    # [w] https://github.com/NVIDIA/DCGM/issues/232: nvidia-smi -q of an AWS g5 A10G under
    #     load, driver 535.247.01
    # [a10] github.com/leptonai/gpud e2e/mock/nvidia-smi/test_data.go: an A10 (GA102, same
    #     die): 23028MiB
    Profile(
        key="A10G",
        name="NVIDIA A10G",  # [k][w] Product Name
        family=AMPERE,  # [k] Product Architecture: Ampere
        memory_mib=23028,  # [w] FB Memory Usage Total
        reserved_mib=304,  # [w] Reserved 304 MiB
        cc=(8, 6),
        pci_device_id=0x223710DE,  # [w] Device Id
        pci_subsystem_id=0x152F10DE,  # [w] Sub System Id
        part_number="900-2G133-A840-000",  # [w] Board Part Number
        vbios="94.02.75.00.01",  # [k][w] VBIOS Version
        inforom="G133.0210.00.04",  # [w] Inforom Image Version
        bar1_mib=32768,  # [w] BAR1 Total
        power_w=(300, 100, 300),  # [w] Default / Min / Max Power Limit
        idle_power_w=25,
        pstate=8,
        clocks=(210, 210, 405, 555),
        max_clocks=(1710, 1710, 6251, 1500),  # [w] Max Clocks
        temps=(27, 95, 98, 88, 0),  # [w] current 27, shutdown 98, slowdown 95, max op 88
        cuda_cores=10240,
        memory_bus_width=384,
        pcie=(4, 16),  # [w] PCIe Generation Device Max 4, Link Width Max 16x
        fans=1,  # [w] Fan Speed "0 %", not N/A
        app_clocks=_apps(1710, 6251),  # [w] Default Applications Clocks
        boost_clocks=_boost(1710),  # [w] Max Customer Boost Clocks
        row_remap_max=192,  # [w] Bank Remap Availability Histogram Max 192
        unsourced={
            "cc": "CUDA's compute capability table lists GA102 as 8.6; no capture prints it",
            "idle_power_w": "[w] is under load (60.30 W)",
            "pstate": "[w] is under load (P0); P8 is what idle GA102 boards show",
            "clocks": "[w] is under load; GA102's idle clocks",
            "cuda_cores": "80 SMs x 128, NVIDIA's A10G figure, not a capture",
            "memory_bus_width": "GA102's bus, not a capture",
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
        family=AMPERE,  # [b] Product Architecture: Ampere
        memory_mib=46068,  # [r] Memory-Usage total
        # derived from [r]/[rq] (one driver): deviceQuery's global memory is total minus
        # reserved plus 1 MiB on L40S, H200 and A100 captures; 46068 - 45619 + 1 = 450
        reserved_mib=450,
        cc=(8, 6),  # [rq] CUDA Capability 8.6
        pci_device_id=0x223010DE,  # pci.ids: 10de 2230 "GA102GL [RTX A6000]"
        pci_subsystem_id=0x145910DE,
        part_number="900-5G133-1700-000",  # [b] GPU Part Number
        vbios="94.02.5C.00.02",  # [b][p] VBIOS Version
        inforom="G133.0500.00.05",
        bar1_mib=65536,
        power_w=(300, 100, 300),  # [b] Default / Min / Max Power Limit
        idle_power_w=24,  # [r] 18-28 W at P8
        pstate=8,  # [r] P8
        clocks=(210, 210, 405, 555),  # [b] Clocks at idle
        max_clocks=(2100, 2100, 8001, 1950),  # [b] Max Clocks
        temps=(28, 95, 98, 93, 0),  # [b] max op 93
        cuda_cores=10752,  # [rq] 84 SMs x 128
        memory_bus_width=384,  # [rq] Memory Bus Width 384-bit
        pcie=(4, 16),
        nvlinks=4,
        nvlink_mbps=14062,
        fans=1,  # [r] Fan 30%
        fan_speed=30,  # [r] 30%
        app_clocks=_apps(1800, 8001),  # [b] Default Applications Clocks
        boost_clocks=(0, 0, 0, 0),  # [b] Max Customer Boost Clocks: N/A
        unsourced={
            "pci_subsystem_id": "no capture seen shows it",
            "inforom": "no capture seen shows it",
            "bar1_mib": "no capture seen shows it",
            "temps": "slowdown 95, shutdown 98: no capture seen shows them",
            "pcie": "NVIDIA's datasheet (PCIe 4.0 x16), not a capture",
            "nvlinks": "two-card NVLink bridge, NVIDIA's datasheet",
            "nvlink_mbps": "NVIDIA's GA102 whitepaper, 14.0625 GB/s per direction",
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
