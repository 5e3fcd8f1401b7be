"""Telemetry that moves: `fakenvml set` and `fakenvml process` reach processes that already
initialised NVML, at their next call, through nvidia-ml-py."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pynvml as nv
import pytest

from fakenvml import cli
from fakenvml.journal import JOURNAL_FILE, Kind
from fakenvml.node import NodeDir
from tests.fakenvml.conftest import subprocess_env

FI_MEMORY_TEMP, FI_TOTAL_ENERGY, FI_POWER_INSTANT = 82, 83, 186


def test_set_values_reach_an_initialised_process(nvml: object, state: NodeDir) -> None:
    h3 = nv.nvmlDeviceGetHandleByIndex(3)
    assert nv.nvmlDeviceGetTemperature(h3, nv.NVML_TEMPERATURE_GPU) != 88
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h3) == nv.nvmlClocksEventReasonGpuIdle
    state.set_sensors(3, [
        "temperature=88", "mem-temperature=71C", "power=350W", "util=90", "mem-util=40%",
        "graphics-clock=1755MHz", "sm-clock=1755", "mem-clock=1593", "video-clock=1500",
        "pstate=P2",
    ])  # fmt: skip
    assert nv.nvmlDeviceGetTemperature(h3, nv.NVML_TEMPERATURE_GPU) == 88
    assert nv.nvmlDeviceGetPowerUsage(h3) == 350_000
    util = nv.nvmlDeviceGetUtilizationRates(h3)
    assert (util.gpu, util.memory) == (90, 40)
    clocks = [nv.nvmlDeviceGetClockInfo(h3, t) for t in range(4)]
    assert clocks == [1755, 1755, 1593, 1500]
    assert nv.nvmlDeviceGetClock(h3, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_ID_CURRENT) == 1755
    assert nv.nvmlDeviceGetPerformanceState(h3) == 2
    # Busy: no longer idle, until reasons are set explicitly.
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h3) == 0
    state.set_sensors(3, ["clock-reasons=sw-power-cap+hw-slowdown"])
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h3) == 0x4 | 0x8
    fields = nv.nvmlDeviceGetFieldValues(h3, [FI_POWER_INSTANT, FI_MEMORY_TEMP])
    assert [f.nvmlReturn for f in fields] == [0, 0]
    assert (fields[0].value.uiVal, fields[1].value.uiVal) == (350_000, 71)
    # Other GPUs keep the profile's readings.
    h0 = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetPowerUsage(h0) == state.node().gpus[0].power_usage_mw


def test_idle_puts_a_sensor_back_to_the_profile(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(1)
    before = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    state.set_sensors("all", ["temperature=77"])
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == 77
    state.set_sensors(1, ["temperature=idle"])
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == before
    assert nv.nvmlDeviceGetTemperature(nv.nvmlDeviceGetHandleByIndex(2), 0) == 77


def expected_triangle(start: int, end: int, period_s: float, t0_ns: int, t_ns: int) -> float:
    phase = ((t_ns - t0_ns) / 1e9 / period_s) % 1
    return start + (end - start) * (2 * phase if phase <= 0.5 else 2 - 2 * phase)


def test_a_wave_is_a_deterministic_triangle(nvml: object, state: NodeDir) -> None:
    (rec,) = state.set_sensors(0, ["temperature=70..90/400ms"])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    seen = []
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline:
        before = time.monotonic_ns()
        value = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        after = time.monotonic_ns()
        at = (before, after)
        lo, hi = sorted(expected_triangle(70, 90, 0.4, rec.monotonic_ns, t) for t in at)
        assert lo - 1 <= value <= hi + 1, (value, lo, hi)
        seen.append(value)
        time.sleep(0.005)
    assert min(seen) <= 72 and max(seen) >= 88 and min(seen) >= 70 and max(seen) <= 90


def test_energy_grows_at_the_power_set(nvml: object, state: NodeDir) -> None:
    state.set_sensors(2, ["power=500W"])
    h = nv.nvmlDeviceGetHandleByIndex(2)
    t0, e0 = time.monotonic(), nv.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.3)
    t1, e1 = time.monotonic(), nv.nvmlDeviceGetTotalEnergyConsumption(h)
    watts = (e1 - e0) / 1000 / (t1 - t0)  # mJ -> J per second
    assert 450 < watts < 550
    (field,) = nv.nvmlDeviceGetFieldValues(h, [FI_TOTAL_ENERGY])
    assert field.nvmlReturn == 0 and field.value.ullVal >= e1


def test_processes_are_listed_and_count_in_used_memory(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    used0 = nv.nvmlDeviceGetMemoryInfo(h).used
    v2_used0 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    state.add_process(0, pid=4242, used=2 << 30)
    state.add_process(0, pid=77, used=512 << 20, kind="graphics")
    compute = nv.nvmlDeviceGetComputeRunningProcesses(h)  # _v3 in nvidia-ml-py
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [(4242, 2 << 30)]
    assert compute[0].gpuInstanceId == 0xFFFFFFFF
    graphics = nv.nvmlDeviceGetGraphicsRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(77, 512 << 20)]
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
               "nvmlDeviceGetGraphicsRunningProcesses_v2"):  # fmt: skip
        assert len(_raw_processes(fn, h)) == 1
    extra = (2 << 30) + (512 << 20)
    assert nv.nvmlDeviceGetMemoryInfo(h).used == used0 + extra
    assert nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used == v2_used0 + extra
    state.remove_process(0, 4242)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert nv.nvmlDeviceGetMemoryInfo(h).used == used0 + (512 << 20)
    assert state.processes() == {0: {77: 512 << 20}}


class ProcessV1(ctypes.Structure):  # nvmlProcessInfo_v1_t
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessV2(ctypes.Structure):  # nvmlProcessInfo_v2_t
    _fields_ = [*ProcessV1._fields_, ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]  # fmt: skip


def _raw_processes(fn: str, handle: object) -> list[tuple[int, int]]:
    """Any version of the list by its C name: ask the count, then fill."""
    c_fn = nv._nvmlGetFunctionPointer(fn)
    struct = ProcessV2 if fn.endswith("_v2") else ProcessV1
    count = ctypes.c_uint(0)
    assert c_fn(handle, ctypes.byref(count), None) == nv.NVML_ERROR_INSUFFICIENT_SIZE
    buf = (struct * count.value)()
    assert c_fn(handle, ctypes.byref(count), buf) == 0
    return [(buf[i].pid, buf[i].usedGpuMemory) for i in range(count.value)]


CHILD = """
import json, sys, pynvml as nv
from fakenvml import library
library.preload()
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(5)
print(json.dumps(nv.nvmlDeviceGetTemperature(h, 0)), flush=True)
sys.stdin.readline()  # the parent sets values meanwhile
print(json.dumps([nv.nvmlDeviceGetTemperature(h, 0), nv.nvmlDeviceGetPowerUsage(h),
                  [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]]), flush=True)
"""


def test_another_process_sees_them_without_reinit(state: NodeDir, fake_library: object) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=subprocess_env(state.path),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        assert json.loads(child.stdout.readline()) != 91  # type: ignore[union-attr]
        state.set_sensors(5, ["temperature=91", "power=123W"])
        state.add_process(5, pid=31337, used=1 << 30)
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    assert json.loads(out) == [91, 123_000, [31337]]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["set", "0", "bogus=1"], "FIELD one of temperature"),
        (["set", "0", "temperature"], "expected FIELD=VALUE"),
        (["set", "0", "power=-5W"], "cannot be negative"),
        (["set", "0", "util=101"], "0-100%"),
        (["set", "0", "temperature=70..90"], "FROM..TO/PERIOD"),
        (["set", "0", "temperature=70..90/0s"], "at least 1 ms"),
        (["set", "0", "temperature=70..90/-3s"], "cannot be negative"),
        (["set", "0", "graphics-clock=9999"], "above GPU 0's max"),
        (["set", "0", "pstate=P5"], "has only P"),
        (["set", "0", "pstate=2..3/1s"], "P-state"),
        (["set", "0", "clock-reasons=slow"], "is not one of"),
        (["set", "0", "power=3furlongs"], "expected watts"),
        (["set", "0", "temperature=80", "temperature=81"], "given twice"),
        (["set", "9", "temperature=80"], "not in inventory"),
        (["process", "add", "0", "--pid=-1", "--used", "1GiB"], "expected a number >= 0"),
        (["process", "add", "0", "--pid", "5", "--used=-1GiB"], "expected a size"),
        (["process", "add", "0", "--pid", "5", "--used", "999TiB"], "free memory"),
        (["process", "remove", "0", "--pid", "5"], "no process 5"),
        (["process", "add", "0", "--pid", "5", "--used", "1GiB", "--sm-util", "101"], "0 to 100"),
        (["process", "add", "0", "--pid", "5", "--used", "1GiB", "--mem-util=-1"], ">= 0"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    state: NodeDir, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    journal = state.path / JOURNAL_FILE
    before = journal.read_bytes()
    assert cli.main([*argv, "--state-dir", str(state.path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("fakenvml: error: ") and err.count("\n") == 1 and message in err, err
    assert journal.read_bytes() == before


def test_the_cli_sets_and_events_show_it(
    state: NodeDir, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--state-dir", str(state.path)]
    assert cli.main(["set", "3", "temperature=70..90/30s", "power=350W", *d]) == 0
    assert cli.main(["process", "add", "1", "--pid", "4242", "--used", "2GiB", *d]) == 0
    assert cli.main(["process", "add", "1", "--pid", "7", "--used", "1GiB", "--sm-util", "75",
                     "--mem-util", "40", *d]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli.main(["events", *d]) == 0
    out = capsys.readouterr().out
    assert "set temperature=70..90C/30s" in out and "set power=350W" in out
    assert "process-add pid 4242 2048 MiB\n" in out
    assert "process-add pid 7 1024 MiB, sm 75%, mem 40%" in out
    assert [r.kind for r in state.events()] == [Kind.SET, Kind.SET] + [Kind.PROCESS_ADD] * 2
    assert state.faulted() == set()  # telemetry is not a fault


def test_compute_mode_is_set_by_nvml_and_by_the_cli(
    nvml: object, state: NodeDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvmlDeviceSetComputeMode writes the node's journal (every process reads it), as
    `fakenvml set N compute-mode=...` does; a mode NVML has not is refused, a MIG device
    has none of its own."""
    h = nv.nvmlDeviceGetHandleByIndex(2)
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_DEFAULT
    nv.nvmlDeviceSetComputeMode(h, nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByIndex(0)) == 0
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceSetComputeMode(h, 4)
    d = ["--state-dir", str(state.path)]
    assert cli.main(["set", "2", "compute-mode=prohibited", *d]) == 0
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_PROHIBITED
    capsys.readouterr()
    assert cli.main(["events", *d]) == 0
    out = capsys.readouterr().out
    assert "set compute-mode=exclusive-process" in out and "set compute-mode=prohibited" in out
    assert cli.main(["set", "2", "compute-mode=shared", *d]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "compute-mode=shared: expected default, prohibited or exclusive-process" in err
