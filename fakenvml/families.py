"""The architecture layer of the board model: what every board of a family answers, stated
once per family (Turing, Ampere, Ada, Hopper, Blackwell) so that a fact learnt on one board
reaches all its siblings: a value the H100 capture shows reaches every Hopper board, a
value a public `nvidia-smi -q` of an A100 shows reaches every Ampere board.

A family states the device getters it answers (`calls`: Hopper's are the capture's; the
others lack what a source says they lack), its event types, ECC counter locations, clock
and P-state structure, field table, MIG profile table shape and NVLink generation. A
board (fakenvml/profiles.py) adds its own numbers; `Family.answers` lists the NVML calls
(in fakenvml.walk's spelling) a board of the family must answer, which
tests/fakenvml/test_boards.py walks on every profile.

Sources, by tag:
  [walk]  the H100 80GB HBM3 capture, tests/fakenvml/data/h100/h100-walk.json (driver
          580.159.04), and its h100-smi-q.txt
  [h]     nvml.h of the nvidia-nvml-dev package the build uses: "For <arch> or newer fully
          supported devices" on each function; nvmlMemoryLocation_t ("Turing+ DRAM",
          "Turing+ SRAM")
  [z]     nvidia-smi -q of a Tesla T4 (Turing), driver 530.30.02 (fakenvml/profiles.py [z])
  [t]     github.com/thamada/nvidia-smi gls/A100SXMx4_smi.py: nvidia-smi -q of A100-SXM4-80GB
          (Ampere), driver 555.42.02, bare metal
  [l]     github.com/thamada/nvidia-smi nvsim/L40S_smi.py: nvidia-smi -q of an L40S (Ada),
          driver 550.127.05
  [g]     github.com/thamada/gls gls/H200_smi.py: nvidia-smi -q of an H200 (Hopper), driver
          550.90.12, passthrough VM
  [sc]    `nvidia-smi -q -d SUPPORTED_CLOCKS` of an A100-SXM4-80GB, driver 510.73.08:
          Memory 1593 MHz; Graphics 1410, 1395, 1380 ... 225, 210 MHz; at idle its
          `-q -d CLOCK` shows Graphics 210 MHz, the lowest supported clock
  [ml]    github.com/mlcommons/inference_results_v0.5 issue 20: `nvidia-smi -q -d
          SUPPORTED_CLOCKS` of a T4: Memory 5001 MHz; Graphics 1590, 1575 MHz ...
  [mug]   NVIDIA's MIG user guide, "Supported MIG Profiles": the 8-memory-slice placements
          and per-profile engines of A100, H100/H200 and B200
A value no source gives says `unsourced:` and why (`Family.unsourced`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fakenvml.model import (
    FIELD_UNKNOWN,
    VALUE_DOUBLE,
    VALUE_UINT,
    VALUE_ULL,
    FieldValue,
    Gpu,
    MigProfile,
)

# NVML_DEVICE_ARCH_* (nvml.h)
ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10

# nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t, not the marketing generation.
NVLINK_VERSION_ENUM = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}

# nvmlMemoryLocation_t: [h] "Turing+ DRAM" (2) and "Turing+ SRAM" (7); -q prints SRAM and
# DRAM counters (and nothing else) on T4 [z], A100 [t], L40S [l], H200 [g], H100 [walk].
ECC_DRAM_SRAM = 1 << 2 | 1 << 7
# nvmlClocksEventReason* bits 0-8: the nine "Clocks Event Reasons" -q lists (Idle ...
# Display Clock Setting), none N/A, on T4 [z], A100 [t], L40S [l], H200 [g]; [walk] 511.
CLOCK_EVENT_REASONS = 0x1FF
# [walk] _supported_events 65439: ECC single/double, P-state, Xid, clock, power source,
# MIG configuration, ECC storm, DRAM retirement (event, failure), poison (non-fatal,
# fatal), GPU unavailable, recovery action.
HOPPER_EVENTS = 0xFF9F
MIG_CONFIG_EVENT = 0x100  # only on boards with MIG: there is no MIG configuration to change


def _words(text: str) -> list[str]:
    return text.split()


# The device getters that take a handle alone and a real H100 answers with SUCCESS [walk]
# (the walk's single-argument calls), less the ones a board answers only with a feature
# (MIG, row remapping: `Family.answers` adds those).
HOPPER_CALLS = frozenset(
    _words("""
    nvmlDeviceGetAccountingBufferSize nvmlDeviceGetAccountingMode nvmlDeviceGetAccountingPids
    nvmlDeviceGetAdaptiveClockInfoStatus nvmlDeviceGetAddressingMode nvmlDeviceGetArchitecture
    nvmlDeviceGetBAR1MemoryInfo nvmlDeviceGetBoardId nvmlDeviceGetBoardPartNumber
    nvmlDeviceGetBrand nvmlDeviceGetBusType nvmlDeviceGetC2cModeInfoV nvmlDeviceGetC2cModeInfoV1
    nvmlDeviceGetComputeMode nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v2 nvmlDeviceGetComputeRunningProcesses_v3
    nvmlDeviceGetConfComputeMemSizeInfo nvmlDeviceGetConfComputeProtectedMemoryUsage
    nvmlDeviceGetCudaComputeCapability nvmlDeviceGetCurrPcieLinkGeneration
    nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetCurrentClockFreqs
    nvmlDeviceGetCurrentClocksEventReasons nvmlDeviceGetCurrentClocksThrottleReasons
    nvmlDeviceGetCurrentEccMode nvmlDeviceGetDecoderUtilization nvmlDeviceGetDefaultEccMode
    nvmlDeviceGetDisplayActive nvmlDeviceGetDisplayMode nvmlDeviceGetDynamicPstatesInfo
    nvmlDeviceGetEccMode nvmlDeviceGetEncoderSessions nvmlDeviceGetEncoderStats
    nvmlDeviceGetEncoderUtilization nvmlDeviceGetEnforcedPowerLimit nvmlDeviceGetFBCSessions
    nvmlDeviceGetFBCStats nvmlDeviceGetGpcClkMinMaxVfOffset nvmlDeviceGetGpcClkVfOffset
    nvmlDeviceGetGpuMaxPcieLinkGeneration nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v2 nvmlDeviceGetGraphicsRunningProcesses_v3
    nvmlDeviceGetGridLicensableFeatures nvmlDeviceGetGridLicensableFeatures_v4
    nvmlDeviceGetGspFirmwareMode nvmlDeviceGetGspFirmwareVersion nvmlDeviceGetIndex
    nvmlDeviceGetInforomConfigurationChecksum nvmlDeviceGetInforomImageVersion
    nvmlDeviceGetIrqNum nvmlDeviceGetJpgUtilization nvmlDeviceGetMPSComputeRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses_v2 nvmlDeviceGetMPSComputeRunningProcesses_v3
    nvmlDeviceGetMarginTemperature nvmlDeviceGetMaxPcieLinkGeneration
    nvmlDeviceGetMaxPcieLinkWidth nvmlDeviceGetMemClkMinMaxVfOffset nvmlDeviceGetMemClkVfOffset
    nvmlDeviceGetMemoryBusWidth nvmlDeviceGetMemoryInfo nvmlDeviceGetMinorNumber
    nvmlDeviceGetModuleId nvmlDeviceGetMultiGpuBoard nvmlDeviceGetName nvmlDeviceGetNumFans
    nvmlDeviceGetNumGpuCores nvmlDeviceGetOfaUtilization nvmlDeviceGetPciInfo
    nvmlDeviceGetPciInfo_v3 nvmlDeviceGetPcieLinkMaxSpeed nvmlDeviceGetPcieReplayCounter
    nvmlDeviceGetPcieSpeed nvmlDeviceGetPdi nvmlDeviceGetPendingEccMode
    nvmlDeviceGetPerformanceModes nvmlDeviceGetPerformanceState nvmlDeviceGetPersistenceMode
    nvmlDeviceGetPowerManagementDefaultLimit nvmlDeviceGetPowerManagementLimit
    nvmlDeviceGetPowerManagementLimitConstraints nvmlDeviceGetPowerManagementMode
    nvmlDeviceGetPowerSource nvmlDeviceGetPowerState nvmlDeviceGetPowerUsage
    nvmlDeviceGetRemappedRows nvmlDeviceGetRepairStatus nvmlDeviceGetSerial
    nvmlDeviceGetSupportedClocksEventReasons nvmlDeviceGetSupportedClocksThrottleReasons
    nvmlDeviceGetSupportedEventTypes nvmlDeviceGetSupportedMemoryClocks
    nvmlDeviceGetSupportedPerformanceStates nvmlDeviceGetTotalEnergyConsumption
    nvmlDeviceGetUUID nvmlDeviceGetUnrepairableMemoryFlag_v1 nvmlDeviceGetUtilizationRates
    nvmlDeviceGetVbiosVersion nvmlDeviceGetVirtualizationMode
""")
)
_MIG_CALLS = ("nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount")


def _fields(kind: int, values: dict[int, int | float]) -> dict[int, FieldValue]:
    return {i: (kind, v) for i, v in values.items()}


# Field tables: id -> (value type, value) as [walk] answers it on an idle H100; the library
# answers ECC, power, energy and remapping fields from the state, the rest from here.
# Every family: ECC mode and totals (1-6; -q "ECC Mode" and "ECC Errors" on every board),
# the perf-policy violation times (74-81: the counters nvmlDeviceGetViolationStatus reads,
# [h] "Kepler or newer"), energy (83: [h] nvmlDeviceGetTotalEnergyConsumption "Volta or
# newer"), PCIe replays (94-95: -q "Replays Since Reset", "Replay Number Rollovers" [z][t]
# [l][g]), power readings (185-192: -q "GPU Power Readings": draw, current, requested,
# default, min, max limit [t][l][g]), reset required (226: -q "Reset Required" [z][t][l]).
_COMMON_FIELDS = {
    **_fields(VALUE_ULL, {1: 1, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0}),
    **_fields(VALUE_ULL, {74: 0, 75: 0, 76: 0, 77: 0, 78: 0, 79: 0, 80: 0, 81: 0, 83: 0}),
    **_fields(VALUE_UINT, {94: 0, 95: 0, 226: 0}),
    **_fields(VALUE_UINT, {185: 0, 186: 0, 187: 0, 188: 0, 189: 0, 190: 0, 192: 0}),
    191: (VALUE_ULL, 0),
}
# Ampere on: remapped rows (142-145: -q "Remapped Rows" [t][l], N/A on Turing [z]), drain
# and reset (227: -q "Drain and Reset Recommended: No" [t][l][g], N/A on Turing [z]).
_REMAP_FIELDS = {**_fields(VALUE_ULL, {142: 0, 143: 0, 144: 0, 145: 0}), 227: (VALUE_UINT, 0)}
# What else [walk] answers: NVSwitch links (147), PCIe error counters (169, 173-183, 197,
# 198), resetless MIG (184) and MIG-independent queries (199), PCIe atomics (228, 229),
# thermal and power-brake slowdown times (269-271). No public -q prints them for another
# family.
_HOPPER_FIELDS = {
    147: (VALUE_DOUBLE, 0.0),
    **_fields(VALUE_UINT, {169: 0, **{i: 0 for i in range(173, 184)}, 184: 1}),
    **_fields(VALUE_UINT, {197: 0, 198: 0, 199: 1, 228: 0, 229: 0}),
    **_fields(VALUE_ULL, {269: 0, 270: 0, 271: 0}),
}
# T.Limit readings (fields 193-196, and nvmlDeviceGetMarginTemperature): -q prints "GPU
# T.Limit Temp" and the limits relative to it on L40S [l], H200 [g], H100 [walk]; N/A on
# A100 [t]; T4's driver [z] prints absolute limits only. Their values come from the board's
# limits (fakenvml/profiles.py): shutdown and slowdown T.Limit are the max operating
# temperature minus them ([walk] -8, -2 for 95, 89 and 87), the max operating ones 0, the
# memory one only with an HBM sensor.
TLIMIT_FIELDS = (193, 194, 195, 196)
MEMORY_TEMP_FIELD = 82  # HBM boards: -q "Memory Current Temp" [t][g][walk]; N/A on GDDR [z][l]


@dataclass(frozen=True)
class MigShape:
    """One GPU-instance profile of a family's MIG table; a board adds name and memory."""

    profile: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int
    slices: int
    instances: int
    memory_slices: int  # also the placement size
    starts: tuple[int, ...]
    sms: int
    engines: tuple[int, int, int, int, int]  # copy engines, NVDEC, NVENC, NVJPG, OFA

    def profile_of(self, name: str, mib: int) -> MigProfile:
        ce, dec, enc, jpg, ofa = self.engines
        return MigProfile(
            profile=self.profile, id=self.id, name=f"MIG {name}", slice_count=self.slices,
            instance_count=self.instances, multiprocessors=self.sms, memory_mib=mib,
            copy_engines=ce, decoders=dec, encoders=enc, jpegs=jpg, ofas=ofa,
            placement_size=self.memory_slices, placement_starts=self.starts,
        )  # fmt: skip


# (profile, id, slices, instances, memory slices, placement starts): the 8-memory-slice
# tree [mug], as the H100's placements show it [walk]; in the order 1g, 2g, 3g, 4g, 7g,
# 1g+me, 1g with two memory slices.
_SHAPE = (
    (0, 19, 1, 7, 1, (0, 1, 2, 3, 4, 5, 6)), (1, 14, 2, 3, 2, (0, 2, 4)), (2, 9, 3, 2, 4, (0, 4)),
    (3, 5, 4, 1, 4, (0,)), (4, 0, 7, 1, 8, (0,)), (7, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (9, 15, 1, 4, 2, (0, 2, 4, 6)),
)  # fmt: skip


def _mig_shape(sms: tuple[int, ...], engines: tuple[tuple[int, ...], ...]) -> tuple[MigShape, ...]:
    return tuple(
        MigShape(p, i, sl, n, mem, st, sm, eng)  # type: ignore[arg-type]
        for (p, i, sl, n, mem, st), sm, eng in zip(_SHAPE, sms, engines, strict=True)
    )


# [mug] A100: 1g 0 NVDEC/0 JPEG/0 OFA, +me 1/1/1, 1g with 2 memory slices 1 NVDEC, 2g 1
# NVDEC, 3g and 4g 2 NVDECs, 7g 5 NVDECs/1 JPEG/1 OFA; copy engines = compute slices; SMs
# 14 per compute slice, 98 for 7g (nvidia-smi mig -lgip of A100s, fakenvml/profiles.py).
AMPERE_MIG = _mig_shape(
    (14, 28, 42, 56, 98, 14, 14),
    ((1, 0, 0, 0, 0), (2, 1, 0, 0, 0), (3, 2, 0, 0, 0), (4, 2, 0, 0, 0), (7, 5, 0, 1, 1),
     (1, 1, 0, 1, 1), (1, 1, 0, 0, 0)),
)  # fmt: skip
# [walk] nvmlDeviceGetGpuInstanceProfileInfo(p): SMs and engines of every H100 profile.
HOPPER_MIG = _mig_shape(
    (16, 32, 60, 64, 132, 16, 26),
    ((1, 1, 0, 1, 0), (2, 2, 0, 2, 0), (3, 3, 0, 3, 0), (4, 4, 0, 4, 0), (8, 7, 0, 7, 1),
     (1, 1, 0, 1, 1), (1, 1, 0, 1, 0)),
)  # fmt: skip


@dataclass(frozen=True)
class Family:
    key: str  # "Hopper"
    arch: int  # NVML_DEVICE_ARCH_*
    nvlink_gen: int  # its NVLink generation (0: none); a board says how many links
    event_types: int  # nvmlDeviceGetSupportedEventTypes (MIG's only where the board has MIG)
    display_mode: int  # nvmlDeviceGetDisplayMode (a board may differ)
    gfx_clock_step: int  # supported graphics clocks: the maximum down to the idle clock
    pstates: tuple[int, ...] | None  # as the driver lists them; None: idle P-state, P0
    fields: dict[int, FieldValue]  # its field table (the board adds memory temperature)
    tlimit: bool  # T.Limit readings (TLIMIT_FIELDS, nvmlDeviceGetMarginTemperature)
    conf_compute: bool  # Confidential Computing capable
    mig: tuple[MigShape, ...] = ()  # the GPU-instance profiles a MIG board of it offers
    ecc_locations: int = ECC_DRAM_SRAM  # bit per nvmlMemoryLocation_t with ECC counters
    clock_event_reasons: int = CLOCK_EVENT_REASONS
    lacks: dict[str, str] = field(default_factory=dict)  # Hopper's calls it lacks: why
    extra_calls: frozenset[str] = frozenset()  # calls it answers that Hopper does not
    unsourced: dict[str, str] = field(default_factory=dict)  # value -> why no source gives it

    @property
    def calls(self) -> frozenset[str]:
        """The device getters taking a handle alone that every board of it answers."""
        return (HOPPER_CALLS - set(self.lacks)) | self.extra_calls

    def pstates_of(self, idle_pstate: int) -> tuple[int, ...]:
        if self.pstates is not None:
            return self.pstates
        return (idle_pstate, 0) if idle_pstate else (0,)

    def answers(self, gpu: Gpu) -> set[str]:
        """The NVML calls, in fakenvml.walk's keys, that `gpu` (a board of this family)
        answers with SUCCESS by the family's facts and the board's numbers."""
        keys = set(self.calls)
        if gpu.mig_profiles:
            keys |= set(_MIG_CALLS)
        if gpu.row_remap_max:
            keys.add("nvmlDeviceGetRowRemapperHistogram")
        if gpu.fan_count:
            keys.add("nvmlDeviceGetFanSpeed")
        for clock in range(4):
            keys |= {f"nvmlDeviceGetClockInfo({clock})", f"nvmlDeviceGetMaxClockInfo({clock})",
                     f"nvmlDeviceGetClock({clock},0)"}  # fmt: skip
            if gpu.app_clocks and gpu.app_clocks[clock]:
                keys |= {f"nvmlDeviceGetApplicationsClock({clock})",
                         f"nvmlDeviceGetDefaultApplicationsClock({clock})",
                         f"nvmlDeviceGetClock({clock},1)",
                         f"nvmlDeviceGetClock({clock},2)"}  # fmt: skip
            if gpu.boost_clocks and gpu.boost_clocks[clock]:
                keys.add(f"nvmlDeviceGetMaxCustomerBoostClock({clock})")
        keys.add("nvmlDeviceGetSupportedGraphicsClocks(maxmem)")
        keys |= {f"nvmlDeviceGetMinMaxClockOfPState(0,{p})" for p in gpu.pstates}
        keys.add("nvmlDeviceGetTemperature(GPU)")
        keys |= {f"nvmlDeviceGetTemperatureThreshold({t})" for t in (0, 1, 3)}
        if gpu.temp_mem_max:
            keys.add("nvmlDeviceGetTemperatureThreshold(2)")
        for error in range(2):
            for counter in range(2):
                keys.add(f"nvmlDeviceGetTotalEccErrors({error},{counter})")
                keys |= {
                    f"nvmlDeviceGetMemoryErrorCounter({error},{counter},{loc})"
                    for loc in range(8)
                    if self.ecc_locations >> loc & 1
                }
        if self.arch < ARCH_AMPERE:  # pages retire before Ampere; rows remap from it on
            keys |= {"nvmlDeviceGetRetiredPages(0)", "nvmlDeviceGetRetiredPages(1)"}
        keys |= {f"nvmlDeviceGetPcieThroughput({c})" for c in range(2)}
        keys |= {f"nvmlDeviceGetEncoderCapacity({c})" for c in range(2)}
        keys |= {f"nvmlDeviceGetViolationStatus({p})" for p in range(6)}
        for m in gpu.mig_profiles:
            keys |= {f"nvmlDeviceGetGpuInstanceProfileInfo({m.profile})",
                     f"nvmlDeviceGetGpuInstanceProfileInfoV({m.profile})",
                     f"nvmlDeviceGetGpuInstanceRemainingCapacity(id{m.id})",
                     f"nvmlDeviceGetGpuInstancePossiblePlacements(id{m.id})"}  # fmt: skip
        keys |= {f"field[{i}]" for i, (kind, _) in gpu.fields.items() if kind != FIELD_UNKNOWN}
        events = gpu.event_types & (~0 if gpu.ecc_enabled else ~0x3)
        keys |= {f"nvmlDeviceRegisterEvents(1<<{b})" for b in range(20) if events >> b & 1}
        keys.add("_supported_events")
        return keys


_NO_CAPTURE = "no capture of this family's boards walks it"


def _no_c2c(why: str) -> dict[str, str]:
    """The C2C mode getters (Hopper on) and the unrepairable-memory flag ([h] Hopper on)."""
    return {
        "nvmlDeviceGetC2cModeInfoV": f"Hopper on: -q GPU C2C Mode {why}",
        "nvmlDeviceGetC2cModeInfoV1": "the same call",
        "nvmlDeviceGetUnrepairableMemoryFlag_v1": "[h] For Hopper or newer",
    }


_NO_CC = "NVIDIA names Hopper its first Confidential Computing GPU; no capture shows it"

TURING = Family(
    key="Turing", arch=ARCH_TURING, nvlink_gen=0,
    event_types=HOPPER_EVENTS,
    display_mode=1,  # [z] Display Mode: Enabled
    gfx_clock_step=15,  # [ml] 1590, 1575 MHz
    pstates=None, fields=_COMMON_FIELDS, tlimit=False, conf_compute=False,
    lacks={
        **_no_c2c("N/A on A100 [t] and L40S [l]"),
        "nvmlDeviceGetMarginTemperature": "T.Limit readings: Ada on ([t] N/A, [l] 57 C)",
        "nvmlDeviceGetRemappedRows": "[h] For Ampere or newer; [z] Remapped Rows: N/A",
        "nvmlDeviceGetRepairStatus": "[h] For Ampere or newer",
        "nvmlDeviceGetConfComputeMemSizeInfo": "[h] For Ampere or newer",
        "nvmlDeviceGetConfComputeProtectedMemoryUsage": "[h] For Ampere or newer",
    },
    extra_calls=frozenset({"nvmlDeviceGetRetiredPagesPendingStatus"}),  # [z] Retired Pages
    unsourced={
        "event_types": f"Hopper's [walk]: {_NO_CAPTURE}",
        "conf_compute": _NO_CC,
        "pstates": "the idle P-state [z] and P0, in Hopper's order (higher first)",
        "fields": "power readings (185-192): T4's driver [z] prints the older Power Readings",
    },
)  # fmt: skip

AMPERE = Family(
    key="Ampere", arch=ARCH_AMPERE, nvlink_gen=3,
    event_types=HOPPER_EVENTS,
    display_mode=1,  # [t] Display Mode: Enabled
    gfx_clock_step=15,  # [sc] 1410, 1395, 1380 ... 210 MHz
    pstates=None, fields={**_COMMON_FIELDS, **_REMAP_FIELDS}, tlimit=False,
    conf_compute=False, mig=AMPERE_MIG,
    lacks={
        **_no_c2c("N/A [t]"),
        "nvmlDeviceGetMarginTemperature": "[t] GPU T.Limit Temp: N/A",
    },
    unsourced={
        "event_types": f"Hopper's [walk]: {_NO_CAPTURE}",
        "conf_compute": _NO_CC,
        "nvlink_gen": "NVIDIA's marketing generation (NVLink 3); no capture prints it",
        "pstates": "the idle P-state (A100 [t] P0, RTX A6000 P8) and P0 (A10G's under load: "
                   "fakenvml/profiles.py), in Hopper's order (higher first)",
    },
)  # fmt: skip

ADA = Family(
    key="Ada", arch=ARCH_ADA, nvlink_gen=0,
    event_types=HOPPER_EVENTS,
    display_mode=1,  # [l] Display Mode: Enabled
    gfx_clock_step=15,
    pstates=None, fields={**_COMMON_FIELDS, **_REMAP_FIELDS}, tlimit=True, conf_compute=False,
    lacks=_no_c2c("N/A [l]"),
    unsourced={
        "event_types": f"Hopper's [walk]: {_NO_CAPTURE}",
        "conf_compute": _NO_CC,
        "gfx_clock_step": "15 MHz, as on every family with a supported-clocks capture",
        "pstates": "the idle P-state [l] and P0, in Hopper's order (higher first)",
    },
)  # fmt: skip

HOPPER = Family(
    key="Hopper", arch=ARCH_HOPPER, nvlink_gen=4,
    event_types=HOPPER_EVENTS,
    display_mode=1,  # [walk] nvmlDeviceGetDisplayMode 1
    gfx_clock_step=15,  # [walk] nvmlDeviceGetSupportedGraphicsClocks: 1980, 1965, ... 345
    pstates=(2, 0),  # [walk] nvmlDeviceGetSupportedPerformanceStates, in the driver's order
    fields={**_COMMON_FIELDS, **_REMAP_FIELDS, **_HOPPER_FIELDS}, tlimit=True,
    conf_compute=True,  # [walk] nvmlSystemGetConfComputeCapabilities gpusCaps 1
    mig=HOPPER_MIG,
    unsourced={"nvlink_gen": "NVIDIA's marketing generation (NVLink 4); no capture shows it"},
)  # fmt: skip

BLACKWELL = Family(
    key="Blackwell", arch=ARCH_BLACKWELL, nvlink_gen=5,
    event_types=HOPPER_EVENTS, display_mode=1, gfx_clock_step=15,
    pstates=(2, 0), fields={**_COMMON_FIELDS, **_REMAP_FIELDS, **_HOPPER_FIELDS}, tlimit=True,
    conf_compute=True, mig=HOPPER_MIG,
    unsourced={
        "event_types": f"Hopper's: {_NO_CAPTURE}",
        "display_mode": "Hopper's: no public nvidia-smi -q of a B200",
        "gfx_clock_step": "Hopper's: no public supported-clocks list of a B200",
        "pstates": "Hopper's: no public capture",
        "fields": "Hopper's: no public capture",
        "conf_compute": "Hopper's; NVIDIA lists Blackwell as CC capable, no capture shows it",
        "mig": "Hopper's SMs and engines: no public nvidia-smi mig -lgip of a B200",
        "nvlink_gen": "NVIDIA's marketing generation (NVLink 5)",
    },
)  # fmt: skip

FAMILIES: dict[str, Family] = {f.key: f for f in (TURING, AMPERE, ADA, HOPPER, BLACKWELL)}
# What a family states, for counting sourced and unsourced values (docs/fakenvml.md).
VALUES = ("nvlink_gen", "event_types", "ecc_locations", "clock_event_reasons",
          "display_mode", "gfx_clock_step", "pstates", "fields", "tlimit", "conf_compute",
          "mig", "lacks")  # fmt: skip


def stated(f: Family) -> list[str]:
    """The values a family states (a MIG table or lacks only where it has some)."""
    return [v for v in VALUES if v not in ("mig", "lacks") or getattr(f, v)]
