"""MIG through NVML (nvidia-ml-py) and the control plane: mode pending until a reset,
GPU and compute instances with and without placement, MIG devices and their identity,
changes seen by other processes, faults scoped to a slice."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Callable

import pynvml as nv
import pytest

from fakenvml import mig
from fakenvml.errors import FakeNvmlError
from fakenvml.node import NodeDir
from tests.fakenvml.conftest import subprocess_env

P_1G, P_2G, P_3G, P_7G = (
    nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    nv.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    nv.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
)
CI_1 = nv.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
SHARED = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


def enable(state: NodeDir, gpu: int = 0) -> None:
    plan = mig.Plan(state)
    m = plan.gpu(gpu)
    plan.mode(m, True)
    plan.reset(m)
    plan.write()


def test_on_ampere_enabling_is_pending_until_a_gpu_reset(
    fake_library: object, make_state: Callable[..., NodeDir]
) -> None:
    """Ampere toggles MIG mode only through a GPU reset (NVIDIA's DRA driver builds on it):
    RESET_REQUIRED, the mode current after `fakenvml reset`."""
    state = make_state({"gpus": [{"profile": "A100-SXM4-80GB", "count": 1}]})
    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
        on = nv.NVML_DEVICE_MIG_ENABLE
        assert nv.nvmlDeviceSetMigMode(h, on) == nv.NVML_ERROR_RESET_REQUIRED
        assert nv.nvmlDeviceGetMigMode(h) == [0, 1]  # pending
        assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        with pytest.raises(nv.NVMLError_NotSupported):  # instances need MIG enabled now
            nv.nvmlDeviceCreateGpuInstance(h, 19)
        plan = mig.Plan(state)
        plan.reset(plan.gpu(0))
        plan.write()
        assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
        assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    finally:
        nv.nvmlShutdown()


def test_hopper_toggles_mig_mode_at_once_on_an_idle_gpu(nvml: object, state: NodeDir) -> None:
    """Hopper and later toggle MIG mode without a reset; a GPU that is not idle answers
    IN_USE (nvml.h), its mode pending. Asking for the mode it has changes nothing."""
    h = nv.nvmlDeviceGetHandleByIndex(0)
    on, off = nv.NVML_DEVICE_MIG_ENABLE, nv.NVML_DEVICE_MIG_DISABLE
    assert nv.nvmlDeviceSetMigMode(h, on) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    gi = nv.nvmlDeviceCreateGpuInstance(h, 19)
    gid = nv.nvmlGpuInstanceGetInfo(gi).id
    assert nv.nvmlDeviceSetMigMode(h, on) == nv.NVML_SUCCESS  # already on
    assert nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, gid)).id == gid
    nv.nvmlGpuInstanceDestroy(gi)  # as NVIDIA's DRA driver does before it turns MIG off
    assert nv.nvmlDeviceSetMigMode(h, off) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    busy = nv.nvmlDeviceGetHandleByIndex(1)
    state.add_process(1, pid=4242, used=100 << 20)
    assert nv.nvmlDeviceSetMigMode(busy, on) == nv.NVML_ERROR_IN_USE
    assert nv.nvmlDeviceGetMigMode(busy) == [0, 1]


def test_mig_mode_stays_on_while_a_gpu_instance_exists(nvml: object, state: NodeDir) -> None:
    """Turning MIG off with a GPU instance left succeeds and changes nothing: the instance,
    its MIG device and both modes stay (NVIDIA's DRA driver v0.4.1 asks after every
    DynamicMIG release, whatever else the GPU holds); once none is left it goes."""
    h = nv.nvmlDeviceGetHandleByIndex(0)
    on, off = nv.NVML_DEVICE_MIG_ENABLE, nv.NVML_DEVICE_MIG_DISABLE
    assert nv.nvmlDeviceSetMigMode(h, on) == nv.NVML_SUCCESS
    kept, gone = nv.nvmlDeviceCreateGpuInstance(h, 19), nv.nvmlDeviceCreateGpuInstance(h, 19)
    kept_id = nv.nvmlGpuInstanceGetInfo(kept).id
    nv.nvmlGpuInstanceCreateComputeInstance(
        kept, nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(kept, CI_1, SHARED).id
    )
    nv.nvmlGpuInstanceDestroy(gone)
    assert nv.nvmlDeviceSetMigMode(h, off) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, kept_id)).id == kept_id
    assert nv.nvmlDeviceGetGpuInstanceId(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)) == kept_id
    assert [d.gi for d in mig.devices(state)] == [kept_id]
    ci = nv.nvmlGpuInstanceGetComputeInstanceById(kept, 0)
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(kept)
    assert nv.nvmlDeviceSetMigMode(h, off) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]


def test_a_board_without_mig_says_not_supported(
    fake_library: object, make_state: Callable[..., NodeDir]
) -> None:
    t4 = make_state({"gpus": [{"profile": "T4", "count": 1}]})
    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(nv.NVMLError_NotSupported):
            nv.nvmlDeviceGetMigMode(h)
    finally:
        nv.nvmlShutdown()
    with pytest.raises(FakeNvmlError, match="does not support MIG"):
        mig.configure(t4, 0, "all-enabled")


def gpu_instances(h: object, profile_id: int) -> list[int]:
    """The ids of a profile's GPU instances (nvidia-ml-py takes the array and count)."""
    array, count = (nv.c_nvmlGpuInstance_t * 8)(), ctypes.c_uint(8)
    nv.nvmlDeviceGetGpuInstances(h, profile_id, array, ctypes.byref(count))
    return sorted(nv.nvmlGpuInstanceGetInfo(array[i]).id for i in range(count.value))


def test_gpu_instances_with_and_without_placement(nvml: object, state: NodeDir) -> None:
    enable(state)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, P_3G)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id) == 2
    placement = nv.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 4, 4
    # nvidia-ml-py passes the placement on as given: the C call takes a pointer.
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
    got = nv.nvmlGpuInstanceGetInfo(gi)
    assert (got.id, got.profileId, got.placement.start, got.placement.size) == (2, 9, 4, 4)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id) == 1
    # The same placement again overlaps; without one, the first free fits at 0 (id 1).
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
    second = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceCreateGpuInstance(h, info.id))
    assert (second.id, second.placement.start) == (1, 0)
    # A 7-slice instance no longer fits anywhere.
    p7 = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, P_7G)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, p7.id) == 0
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlDeviceCreateGpuInstance(h, p7.id)
    assert gpu_instances(h, info.id) == [1, 2]
    assert nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, 2)).id == 2
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetGpuInstanceById(h, 7)
    nv.nvmlGpuInstanceDestroy(gi)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id) == 1


def test_compute_instances_and_the_mig_devices_they_make(nvml: object, state: NodeDir) -> None:
    enable(state)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    parent_uuid = nv.nvmlDeviceGetUUID(h)
    gi = nv.nvmlDeviceCreateGpuInstance(h, nv.nvmlDeviceGetGpuInstanceProfileInfo(h, P_3G).id)
    with pytest.raises(nv.NVMLError_NotFound):  # a GPU instance alone is no MIG device
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    one = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, CI_1, SHARED)
    assert (one.sliceCount, one.instanceCount, one.multiprocessorCount) == (1, 3, 20)
    assert nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, one.id) == 3
    cis = [nv.nvmlGpuInstanceCreateComputeInstance(gi, one.id) for _ in range(3)]
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlGpuInstanceCreateComputeInstance(gi, one.id)
    info = nv.nvmlComputeInstanceGetInfo(cis[2])
    assert (info.id, info.placement.start, info.placement.size) == (2, 2, 1)

    devices = [nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    for k, d in enumerate(devices):
        assert nv.nvmlDeviceIsMigDeviceHandle(d)
        assert (nv.nvmlDeviceGetGpuInstanceId(d), nv.nvmlDeviceGetComputeInstanceId(d)) == (1, k)
        uuid = nv.nvmlDeviceGetUUID(d)
        assert uuid == mig.mig_uuid(parent_uuid, 1, k) and uuid.startswith("MIG-")
        assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByUUID(uuid)) == uuid
        assert (
            nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(d)) == parent_uuid
        )
        assert nv.nvmlDeviceGetName(d) == "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"
        attrs = nv.nvmlDeviceGetAttributes(d)
        assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount) == (3, 1)
        assert attrs.memorySizeMB == 40448 and attrs.multiprocessorCount == 20
        assert nv.nvmlDeviceGetMemoryInfo(d).total == 40448 << 20
    assert not nv.nvmlDeviceIsMigDeviceHandle(h)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetAttributes(h)  # a whole GPU, as the H100 capture answers
    with pytest.raises(nv.NVMLError_InUse):  # compute instances first, as the driver asks
        nv.nvmlGpuInstanceDestroy(gi)
    # Python's view of the same layout names the same devices.
    assert [(x.gi, x.ci, x.profile, x.uuid) for x in mig.devices(state)] == [
        (1, k, "1c.3g.40gb", mig.mig_uuid(parent_uuid, 1, k)) for k in range(3)
    ]


def test_named_configs_and_another_process_sees_them(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(1)
    mig.configure(state, 1, "all-1g.10gb")
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    names = {nv.nvmlDeviceGetName(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)) for i in range(7)}
    assert names == {"NVIDIA H100 80GB HBM3 MIG 1g.10gb"}
    gis = sorted(nv.nvmlDeviceGetGpuInstanceId(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
                 for i in range(7))  # fmt: skip
    assert gis == list(range(7, 14))  # the eighths of the slice tree
    code = (
        "from fakenvml import library; library.preload(); "
        "import pynvml as nv; nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(1); "
        "print(nv.nvmlDeviceGetMigMode(h), nv.nvmlDeviceGetUUID("
        "nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 6)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(state.path), timeout=60, check=True).stdout  # fmt: skip
    assert out.split(" ", 2)[:2] == ["[1,", "1]"] and mig.devices(state)[6].uuid in out
    # A balanced layout replaces it: two 1g, one 2g, one 3g.
    mig.configure(state, 1, "all-balanced")
    got = sorted(x.profile for x in mig.devices(state))
    assert got == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    mig.configure(state, 1, "all-disabled")
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0] and mig.devices(state) == []


def test_refusals_write_nothing(state: NodeDir) -> None:
    before = list(state.events())
    for gpu, config, why in [
        (0, "3g.40gb,3g.40gb,3g.40gb", "already|overlap|room"),
        (0, "all-5g.50gb", "no MIG profile '5g.50gb'"),
        (0, "all-sorts", "no MIG profile 'sorts'"),
        (9, "all-1g.10gb", "GPU '9' not in inventory"),
    ]:
        with pytest.raises(FakeNvmlError, match=why):
            mig.configure(state, gpu, config)
    plan = mig.Plan(state)
    with pytest.raises(FakeNvmlError, match="MIG is not enabled on GPU 0"):
        plan.create_gi(plan.gpu(0), "1g.10gb")
    assert list(state.events()) == before


def test_a_refused_change_gives_the_librarys_reason(state: NodeDir) -> None:
    """The control plane plans with the library's rules (fakenvml_mig_change), change by
    change: each refusal is the library's reason, worded, and nothing is written."""
    before = list(state.events())
    plan = mig.Plan(state)
    m = plan.gpu(0)
    plan.mode(m, True)
    plan.reset(m)
    refusals = {
        "slices 4-7 overlap GPU instance 2": lambda: plan.create_gi(m, "3g.40gb", 4),
        r"3g.40gb cannot start at slice 3 \(placements": lambda: plan.create_gi(m, "3g.40gb", 3),
        "GPU 0 has its 1 4g.40gb already": lambda: plan.create_gi(m, "4g.40gb", 0),
        "GPU 0 has too few compute slices left for": lambda: plan.create_gi(m, "1g.10gb", 0),
        "no room for 1g.10gb on GPU 0": lambda: plan.create_gi(m, "1g.10gb"),
        "a 4-slice compute instance does not fit a 3g": lambda: plan.create_ci(m, 2, 4),
        "1-slice compute instance cannot start at slice 3": lambda: plan.create_ci(m, 2, 1, 3),
        "slices 1-1 overlap compute instance 0": lambda: plan.create_ci(m, 2, 1, 1),
        "GPU 0 has no compute instance 2/5": lambda: plan.destroy_ci(m, 2, 5),
        "GPU 0 has no GPU instance 9": lambda: plan.destroy_gi(m, 9),
    }
    assert plan.create_gi(m, "3g.40gb", 4) == 2
    for why in list(refusals)[:2]:
        with pytest.raises(FakeNvmlError, match=why):
            refusals[why]()
    assert (plan.create_gi(m, "4g.40gb"), plan.create_ci(m, 2, slices=1, start=1)) == (1, 0)
    for why in list(refusals)[2:]:
        with pytest.raises(FakeNvmlError, match=why):
            refusals[why]()
    assert sorted(m.gis) == [1, 2] and list(m.gis[2].cis) == [0]  # refusals changed nothing
    assert list(state.events()) == before  # and the plan was never written


def test_an_xid_on_one_slice_names_its_instances_in_the_event(nvml: object, state: NodeDir) -> None:
    mig.configure(state, 0, "all-1g.10gb")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
    try:
        target = mig.devices(state)[3]
        state.inject_xid(0, 79, target.gi, target.ci)
        e = nv.nvmlEventSetWait_v2(es, 5000)
        assert (e.eventData, e.gpuInstanceId, e.computeInstanceId) == (79, target.gi, target.ci)
    finally:
        nv.nvmlEventSetFree(es)


def test_malformed_mig_records_are_ignored(nvml: object, state: NodeDir) -> None:
    """Records another writer could have put there: each is checked as the driver checks
    the call, and one it would refuse changes nothing (and crashes nothing)."""
    from fakenvml.journal import Kind

    enable(state)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    # (kind, gpu, data, arg0, arg1, data2); GI_CREATE: data start, arg0 id, arg1 profile id
    bad = [
        (Kind.GI_CREATE, 0, 0, 7, 99, 0),  # no profile 99
        (Kind.GI_CREATE, 0, 0, 5, 9, 0),  # 3g at slice 0 is GPU instance 1, not 5
        (Kind.GI_CREATE, 0, 3, 2, 9, 0),  # 3g cannot start at slice 3
        (Kind.CI_CREATE, 0, 0, 14, 0, 0),  # no GPU instance 14
        (Kind.CI_DESTROY, 0, 0, 200, 200, 0),  # ids out of range
        (Kind.GI_DESTROY, 0, 0, 99, 0, 0),
        (Kind.MIG_MODE, 99, 0, 0, 0, 0),  # no GPU 99
    ]
    state.write_entries(bad)
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert gpu_instances(h, 9) == []
    assert mig.devices(state) == []


def test_event_sets_on_mig_devices_get_their_slice_only(nvml: object, state: NodeDir) -> None:
    """A set that registered MIG device A gets A's Xid, named as A; a set on MIG device B
    does not (its first event is a later whole-GPU Xid, which reaches every slice); the
    parent GPU's set gets both, as real drivers deliver them."""
    mig.configure(state, 0, "all-1g.10gb")
    a, b = mig.devices(state)[1], mig.devices(state)[4]
    sets = {}
    for name, handle in (("a", nv.nvmlDeviceGetHandleByUUID(a.uuid)),
                         ("b", nv.nvmlDeviceGetHandleByUUID(b.uuid)),
                         ("gpu", nv.nvmlDeviceGetHandleByIndex(0))):  # fmt: skip
        sets[name] = nv.nvmlEventSetCreate()
        nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, sets[name])
    try:
        state.inject_xid(0, 43, a.gi, a.ci)
        state.inject_xid(0, 13)  # no instance named: the whole GPU
        got = {n: [nv.nvmlEventSetWait_v2(es, 5000) for _ in range(2 if n != "b" else 1)]
               for n, es in sets.items()}  # fmt: skip
        assert [(e.eventData, nv.nvmlDeviceGetUUID(e.device)) for e in got["a"]] == [
            (43, a.uuid), (13, a.uuid)]  # fmt: skip
        assert [(e.eventData, nv.nvmlDeviceGetUUID(e.device)) for e in got["b"]] == [(13, b.uuid)]
        assert [e.eventData for e in got["gpu"]] == [43, 13]
        with pytest.raises(nv.NVMLError_Timeout):
            nv.nvmlEventSetWait_v2(sets["b"], 50)
    finally:
        for es in sets.values():
            nv.nvmlEventSetFree(es)


def test_a_mig_device_set_reports_its_gpu_lost(nvml: object, state: NodeDir) -> None:
    mig.configure(state, 0, "all-1g.10gb")
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(
        nv.nvmlDeviceGetHandleByUUID(mig.devices(state)[0].uuid),
        nv.nvmlEventTypeXidCriticalError,
        es,
    )
    try:
        state.lose(0)
        with pytest.raises(nv.NVMLError_GpuIsLost):
            nv.nvmlEventSetWait_v2(es, 5000)
    finally:
        nv.nvmlEventSetFree(es)
