"""NVML failure knobs: `fakenvml fail|delay` make chosen calls answer chosen errors or
answer late, in processes that already loaded the library; `--clear` undoes them; and a
journal with records the library cannot use never crashes it."""

from __future__ import annotations

import ctypes
import re
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pynvml as nv
import pytest

from fakenvml import cli, knobs, library
from fakenvml.journal import JOURNAL_FILE, RECORD
from fakenvml.native.build import SRC
from fakenvml.node import NodeDir
from tests.fakenvml.conftest import subprocess_env

LOST, UNKNOWN, NOT_SUPPORTED = 15, 999, 3


def code(fn: object, *args: object) -> int:
    try:
        fn(*args)  # type: ignore[operator]
    except nv.NVMLError as e:
        return int(e.value)
    return 0


def test_a_call_fails_on_one_gpu_for_count_calls(nvml: object, state: NodeDir) -> None:
    h1, h2 = nv.nvmlDeviceGetHandleByIndex(1), nv.nvmlDeviceGetHandleByIndex(2)
    state.fail("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu=2, count=2)
    assert code(nv.nvmlDeviceGetMemoryInfo, h1) == 0
    assert [code(nv.nvmlDeviceGetMemoryInfo, h2) for _ in range(3)] == [LOST, LOST, 0]
    assert code(nv.nvmlDeviceGetUUID, h2) == 0  # only the function named


def test_a_name_without_version_covers_its_versions(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    state.fail("nvmlDeviceGetMemoryInfo_v2", "UNKNOWN")
    assert code(nv.nvmlDeviceGetMemoryInfo, h) == 0
    assert code(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2) == UNKNOWN
    state.clear_knobs()
    state.fail("nvmlDeviceGetMemoryInfo", "NO_PERMISSION")
    assert code(nv.nvmlDeviceGetMemoryInfo, h) == 4
    assert code(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2) == 4
    assert state.clear_knobs(delay=False, function="nvmlDeviceGetMemoryInfo")
    assert code(nv.nvmlDeviceGetMemoryInfo, h) == 0


def test_handle_lookups_and_stubs_fail_too(nvml: object, state: NodeDir) -> None:
    state.fail("nvmlDeviceGetHandleByIndex", "UNKNOWN", gpu=3)
    assert code(nv.nvmlDeviceGetHandleByIndex, 3) == UNKNOWN
    assert code(nv.nvmlDeviceGetHandleByIndex, 4) == 0
    lib = library.preload()
    count = ctypes.c_uint()
    assert lib.nvmlUnitGetCount(ctypes.byref(count)) == NOT_SUPPORTED  # a generated stub
    state.fail("nvmlUnitGetCount", "GPU_IS_LOST")
    assert lib.nvmlUnitGetCount(ctypes.byref(count)) == LOST
    state.clear_knobs()
    assert lib.nvmlUnitGetCount(ctypes.byref(count)) == NOT_SUPPORTED
    assert code(nv.nvmlDeviceGetHandleByIndex, 3) == 0


def test_a_count_is_not_renewed_by_reinit(nvml: object, state: NodeDir) -> None:
    state.fail("nvmlDeviceGetCount", "UNKNOWN", count=1)
    assert code(nv.nvmlDeviceGetCount) == UNKNOWN
    nv.nvmlShutdown()
    nv.nvmlInit()
    assert code(nv.nvmlDeviceGetCount) == 0


def test_delay_holds_the_call_back_and_clears(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    state.delay("nvmlDeviceGetUUID", 250)
    t0 = time.monotonic()
    nv.nvmlDeviceGetUUID(h)
    assert time.monotonic() - t0 >= 0.25
    t0 = time.monotonic()
    nv.nvmlDeviceGetName(h)
    assert time.monotonic() - t0 < 0.2  # other calls keep their pace
    state.clear_knobs(fail=False)
    t0 = time.monotonic()
    nv.nvmlDeviceGetUUID(h)
    assert time.monotonic() - t0 < 0.2


INIT = """
import ctypes, os
lib = ctypes.CDLL(os.environ["FAKENVML_LIBRARY"])
out = [lib.nvmlInit_v2()]
if out[0] == 0:
    h = ctypes.c_void_p()
    out += [lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) for i in range(4)]
    lib.nvmlShutdown()
print(*out)
"""


def init_in_child(state: NodeDir) -> list[int]:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(INIT)], capture_output=True,
                         text=True, env=subprocess_env(state.path), timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [int(x) for x in res.stdout.split()]


def test_init_fails_for_the_whole_driver_or_one_gpu(state: NodeDir) -> None:
    assert init_in_child(state) == [0, 0, 0, 0, 0]
    state.fail("nvmlInitWithFlags", "DRIVER_NOT_LOADED")  # one knob for every init name
    assert init_in_child(state) == [9]
    state.clear_knobs()
    state.fail("nvmlInit", "UNKNOWN", gpu=2)
    assert init_in_child(state) == [0, 0, 0, UNKNOWN, 0]
    state.clear_knobs()
    assert init_in_child(state) == [0, 0, 0, 0, 0]


def test_one_gpu_failed_at_init_stays_failed_until_reinit(nvml: object, state: NodeDir) -> None:
    h2 = nv.nvmlDeviceGetHandleByIndex(2)
    state.fail("nvmlInit", "GPU_IS_LOST", gpu=2)
    assert code(nv.nvmlDeviceGetUUID, h2) == 0  # initialised before the knob
    nv.nvmlShutdown()
    nv.nvmlInit()
    assert code(nv.nvmlDeviceGetUUID, h2) == LOST
    assert code(nv.nvmlDeviceGetHandleByIndex, 2) == LOST
    assert code(nv.nvmlDeviceGetUUID, nv.nvmlDeviceGetHandleByIndex(1)) == 0
    state.clear_knobs()
    assert code(nv.nvmlDeviceGetUUID, h2) == LOST  # latched at init, as a real failure
    nv.nvmlShutdown()
    nv.nvmlInit()
    assert code(nv.nvmlDeviceGetUUID, h2) == 0


def test_the_cli_shows_knobs_in_events(state: NodeDir, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--state-dir", str(state.path)]
    assert cli.main(["fail", "nvmlDeviceGetMemoryInfo", "--error", "GPU_IS_LOST", "--gpu", "2",
                     "--count", "3", *d]) == 0  # fmt: skip
    assert cli.main(["delay", "nvmlDeviceGetUUID", "2s", *d]) == 0
    assert cli.main(["fail", "--clear", *d]) == 0
    capsys.readouterr()
    assert cli.main(["events", *d]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "GPU 2     fail nvmlDeviceGetMemoryInfo GPU_IS_LOST x3" in lines[0]
    assert "GPU all   delay nvmlDeviceGetUUID 2000 ms" in lines[1]
    assert "GPU all   clear fail all" in lines[2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fail", "nvmlDeviceGetMemoryInfos", "--error", "UNKNOWN"], "is not a function"),
        (["fail", "malloc", "--error", "UNKNOWN"], "is not a function"),
        (["fail", "nvmlShutdown", "--error", "UNKNOWN"], "no knob reaches it"),
        (["fail", "nvmlDeviceGetUUID", "--error", "LOSTISH"], "expected an NVML error"),
        (["fail", "nvmlDeviceGetUUID", "--error", "SUCCESS"], "expected an NVML error"),
        (["fail", "nvmlDeviceGetUUID"], "needs FUNCTION and --error"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--count=-2"], ">= 0"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--gpu", "12"], "not in inventory"),
        (["fail", "--clear", "--error", "UNKNOWN"], "--clear takes no"),
        (["delay", "nvmlDeviceGetUUID", "--", "-2s"], "cannot be negative"),
        (["delay", "nvmlDeviceGetUUID", "soon"], "expected a duration"),
        (["delay", "nvmlBogus", "1s"], "is not a function"),
        (["delay", "nvmlDeviceGetUUID"], "needs FUNCTION and DURATION"),
    ],
)
def test_bad_knobs_are_one_line_and_write_nothing(
    state: NodeDir, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    journal = state.path / JOURNAL_FILE
    before = journal.read_bytes()
    assert cli.main([argv[0], "--state-dir", str(state.path), *argv[1:]]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("fakenvml: error: ") and err.count("\n") == 1 and message in err, err
    assert journal.read_bytes() == before


def _record(seq: int, kind: int, gpu: int, data: int, a0: int, a1: int, data2: int) -> bytes:
    head = RECORD.pack(seq, time.time_ns(), time.monotonic_ns(), kind, gpu, data, a0, a1, data2,
                       0)[:-4]  # fmt: skip
    return head + struct.pack("<I", zlib.crc32(head))


GARBAGE = [  # (kind, gpu, data, arg0, arg1, data2), each with a valid CRC
    (8, 0, 50, 99, 0, 0),  # SET of an unknown sensor
    (8, 0, 50, 0, 0, 0),  # SET of sensor 0
    (8, 9999, 50, 1, 0, 0),  # SET on a GPU that does not exist
    (9, 0xFFFFFFFF, 1 << 30, 7, 1, 0),  # a process on "every GPU"
    (11, 5000, 15, knobs.function_id("nvmlDeviceGetUUID"), 0, 0),  # FAIL on GPU 5000
    (12, 0xFFFFFFFF, 2**64 - 1, knobs.function_id("nvmlDeviceGetName"), 0, 0),  # huge delay
    (13, 0xFFFFFFFF, 0xFF, 0xDEADBEEF, 0, 0),  # CLEAR of nothing
    (200, 0, 1, 2, 3, 4),  # a kind from the future
    (8, 0, 2**64 - 1, 1, 7, 0),  # a wave with a 7 ms period, from ~0 to 2^64-1
]

READ_ALL = """
import ctypes, os
lib = ctypes.CDLL(os.environ["FAKENVML_LIBRARY"])
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
v = ctypes.c_uint()
buf = ctypes.create_string_buffer(96)
print(lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(v)), lib.nvmlDeviceGetUUID(h, buf, 96))
n = ctypes.c_uint(0)
print(lib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(n), None), n.value)
"""


def test_garbage_records_never_crash_the_library(state: NodeDir) -> None:
    journal = state.path / JOURNAL_FILE
    raw = journal.read_bytes()
    seq = (len(raw) - 64) // 64 + 1
    with open(journal, "ab") as f:
        for i, rec in enumerate(GARBAGE):
            f.write(_record(seq + i, *rec))
        seq += len(GARBAGE)
        for i in range(100):  # more processes than a GPU holds: the rest are ignored
            f.write(_record(seq + i, 9, 0, 1 << 20, 1000 + i, 1, 0))
        f.write(bytes(range(64)))  # and a torn record at the end
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(READ_ALL)], capture_output=True,
                         text=True, env=subprocess_env(state.path), timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    temp, uuid = map(int, res.stdout.split()[:2])
    assert (temp, uuid) == (0, 0)
    assert res.stdout.split()[2:] == [str(nv.NVML_ERROR_INSUFFICIENT_SIZE), "64"]
    assert len(list(state.events())) == len(GARBAGE) - 1 + 100  # the unknown kind skipped
    assert cli.main(["events", "--state-dir", str(state.path)]) == 0


def test_the_function_list_is_the_build_exports() -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library.path())],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    symbols = [ln.split()[-1] for ln in out.splitlines()]
    exported = sorted(n for n in symbols if n.startswith("nvml"))
    assert knobs.functions() == exported, "run `python -m fakenvml.native.readme`"
    ids = [knobs.function_id(n) for n in exported]
    assert len(set(ids)) == len(ids), "two exports share a crc32"


def test_error_names_are_nvml_numbers() -> None:
    assert {
        k.removeprefix("NVML_ERROR_"): v for k, v in vars(nv).items()
        if k.startswith("NVML_ERROR_") and isinstance(v, int)
    } == knobs.ERRORS  # fmt: skip


def test_static_helpers_enter_under_their_callers_name() -> None:
    """A knob matches the name a call enters under; inside a static helper, __func__ is the
    helper's, so helpers must use the _AS forms with the exported caller's name."""
    bad = []
    for src in Path(SRC).glob("*.c"):
        if src.name == "export_table.c":  # private slots, not exports: no knob names them
            continue
        text = src.read_text()
        functions = r"^static [^;{]*?\b(\w+)\([^;{]*?\)\s*\{\n(.*?)^\}"
        for m in re.finditer(functions, text, re.S | re.M):
            if re.search(r"\b(DEVICE_ENTER|LINK_ENTER|WITH_STATE|fnv_enter|fnv_device_enter)\(",
                         m.group(2)):  # fmt: skip
                bad.append(f"{src.name}: {m.group(1)}")
    assert bad == []
