"""nvmlDeviceGetProcessUtilization samples the processes `fakenvml process add` put on a
GPU, in nvml.h's two-call pattern: NULL asks the size (INSUFFICIENT_SIZE and the count), a
buffer too small is told the same, and no sample newer than lastSeenTimeStamp is NOT_FOUND,
as a real driver answers a GPU with no processes (rust-nvml/nvml-wrapper issue #56)."""

from __future__ import annotations

import ctypes
import time

import pynvml as nv
import pytest

from fakenvml import mig
from fakenvml.node import NodeDir

NOT_FOUND, SIZE = nv.NVML_ERROR_NOT_FOUND, nv.NVML_ERROR_INSUFFICIENT_SIZE
PERIOD_US = 100_000  # the driver's sample period, as the capture's engine windows report


def raw(h: object, buf: object, count: int, since: int = 0) -> tuple[int, int]:
    n = ctypes.c_uint(count)
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    return fn(h, buf, ctypes.byref(n), ctypes.c_ulonglong(since)), n.value


def samples(h: object, since: int = 0) -> dict[int, tuple[int, int]]:
    """pid -> (SM %, memory %), through nvidia-ml-py's two calls."""
    return {s.pid: (s.smUtil, s.memUtil) for s in nv.nvmlDeviceGetProcessUtilization(h, since)}


def test_no_process_is_not_found_even_for_the_size_query(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert raw(h, None, 0) == (NOT_FOUND, 0)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)


def test_the_size_query_then_the_buffer(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(1)
    state.add_process(1, pid=11, used=1 << 30, sm_util=60, mem_util=20)
    state.add_process(1, pid=12, used=1 << 30, sm_util=5, mem_util=0)
    assert raw(h, None, 0) == (SIZE, 2)
    buf = (nv.c_nvmlProcessUtilizationSample_t * 4)()
    assert raw(h, buf, 1) == (SIZE, 2)  # too small: nothing written, the count again
    assert buf[0].pid == 0
    assert raw(h, buf, 4) == (nv.NVML_SUCCESS, 2)  # the count written back
    assert sorted((s.pid, s.smUtil, s.memUtil) for s in buf[:2]) == [(11, 60, 20), (12, 5, 0)]
    now_us = time.time_ns() // 1000
    assert all(now_us - 10 * PERIOD_US <= s.timeStamp <= now_us for s in buf[:2])
    assert raw(h, buf, 4)[0] == nv.NVML_SUCCESS and samples(h) == {11: (60, 20), 12: (5, 0)}
    assert nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")(
        h, buf, None, ctypes.c_ulonglong(0)) == nv.NVML_ERROR_INVALID_ARGUMENT  # fmt: skip


def test_processes_share_the_gpu_utilisation_unless_given_their_own(
    nvml: object, state: NodeDir
) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(2)
    state.add_process(2, pid=21, used=1 << 30)
    with pytest.raises(nv.NVMLError_NotFound):  # an idle GPU: its process used nothing
        samples(h)
    state.set_sensors("2", ["util=90", "mem-util=30"])
    assert samples(h) == {21: (90, 30)}
    state.add_process(2, pid=22, used=1 << 30, kind="graphics")
    state.add_process(2, pid=23, used=1 << 30, sm_util=10, mem_util=80)
    assert samples(h) == {21: (45, 15), 22: (45, 15), 23: (10, 80)}
    state.remove_process(2, 21)
    state.remove_process(2, 22)
    state.set_sensors("2", ["util=idle", "mem-util=idle"])
    assert samples(h) == {23: (10, 80)}
    state.add_process(2, pid=23, used=1 << 30, sm_util=0, mem_util=0)  # the same pid again
    with pytest.raises(nv.NVMLError_NotFound):
        samples(h)


def test_last_seen_time_stamp_returns_only_newer_samples(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(3)
    state.add_process(3, pid=31, used=1 << 30, sm_util=50, mem_util=50)
    [first] = nv.nvmlDeviceGetProcessUtilization(h, 0)
    deadline = time.monotonic() + 5

    def period() -> int:
        return (time.time_ns() // 1000) // PERIOD_US

    while period() == first.timeStamp // PERIOD_US:
        got = raw(h, None, 0, first.timeStamp)
        # Only a call that began and ended in the first sample's period must find nothing
        # newer (CI once read the next period's sample: it rolled over between the check
        # above and the call).
        if period() == first.timeStamp // PERIOD_US:
            assert got == (NOT_FOUND, 0)  # the same period
        assert time.monotonic() < deadline
        time.sleep(0.005)
    [later] = nv.nvmlDeviceGetProcessUtilization(h, first.timeStamp)
    assert later.timeStamp > first.timeStamp and later.timeStamp % PERIOD_US == 0
    assert raw(h, None, 0, later.timeStamp + 10 * PERIOD_US)[0] == NOT_FOUND  # future


def test_mig_enabled_gpus_do_not_answer(nvml: object, state: NodeDir) -> None:
    state.add_process(7, pid=71, used=1 << 30, sm_util=50, mem_util=50)
    mig.configure(state, 7, "all-enabled")
    with pytest.raises(nv.NVMLError_NotSupported):  # nvml.h: not supported under MIG
        samples(nv.nvmlDeviceGetHandleByIndex(7))
    mig.configure(state, 7, "all-disabled")
    assert samples(nv.nvmlDeviceGetHandleByIndex(7)) == {71: (50, 50)}


def test_a_lost_gpu_answers_lost(nvml: object, state: NodeDir) -> None:
    state.add_process(4, pid=41, used=1 << 30, sm_util=50, mem_util=50)
    state.lose(4)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        samples(nv.nvmlDeviceGetHandleByIndex(4))
