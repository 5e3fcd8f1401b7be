"""nvmlDeviceGetGpuFabricInfo and nvmlDeviceGetGpuFabricInfoV answer as the board family
and its wiring do: a Hopper or later GPU on an NVSwitch baseboard is registered with the
fabric manager (state COMPLETED, status SUCCESS, a cluster UUID and a clique shared by the
board's GPUs, a healthy fabric); one on no NVSwitch answers SUCCESS with the fabric state
NOT_SUPPORTED (what nvidia-smi prints as N/A, as the captured H100 in a VM did); older
families answer NOT_SUPPORTED."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pynvml as nv
import pytest

from fakenvml.node import NodeDir

COMPLETED, NOT_SUPPORTED = (
    nv.NVML_GPU_FABRIC_STATE_COMPLETED,
    nv.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
)
HEALTH_FIELDS = [  # (shift, width, the value every condition of a healthy fabric reads)
    (nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, 0x3,
     nv.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE),
    (nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY, 0x3,
     nv.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE),
    (nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, 0x3,
     nv.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE),
    (nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY, 0x3,
     nv.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE),
    (nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION, 0xF,
     nv.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE),
]  # fmt: skip


@contextmanager
def nvml_on(make_state: Callable[..., NodeDir], spec: dict, name: str = "node-a") -> Iterator[None]:
    make_state(spec, name)
    nv.nvmlInit()
    try:
        yield
    finally:
        nv.nvmlShutdown()


def fabric(i: int, version: int = 3) -> nv.c_nvmlGpuFabricInfo_v3_t:
    """GetGpuFabricInfoV (v2 or v3), or v1's GetGpuFabricInfo with version=1."""
    h = nv.nvmlDeviceGetHandleByIndex(i)
    if version == 1:
        info = nv.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        return info
    info = nv.c_nvmlGpuFabricInfo_v3_t() if version == 3 else nv.c_nvmlGpuFabricInfo_v2_t()
    nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    return info


def one(values: set) -> object:
    assert len(values) == 1, values
    return next(iter(values))


@pytest.mark.parametrize("profile", ["H100-SXM5-80GB", "H200", "B200"])
def test_hopper_and_later_on_an_nvswitch_board_are_registered(
    fake_library: object, make_state: Callable[..., NodeDir], profile: str
) -> None:
    with nvml_on(make_state, {"gpus": [{"profile": profile, "count": 8}],
                              "topology": {"nvlink": {"nvswitch": True}}}):  # fmt: skip
        infos = [fabric(i) for i in range(8)]
        assert {(f.state, f.status) for f in infos} == {(COMPLETED, nv.NVML_SUCCESS)}
        assert one({bytes(f.clusterUuid) for f in infos}) != bytes(16)
        assert one({f.cliqueId for f in infos}) != 0
        for shift, width, healthy in HEALTH_FIELDS:
            assert one({f.healthMask >> shift & width for f in infos}) == healthy
        assert one({f.healthSummary for f in infos}) == nv.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        v1, v2 = fabric(3, version=1), fabric(3, version=2)
        assert (bytes(v1.clusterUuid), v1.cliqueId, v1.state) == (
            bytes(infos[3].clusterUuid), infos[3].cliqueId, COMPLETED)  # fmt: skip
        assert (v2.version, v2.healthMask) == (nv.nvmlGpuFabricInfo_v2, infos[3].healthMask)


def test_each_baseboard_is_its_own_clique_of_the_node_cluster(
    fake_library: object, make_state: Callable[..., NodeDir]
) -> None:
    spec = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 16}],
            "topology": {"nvlink": {"nvswitch": True}}}  # fmt: skip
    with nvml_on(make_state, spec):
        infos = [fabric(i) for i in range(16)]
        a, b = one({f.cliqueId for f in infos[:8]}), one({f.cliqueId for f in infos[8:]})
        assert a != b  # two boards' GPUs do not reach each other over NVLink
        cluster = one({bytes(f.clusterUuid) for f in infos})
    with nvml_on(make_state, spec, "node-b"):
        assert bytes(fabric(0).clusterUuid) != cluster  # another node, another cluster
        assert fabric(0).cliqueId == a


@pytest.mark.parametrize(
    "spec",
    [
        {
            "gpus": [{"profile": "H100-SXM5-80GB", "count": 1}],
            "topology": {"nvlink": {"hidden": True}},
        },
        {"gpus": [{"profile": "H100-SXM5-80GB", "count": 4}]},  # HGX 4-GPU: direct links
        {"gpus": [{"profile": "H200", "count": 2}], "topology": {"nvlink": False}},
    ],
    ids=["h100-in-a-vm", "hgx-4-gpu", "no-nvlink"],
)
def test_hopper_on_no_nvswitch_answers_the_fabric_is_not_supported(
    fake_library: object, make_state: Callable[..., NodeDir], spec: dict
) -> None:
    with nvml_on(make_state, spec):
        for version in (1, 2, 3):
            f = fabric(0, version)
            assert (f.state, f.status, f.cliqueId, bytes(f.clusterUuid)) == (
                NOT_SUPPORTED, nv.NVML_SUCCESS, 0, bytes(16))  # fmt: skip
        f = fabric(0)
        assert (f.healthMask, f.healthSummary) == (
            0,
            nv.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
        )


@pytest.mark.parametrize("profile", ["A100-SXM4-80GB", "L40S", "T4"])
def test_families_before_hopper_have_no_fabric_call(
    fake_library: object, make_state: Callable[..., NodeDir], profile: str
) -> None:
    with nvml_on(make_state, {"gpus": [{"profile": profile, "count": 8}]}):
        for version in (1, 2, 3):
            with pytest.raises(nv.NVMLError_NotSupported):
                fabric(0, version)


def test_fabric_v_checks_its_version_and_writes_no_further(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    call = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")
    info = nv.c_nvmlGpuFabricInfo_v3_t()
    info.version = 0  # a caller that forgot it
    assert call(h, ctypes.byref(info)) == nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert call(h, None) == nv.NVML_ERROR_INVALID_ARGUMENT
    assert nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfo")(h, None) == 2
    # A v2 caller's buffer ends at healthMask: the byte after it is not the library's.
    buf = (ctypes.c_ubyte * (ctypes.sizeof(nv.c_nvmlGpuFabricInfo_v3_t) + 8))(*[0xAB] * 48)
    v2_size = ctypes.sizeof(nv.c_nvmlGpuFabricInfo_v2_t)
    ctypes.c_uint.from_buffer(buf).value = nv.nvmlGpuFabricInfo_v2
    assert call(h, ctypes.byref(buf)) == nv.NVML_SUCCESS
    assert bytes(buf[v2_size:]) == b"\xab" * (len(buf) - v2_size)
    assert buf[nv.c_nvmlGpuFabricInfo_v2_t.state.offset] == COMPLETED  # an unsigned char


def test_a_lost_gpu_answers_lost(nvml: object, state: NodeDir) -> None:
    state.lose(2)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        fabric(2)
    assert fabric(1).state == COMPLETED
