"""Every implemented NVML function, exercised through the official nvidia-ml-py bindings
and checked against the node model the control plane wrote.

Each check is a plain function so that test_every_implemented_function_is_exercised can
run them all and prove, from what pynvml actually resolved, that none was left out.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import pynvml as nv
import pytest

from fakenvml import mig, walk
from fakenvml.model import Node
from fakenvml.node import NodeDir
from tests.fakenvml.conftest import CALLED

IMPLEMENTED = Path(__file__).resolve().parents[2] / "build" / "gen" / "implemented.txt"
Check = Callable[[NodeDir, Node], None]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def raw(name: str):  # type: ignore[no-untyped-def]
    """A function pynvml has no wrapper for (legacy names), resolved through pynvml."""
    return nv._nvmlGetFunctionPointer(name)


def h(i: int = 0):  # type: ignore[no-untyped-def]
    return nv.nvmlDeviceGetHandleByIndex(i)


def raises(code: int, fn: Callable[..., object], *args: object) -> None:
    with pytest.raises(nv.NVMLError) as e:
        fn(*args)
    assert e.value.value == code, f"expected {nv.nvmlErrorString(code)}, got {e.value}"


# ---------------------------------------------------------------- system and lifecycle


@check
def system_versions(st: NodeDir, node: Node) -> None:
    assert nv.nvmlSystemGetDriverVersion() == node.driver_version
    assert nv.nvmlSystemGetNVMLVersion() == node.nvml_version
    assert nv.nvmlSystemGetCudaDriverVersion() == node.cuda_driver_version
    assert nv.nvmlSystemGetCudaDriverVersion_v2() == node.cuda_driver_version
    branch = nv.nvmlSystemGetDriverBranch().branch
    assert branch == "r" + node.driver_version.split(".")[0]
    # A process's name is its argv[0] as this host's /proc has it; no such pid: NOT_FOUND.
    argv0 = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert nv.nvmlSystemGetProcessName(os.getpid()) == argv0
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    raises(nv.NVML_ERROR_NOT_FOUND, nv.nvmlSystemGetProcessName, pid_max + 1)
    assert nv.nvmlGetExcludedDeviceCount() == 0
    raises(nv.NVML_ERROR_INVALID_ARGUMENT, nv.nvmlGetExcludedDeviceInfoByIndex, 0)


@check
def error_strings(st: NodeDir, node: Node) -> None:
    assert nv.nvmlErrorString(nv.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert nv.nvmlErrorString(nv.NVML_SUCCESS) == "Success"
    assert nv.nvmlErrorString(12345) == "Unknown Error"


@check
def init_variants_are_reference_counted(st: NodeDir, node: Node) -> None:
    for name in ("nvmlInit", "nvmlInit_v2"):
        assert raw(name)() == nv.NVML_SUCCESS
    nv.nvmlInitWithFlags(0)
    for _ in range(3):
        nv.nvmlShutdown()  # three extra shutdowns: the fixture's init still holds
    assert nv.nvmlDeviceGetCount() == len(node.gpus)


@check
def count_and_handles(st: NodeDir, node: Node) -> None:
    n = len(node.gpus)
    assert nv.nvmlDeviceGetCount() == n
    count = ctypes.c_uint(0)
    assert raw("nvmlDeviceGetCount")(ctypes.byref(count)) == nv.NVML_SUCCESS
    assert count.value == n
    handle = nv.c_nvmlDevice_t()
    assert raw("nvmlDeviceGetHandleByIndex")(3, ctypes.byref(handle)) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetIndex(handle) == 3
    raises(nv.NVML_ERROR_INVALID_ARGUMENT, nv.nvmlDeviceGetHandleByIndex, n)
    for g in node.gpus[:3]:
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(g.uuid)) == g.index
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleBySerial(g.serial)) == g.index
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(g.bus_id)) == g.index
        short = g.bus_id[4:].lower()  # "0000:3b:00.0" form, lower case
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(short)) == g.index
        assert raw("nvmlDeviceGetHandleByPciBusId")(g.bus_id.encode(), ctypes.byref(handle)) == 0
        assert nv.nvmlDeviceGetIndex(handle) == g.index
        by_text = nv.nvmlDeviceGetHandleByUUIDV(g.uuid.encode(), nv.NVML_UUID_TYPE_ASCII)
        assert nv.nvmlDeviceGetIndex(by_text) == g.index
        binary = bytes.fromhex(g.uuid[4:].replace("-", ""))
        by_bytes = nv.nvmlDeviceGetHandleByUUIDV(binary, nv.NVML_UUID_TYPE_BINARY)
        assert nv.nvmlDeviceGetIndex(by_bytes) == g.index
    raises(nv.NVML_ERROR_NOT_FOUND, nv.nvmlDeviceGetHandleByUUID, "GPU-nope")
    raises(nv.NVML_ERROR_NOT_FOUND, nv.nvmlDeviceGetHandleByPciBusId, "0000:00:00.0")


# ---------------------------------------------------------------- identity


@check
def compute_mode(st: NodeDir, node: Node) -> None:
    """Set through the journal and read back; put back, as the checks share one state."""
    d = h(0)
    before = nv.nvmlDeviceGetComputeMode(d)
    nv.nvmlDeviceSetComputeMode(d, nv.NVML_COMPUTEMODE_PROHIBITED)
    assert nv.nvmlDeviceGetComputeMode(d) == nv.NVML_COMPUTEMODE_PROHIBITED
    raises(nv.NVML_ERROR_INVALID_ARGUMENT, nv.nvmlDeviceSetComputeMode, d, 99)
    nv.nvmlDeviceSetComputeMode(d, before)
    assert nv.nvmlDeviceGetComputeMode(d) == before


@check
def identity(st: NodeDir, node: Node) -> None:
    for g in (node.gpus[0], node.gpus[-1]):
        d = h(g.index)
        assert nv.nvmlDeviceGetName(d) == g.name
        assert nv.nvmlDeviceGetUUID(d) == g.uuid
        assert nv.nvmlDeviceGetSerial(d) == g.serial
        assert nv.nvmlDeviceGetIndex(d) == g.index
        assert nv.nvmlDeviceGetMinorNumber(d) == (g.index if g.minor < 0 else g.minor)
        assert nv.nvmlDeviceGetBoardPartNumber(d) == g.part_number
        assert nv.nvmlDeviceGetVbiosVersion(d) == g.vbios
        assert nv.nvmlDeviceGetInforomImageVersion(d) == g.inforom
        assert nv.nvmlDeviceGetInforomVersion(d, nv.NVML_INFOROM_ECC)
        assert nv.nvmlDeviceGetBrand(d) == g.brand
        assert nv.nvmlDeviceGetArchitecture(d) == g.arch
        assert nv.nvmlDeviceGetCudaComputeCapability(d) == (g.cc_major, g.cc_minor)
        assert nv.nvmlDeviceGetBoardId(d) == g.board_id
        assert nv.nvmlDeviceGetMultiGpuBoard(d) == int(g.multi_gpu_board)
        assert nv.nvmlDeviceGetModuleId(d) == g.index + 1
        assert nv.nvmlDeviceGetPersistenceMode(d) == int(g.persistence)
        assert nv.nvmlDeviceGetComputeMode(d) == g.compute_mode
        assert nv.nvmlDeviceGetDisplayMode(d) == g.display_mode
        assert nv.nvmlDeviceGetDisplayActive(d) == nv.NVML_FEATURE_DISABLED
        assert nv.nvmlDeviceGetVirtualizationMode(d) == nv.NVML_GPU_VIRTUALIZATION_MODE_NONE
        assert nv.nvmlDeviceGetNumGpuCores(d) == g.num_cores
        assert nv.nvmlDeviceGetMemoryBusWidth(d) == g.memory_bus_width
        assert nv.nvmlDeviceGetIrqNum(d) > 0
        assert nv.nvmlDeviceGetBusType(d) == nv.NVML_BUS_TYPE_PCIE


@check
def string_buffers_too_small_are_refused(st: NodeDir, node: Node) -> None:
    buf = ctypes.create_string_buffer(8)
    assert raw("nvmlDeviceGetUUID")(h(), buf, 8) == nv.NVML_ERROR_INSUFFICIENT_SIZE
    assert raw("nvmlDeviceGetName")(h(), buf, 8) == nv.NVML_ERROR_INSUFFICIENT_SIZE


@check
def mig_is_disabled(st: NodeDir, node: Node) -> None:
    assert nv.nvmlDeviceGetMigMode(h()) == [nv.NVML_DEVICE_MIG_DISABLE] * 2
    assert nv.nvmlDeviceIsMigDeviceHandle(h()).value == 0  # pynvml returns the c_uint
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h()) == 0


@check
def pci_identity(st: NodeDir, node: Node) -> None:
    g = node.gpus[5]
    for name in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo_v3"):
        pci = nv.nvmlPciInfo_t()
        assert raw(name)(h(5), ctypes.byref(pci)) == nv.NVML_SUCCESS, name
        assert pci.busId == g.bus_id
        assert (pci.domain, pci.bus, pci.device) == (g.pci_domain, g.pci_bus, g.pci_device)
        assert pci.pciDeviceId == g.pci_device_id
        assert pci.pciSubSystemId == g.pci_subsystem_id
        assert pci.busIdLegacy == g.bus_id[4:]
    info = nv.nvmlDeviceGetPciInfo(h(5))  # the _v3 wrapper
    assert info.busId == g.bus_id
    ext = nv.nvmlPciInfoExt_v1_t()
    ext.version = nv.nvmlPciInfoExt_v1
    nv.nvmlDeviceGetPciInfoExt(h(5), ctypes.byref(ext))
    assert (ext.baseClass, ext.subClass, ext.busId) == (3, 2, g.bus_id)
    assert nv.nvmlDeviceGetMaxPcieLinkGeneration(h()) == g.pcie_gen
    assert nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h()) == g.pcie_gen
    assert nv.nvmlDeviceGetCurrPcieLinkGeneration(h()) == g.pcie_gen
    assert nv.nvmlDeviceGetMaxPcieLinkWidth(h()) == g.pcie_width
    assert nv.nvmlDeviceGetCurrPcieLinkWidth(h()) == g.pcie_width
    assert nv.nvmlDeviceGetPcieLinkMaxSpeed(h()) == g.pcie_gen  # NVML_PCIE_LINK_MAX_SPEED_*
    assert nv.nvmlDeviceGetPcieSpeed(h()) == {4: 16000, 5: 32000}[g.pcie_gen]  # MT/s
    assert nv.nvmlDeviceGetPcieThroughput(h(), nv.NVML_PCIE_UTIL_TX_BYTES) == 0
    assert nv.nvmlDeviceGetPcieReplayCounter(h()) == 0


# ---------------------------------------------------------------- sensors


@check
def memory(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    v1 = nv.nvmlDeviceGetMemoryInfo(h())
    assert v1.total == g.memory_total
    assert v1.used == g.memory_used + g.memory_reserved
    assert v1.free == v1.total - v1.used
    v2 = nv.nvmlDeviceGetMemoryInfo(h(), version=nv.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used) == (g.memory_total, g.memory_reserved, g.memory_used)
    assert v2.free == g.memory_total - g.memory_reserved - g.memory_used
    bar1 = nv.nvmlDeviceGetBAR1MemoryInfo(h())
    assert bar1.bar1Total == g.bar1_total
    assert bar1.bar1Free + bar1.bar1Used == g.bar1_total


@check
def thermals(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    assert nv.nvmlDeviceGetTemperature(h(), nv.NVML_TEMPERATURE_GPU) == g.temp_gpu
    assert nv.nvmlDeviceGetTemperatureV(h(), nv.NVML_TEMPERATURE_GPU) == g.temp_gpu
    th = nv.nvmlDeviceGetTemperatureThreshold
    assert th(h(), nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == g.temp_shutdown
    assert th(h(), nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == g.temp_slowdown
    assert th(h(), nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == g.temp_gpu_max
    assert th(h(), nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX) == g.temp_mem_max
    raises(nv.NVML_ERROR_NOT_SUPPORTED, th, h(), nv.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)


@check
def power_and_energy(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    assert nv.nvmlDeviceGetPowerUsage(h()) == g.power_usage_mw
    assert nv.nvmlDeviceGetPowerManagementLimit(h()) == g.power_limit_mw
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h()) == g.power_limit_mw
    assert nv.nvmlDeviceGetPowerManagementDefaultLimit(h()) == g.power_default_mw
    assert nv.nvmlDeviceGetPowerManagementLimitConstraints(h()) == [
        g.power_min_mw, g.power_max_mw,
    ]  # fmt: skip
    assert nv.nvmlDeviceGetPowerManagementMode(h()) == nv.NVML_FEATURE_ENABLED
    assert nv.nvmlDeviceGetPowerSource(h()) == nv.NVML_POWER_SOURCE_AC
    assert nv.nvmlDeviceGetPowerState(h()) == g.pstate
    assert nv.nvmlDeviceGetPerformanceState(h()) == g.pstate
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h())
    assert e1 >= g.energy_mj


@check
def utilization(st: NodeDir, node: Node) -> None:
    u = nv.nvmlDeviceGetUtilizationRates(h())
    assert (u.gpu, u.memory) == (node.gpus[0].util_gpu, node.gpus[0].util_mem)
    assert nv.nvmlDeviceGetEncoderUtilization(h())[0] == 0
    assert nv.nvmlDeviceGetDecoderUtilization(h())[0] == 0


@check
def clocks(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    kinds = [nv.NVML_CLOCK_GRAPHICS, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_CLOCK_VIDEO]
    for i, kind in enumerate(kinds):
        assert nv.nvmlDeviceGetClockInfo(h(), kind) == g.clocks[i]
        assert nv.nvmlDeviceGetMaxClockInfo(h(), kind) == g.max_clocks[i]
        assert nv.nvmlDeviceGetClock(h(), kind, nv.NVML_CLOCK_ID_CURRENT) == g.clocks[i]
        # The profile's application and boost clocks; 0: that clock type has none.
        for fn, want in (
            (nv.nvmlDeviceGetApplicationsClock, g.app_clocks[i]),  # type: ignore[index]
            (nv.nvmlDeviceGetDefaultApplicationsClock, g.app_clocks[i]),  # type: ignore[index]
            (nv.nvmlDeviceGetMaxCustomerBoostClock, g.boost_clocks[i]),  # type: ignore[index]
        ):
            if want:
                assert fn(h(), kind) == want
            else:
                raises(nv.NVML_ERROR_NOT_SUPPORTED, fn, h(), kind)
        target = nv.NVML_CLOCK_ID_APP_CLOCK_TARGET
        if g.app_clocks[i]:  # type: ignore[index]
            assert nv.nvmlDeviceGetClock(h(), kind, target) == g.app_clocks[i]  # type: ignore[index]
    idle = nv.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h()) == idle
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h()) == idle
    assert nv.nvmlDeviceGetSupportedClocksEventReasons(h()) & idle
    assert nv.nvmlDeviceGetSupportedClocksThrottleReasons(h()) & idle


@check
def fans_absent_on_sxm(st: NodeDir, node: Node) -> None:
    assert node.gpus[0].fan_count == 0
    raises(nv.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetFanSpeed, h())
    raises(nv.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetFanSpeed_v2, h(), 0)
    assert nv.nvmlDeviceGetNumFans(h()) == 0  # as a real H100 answers


@check
def no_running_processes(st: NodeDir, node: Node) -> None:
    for kind in ("Compute", "Graphics", "MPSCompute"):
        assert getattr(nv, f"nvmlDevice{'Get'}{kind}RunningProcesses")(h()) == []
        assert getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")(h()) == []
        count = ctypes.c_uint(7)
        fn = raw(f"nvmlDeviceGet{kind}RunningProcesses")
        assert fn(h(), ctypes.byref(count), None) == nv.NVML_SUCCESS
        assert count.value == 0


# ---------------------------------------------------------------- ECC


@check
def ecc_counters_follow_injected_faults(st: NodeDir, node: Node) -> None:
    C, U = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    V = nv.NVML_VOLATILE_ECC
    assert nv.nvmlDeviceGetEccMode(h(2)) == [nv.NVML_FEATURE_ENABLED] * 2
    assert nv.nvmlDeviceGetDefaultEccMode(h(2)) == [nv.NVML_FEATURE_ENABLED]
    assert nv.nvmlDeviceGetTotalEccErrors(h(2), U, V) == 0
    st.inject_ecc(2, double=False, count=5)
    st.inject_ecc(2, double=True, count=2)
    assert nv.nvmlDeviceGetTotalEccErrors(h(2), C, V) == 5
    assert nv.nvmlDeviceGetTotalEccErrors(h(2), U, nv.NVML_AGGREGATE_ECC) == 2
    dram = nv.NVML_MEMORY_LOCATION_DEVICE_MEMORY
    assert nv.nvmlDeviceGetMemoryErrorCounter(h(2), U, V, dram) == 2
    assert nv.nvmlDeviceGetMemoryErrorCounter(h(2), U, V, nv.NVML_MEMORY_LOCATION_SRAM) == 0
    l2 = nv.NVML_MEMORY_LOCATION_L2_CACHE  # H100 counts no ECC errors there
    raises(nv.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetMemoryErrorCounter, h(2), U, V, l2)
    assert nv.nvmlDeviceGetDetailedEccErrors(h(2), C, V).deviceMemory == 5
    assert nv.nvmlDeviceGetTotalEccErrors(h(3), U, V) == 0  # other GPUs untouched
    # Hopper remaps rows; page retirement is the pre-Ampere mechanism.
    assert nv.nvmlDeviceGetRemappedRows(h(2)) == (0, 2, 1, 0)
    raises(nv.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetRetiredPages, h(2), 1)


@check
def page_retirement_on_turing(st: NodeDir, node: Node) -> None:
    # A second state in this same process: re-init NVML against a T4 node.
    t4 = NodeDir(st.path.parent / "t4")
    from tests.fakenvml.conftest import build_node

    t4.init(build_node({"gpus": [{"profile": "T4", "count": 2}]}, "t4"))
    import os

    old = os.environ["FAKENVML_STATE_DIR"]
    nv.nvmlShutdown()
    os.environ["FAKENVML_STATE_DIR"] = str(t4.path)
    try:
        nv.nvmlInit()
        dbe = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        assert nv.nvmlDeviceGetRetiredPages(h(1), dbe) == []
        assert nv.nvmlDeviceGetRetiredPagesPendingStatus(h(1)) == nv.NVML_FEATURE_DISABLED
        t4.inject_ecc(1, double=True, count=3)
        pages = nv.nvmlDeviceGetRetiredPages(h(1), dbe)
        assert len(pages) == 3 and len(set(pages)) == 3
        assert len(nv.nvmlDeviceGetRetiredPages_v2(h(1), dbe)) == 3
        assert nv.nvmlDeviceGetRetiredPagesPendingStatus(h(1)) == nv.NVML_FEATURE_ENABLED
        raises(nv.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetRemappedRows, h(1))
        nv.nvmlShutdown()
    finally:
        os.environ["FAKENVML_STATE_DIR"] = old
        nv.nvmlInit()


# ---------------------------------------------------------------- topology


@check
def numa_and_affinity(st: NodeDir, node: Node) -> None:
    for g in (node.gpus[0], node.gpus[-1]):
        assert nv.nvmlDeviceGetNumaNodeId(h(g.index)) == g.numa_node
        cpus = nv.nvmlDeviceGetCpuAffinity(h(g.index), 4)
        bits = [w * 64 + b for w, word in enumerate(cpus) for b in range(64) if word >> b & 1]
        assert bits == [w for w in range(g.cpu_first, g.cpu_first + g.cpu_count) if w < 256]
        assert list(nv.nvmlDeviceGetCpuAffinityWithinScope(h(g.index), 4, 0)) == list(cpus)
        nodes = nv.nvmlDeviceGetMemoryAffinity(h(g.index), 1, 0)
        assert nodes[0] == 1 << g.numa_node
    gpus_on_cpu0 = nv.nvmlSystemGetTopologyGpuSet(node.gpus[0].cpu_first)
    expected = [g.index for g in node.gpus if g.cpu_first == node.gpus[0].cpu_first]
    assert [nv.nvmlDeviceGetIndex(d) for d in gpus_on_cpu0] == expected


@check
def pcie_common_ancestor(st: NodeDir, node: Node) -> None:
    a = node.gpus[0]
    for b in node.gpus:
        level = nv.nvmlDeviceGetTopologyCommonAncestor(h(a.index), h(b.index))
        if b is a:
            assert level == nv.NVML_TOPOLOGY_INTERNAL
        elif b.pcie_switch == a.pcie_switch:
            assert level == nv.NVML_TOPOLOGY_SINGLE
        elif b.numa_node != a.numa_node:
            assert level == nv.NVML_TOPOLOGY_SYSTEM
        else:
            assert level in (nv.NVML_TOPOLOGY_MULTIPLE, nv.NVML_TOPOLOGY_HOSTBRIDGE,
                             nv.NVML_TOPOLOGY_NODE)  # fmt: skip
    near = nv.nvmlDeviceGetTopologyNearestGpus(h(0), nv.NVML_TOPOLOGY_SINGLE)
    assert [nv.nvmlDeviceGetIndex(d) for d in near] == [
        g.index for g in node.gpus if g.pcie_switch == a.pcie_switch and g is not a
    ]
    everyone = nv.nvmlDeviceGetTopologyNearestGpus(h(0), nv.NVML_TOPOLOGY_SYSTEM)
    assert len(everyone) == len(node.gpus) - 1


@check
def nvlink(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    assert g.links, "the 8 x H100 default inventory is NVSwitch-wired"
    for link, spec in enumerate(g.links):
        assert nv.nvmlDeviceGetNvLinkState(h(), link) == nv.NVML_FEATURE_ENABLED
        assert nv.nvmlDeviceGetNvLinkVersion(h(), link) == g.nvlink_version
        assert nv.nvmlDeviceGetNvLinkRemoteDeviceType(h(), link) == spec.remote_kind
        remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(h(), link)  # the _v2 wrapper
        assert remote.busId == spec.remote_bus_id
        pci = nv.nvmlPciInfo_t()
        assert raw("nvmlDeviceGetNvLinkRemotePciInfo")(h(), link, ctypes.byref(pci)) == 0
        assert pci.busId == spec.remote_bus_id
    cap = nv.NVML_NVLINK_CAP_P2P_SUPPORTED
    assert nv.nvmlDeviceGetNvLinkCapability(h(), 0, cap) == 1
    assert nv.nvmlDeviceGetNvLinkErrorCounter(h(), 0, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0
    # Past the last link: INVALID_ARGUMENT, which NVIDIA's plugin treats as "no link".
    raises(nv.NVML_ERROR_INVALID_ARGUMENT, nv.nvmlDeviceGetNvLinkState, h(), len(g.links))
    p2p = nv.nvmlDeviceGetP2PStatus(h(0), h(1), nv.NVML_P2P_CAPS_INDEX_NVLINK)
    assert p2p == nv.NVML_P2P_STATUS_OK
    read = 0  # NVML_P2P_CAPS_INDEX_READ; pynvml defines that constant as a tuple (0,)
    assert nv.nvmlDeviceGetP2PStatus(h(0), h(1), read) == nv.NVML_P2P_STATUS_OK
    assert nv.nvmlDeviceOnSameBoard(h(0), h(0)) == 1


@check
def gpu_fabric(st: NodeDir, node: Node) -> None:
    """Eight H100 on one NVSwitch baseboard: each registered with the fabric manager, one
    cluster and one clique (tests/fakenvml/test_fabric.py: the other families and shapes)."""
    seen = set()
    for i in range(len(node.gpus)):
        v1, v3 = nv.c_nvmlGpuFabricInfo_t(), nv.c_nvmlGpuFabricInfo_v3_t()
        nv.nvmlDeviceGetGpuFabricInfo(h(i), ctypes.byref(v1))
        nv.nvmlDeviceGetGpuFabricInfoV(h(i), ctypes.byref(v3))
        done = nv.NVML_GPU_FABRIC_STATE_COMPLETED
        assert (v1.state, v1.status, v3.state, v3.status) == (done, 0, done, 0)
        assert v3.healthSummary == nv.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        seen.add((bytes(v1.clusterUuid), v1.cliqueId, bytes(v3.clusterUuid), v3.cliqueId))
    [(cluster, clique, cluster3, clique3)] = seen
    assert cluster == cluster3 != bytes(16) and clique == clique3 != 0


@check
def process_utilization(st: NodeDir, node: Node) -> None:
    """(tests/fakenvml/test_process_utilization.py: the two-call pattern, shares, stamps.)"""
    raises(nv.NVML_ERROR_NOT_FOUND, nv.nvmlDeviceGetProcessUtilization, h(6), 0)
    st.add_process(6, pid=4242, used=1 << 30, sm_util=75, mem_util=40)
    [s] = nv.nvmlDeviceGetProcessUtilization(h(6), 0)
    assert (s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil) == (4242, 75, 40, 0, 0)
    raises(nv.NVML_ERROR_NOT_FOUND, nv.nvmlDeviceGetProcessUtilization, h(6), s.timeStamp)
    st.remove_process(6, 4242)


# ---------------------------------------------------------------- events (in-process)


@check
def event_set_lifecycle(st: NodeDir, node: Node) -> None:
    supported = nv.nvmlDeviceGetSupportedEventTypes(h(4))
    assert supported & nv.nvmlEventTypeXidCriticalError
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h(4), nv.nvmlEventTypeXidCriticalError, es)
    st.inject_xid(4, 48)
    data = nv.nvmlEventSetWait_v2(es, 1000)
    assert (nv.nvmlDeviceGetIndex(data.device), data.eventData) == (4, 48)
    assert data.eventType == nv.nvmlEventTypeXidCriticalError
    assert data.gpuInstanceId == 0xFFFFFFFF
    st.inject_xid(4, 31, gpu_instance=1, compute_instance=2)
    legacy = nv.c_nvmlEventData_t()
    assert raw("nvmlEventSetWait")(es, ctypes.byref(legacy), 1000) == nv.NVML_SUCCESS
    assert (legacy.eventData, legacy.gpuInstanceId, legacy.computeInstanceId) == (31, 1, 2)
    raises(nv.NVML_ERROR_TIMEOUT, nv.nvmlEventSetWait, es, 10)
    nv.nvmlEventSetFree(es)


@check
def recovery_action_follows_faults(st: NodeDir, node: Node) -> None:
    field = nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

    def action(i: int) -> int:
        (value,) = nv.nvmlDeviceGetFieldValues(h(i), [field])
        assert value.nvmlReturn == nv.NVML_SUCCESS
        return value.value.uiVal

    assert action(1) == nv.NVML_GPU_RECOVERY_ACTION_NONE
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h(1), nv.nvmlEventTypeGpuRecoveryAction, es)
    st.inject_xid(1, 13)  # an application fault: the driver asks for nothing
    st.inject_xid(1, 48)  # double-bit ECC: a GPU reset
    assert action(1) == nv.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    e = nv.nvmlEventSetWait_v2(es, 1000)
    assert (e.eventType, e.eventData) == (
        nv.nvmlEventTypeGpuRecoveryAction, nv.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
    )  # fmt: skip
    st.recover(1)
    assert action(1) == nv.NVML_GPU_RECOVERY_ACTION_NONE
    e = nv.nvmlEventSetWait_v2(es, 1000)  # recovery is an event, not something to poll
    assert (e.eventType, e.eventData) == (nv.nvmlEventTypeGpuRecoveryAction, 0)
    (other,) = nv.nvmlDeviceGetFieldValues(h(1), [nv.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL])
    assert other.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED
    nv.nvmlEventSetFree(es)


# ---------------------------------------------------------------- capabilities


@check
def capabilities_through_the_walk(st: NodeDir, node: Node) -> None:
    g = node.gpus[0]
    rec = walk.walk(0)  # every read-only call, the capabilities among them
    nv.nvmlShutdown()  # walk initialised once more
    ok = {k: a.get("value") for k, a in rec.items() if a["rc"] == "SUCCESS"}
    assert ok["nvmlDeviceGetSupportedMemoryClocks"] == list(g.mem_clocks)
    assert ok["nvmlDeviceGetSupportedPerformanceStates"] == list(g.pstates)
    graphics = ok["nvmlDeviceGetSupportedGraphicsClocks(maxmem)"]
    assert graphics[:2] == [g.max_clocks[0], g.max_clocks[0] - g.gfx_clock_step]
    for m in g.mig_profiles:
        info = ok[f"nvmlDeviceGetGpuInstanceProfileInfoV({m.profile})"]
        assert (info["id"], info["name"], info["memorySizeMB"]) == (m.id, m.name, m.memory_mib)
        places = ok[f"nvmlDeviceGetGpuInstancePossiblePlacements(id{m.id})"]
        assert places == [[s, m.placement_size] for s in m.placement_starts]
        assert ok[f"nvmlDeviceGetGpuInstanceRemainingCapacity(id{m.id})"] == m.instance_count
    assert ok["nvmlDeviceGetSupportedEventTypes"] == g.event_types
    assert ok["field[188]"] == {"type": nv.NVML_VALUE_TYPE_UNSIGNED_INT, "v": g.power_max_mw}
    assert rec["field[0]"]["rc"] == "NVML_ERROR_INVALID_ARGUMENT"
    assert ok["nvmlDeviceGetMarginTemperature"] == g.temp_gpu_max - g.temp_gpu
    assert ok["nvmlDeviceGetGspFirmwareVersion"] == node.driver_version
    assert ok["nvmlSystemGetConfComputeCapabilities"]["gpusCaps"] == 1
    assert rec["nvmlDeviceGetMigDeviceHandleByIndex(0)"]["rc"] == "NVML_ERROR_NOT_FOUND"
    assert rec["nvmlDeviceGetGpuInstanceId"]["rc"] == "NVML_ERROR_INVALID_ARGUMENT"
    assert rec["nvmlDeviceGetMemoryErrorCounter(0,0,0)"]["rc"] == "NVML_ERROR_NOT_SUPPORTED"
    assert ok["nvmlDeviceGetViolationStatus(0)"]["violationTime"] == 0


# ---------------------------------------------------------------- MIG (tests/fakenvml/test_mig.py)


@check
def mig_lifecycle(st: NodeDir, node: Node) -> None:
    """Every MIG call once, on the last GPU, which is left with MIG disabled again."""
    g = h(len(node.gpus) - 1)
    assert nv.nvmlDeviceSetMigMode(g, 1) == nv.NVML_SUCCESS  # bare metal: the driver resets it
    mig.configure(st, len(node.gpus) - 1, "all-enabled")
    gi_id = nv.nvmlDeviceGetGpuInstanceProfileInfo(g, nv.NVML_GPU_INSTANCE_PROFILE_7_SLICE).id
    v1 = nv.c_nvmlGpuInstanceProfileInfo_t()  # go-nvml's (NVIDIA's plugin, GFD) version
    fn = raw("nvmlDeviceGetGpuInstanceProfileInfo")
    assert fn(g, nv.NVML_GPU_INSTANCE_PROFILE_7_SLICE, ctypes.byref(v1)) == 0 and v1.id == gi_id
    place = nv.c_nvmlGpuInstancePlacement_t(0, 8)
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(g, gi_id, ctypes.byref(place))
    nv.nvmlGpuInstanceDestroy(gi)
    gi = nv.nvmlDeviceCreateGpuInstance(g, gi_id)
    assert nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(g, 0)).id == 0
    array, count = (nv.c_nvmlGpuInstance_t * 1)(), ctypes.c_uint(1)
    nv.nvmlDeviceGetGpuInstances(g, gi_id, array, ctypes.byref(count))
    assert count.value == 1
    ci7 = nv.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
    shared = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    assert nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci7, shared).sliceCount == 7
    assert nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci7, shared, 1).sliceCount == 7
    assert nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, ci7) == 1
    places = (nv.c_nvmlComputeInstancePlacement_t * 1)()
    n = ctypes.c_uint(1)
    fn = raw("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
    assert fn(gi, ci7, places, ctypes.byref(n)) == nv.NVML_SUCCESS and places[0].size == 7
    ci = nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, ci7, ctypes.byref(places[0]))
    nv.nvmlComputeInstanceDestroy(ci)
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci7)
    assert nv.nvmlComputeInstanceGetInfo(ci).id == 0
    assert (
        raw("nvmlComputeInstanceGetInfo")(ci, ctypes.byref(nv.c_nvmlComputeInstanceInfo_t())) == 0
    )
    cis, n = (nv.c_nvmlComputeInstance_t * 1)(), ctypes.c_uint(1)
    nv.nvmlGpuInstanceGetComputeInstances(gi, ci7, cis, ctypes.byref(n))
    assert n.value == 1 and nv.nvmlComputeInstanceGetInfo(
        nv.nvmlGpuInstanceGetComputeInstanceById(gi, 0)).id == 0  # fmt: skip
    d = nv.nvmlDeviceGetMigDeviceHandleByIndex(g, 0)
    assert nv.nvmlDeviceGetAttributes(d).computeInstanceSliceCount == 7
    attrs = nv.c_nvmlDeviceAttributes()  # v1, which nvidia-ml-py no longer calls
    assert raw("nvmlDeviceGetAttributes")(d, ctypes.byref(attrs)) == 0 and attrs.memorySizeMB
    mig.configure(st, len(node.gpus) - 1, "all-disabled")


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("fn", CHECKS, ids=lambda f: f.__name__)
def test_api(fn: Check, nvml: object, state: NodeDir) -> None:
    fn(state, state.node())


def test_every_implemented_function_is_exercised(nvml: object, state: NodeDir) -> None:
    CALLED.clear()
    nv._nvmlGetFunctionPointer_cache.clear()  # re-resolve, so every use is recorded
    for fn in CHECKS:
        fn(state, state.node())
    nv.nvmlShutdown()  # and the fixture's init/shutdown pair
    nv.nvmlInit()
    implemented = set(IMPLEMENTED.read_text().split())
    assert len(implemented) >= 100
    missing = implemented - CALLED
    assert not missing, f"implemented but never called through pynvml: {sorted(missing)}"
