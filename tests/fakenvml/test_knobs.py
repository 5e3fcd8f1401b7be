"""NVML failure knobs: `fakenvml fail|delay` make chosen calls answer chosen errors or
answer late, in processes that already loaded the library; `--clear` undoes them; and a
journal with records the library cannot use never crashes it."""

from __future__ import annotations

import ctypes
import math
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


# ---- counted knobs: --after, --probability and --count number the node's calls


def uuid_codes(h: object, n: int) -> list[int]:
    return [code(nv.nvmlDeviceGetUUID, h) for _ in range(n)]


def test_after_n_the_first_n_calls_pass_then_every_call_fails(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", after=5)
    assert uuid_codes(h, 12) == [0] * 5 + [UNKNOWN] * 7  # forever after, as NVIDIA's mock
    state.clear_knobs()
    assert uuid_codes(h, 2) == [0, 0]


def test_after_n_then_count_calls_fail_and_the_knob_is_spent(nvml: object, state: NodeDir) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", after=3, count=2)
    assert uuid_codes(h, 8) == [0, 0, 0, UNKNOWN, UNKNOWN, 0, 0, 0]
    state.fail("nvmlDeviceGetUUID", "GPU_IS_LOST", after=0, count=1)  # --after 0: at once
    assert uuid_codes(h, 2) == [LOST, 0]


def test_after_counts_only_the_calls_the_knob_matches(nvml: object, state: NodeDir) -> None:
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", gpu=1, after=2)
    assert uuid_codes(h0, 5) == [0] * 5  # another GPU's calls are not the knob's
    assert code(nv.nvmlDeviceGetName, h1) == 0  # nor another function's
    assert uuid_codes(h1, 4) == [0, 0, UNKNOWN, UNKNOWN]


MASK = 2**64 - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def fails_at(seed: int, probability: float, calls: range) -> list[bool]:
    """Which of the node's matching calls a probability knob fails: src/knobs.c's fnv_roll
    (splitmix64 of splitmix64(seed) + call number), written again from its comment."""
    limit = knobs.threshold(probability)
    return [_mix((_mix(seed) + i) & MASK) >> 32 < limit for i in calls]


def test_probability_fails_about_p_of_the_calls_and_exactly_the_seeds(
    nvml: object, state: NodeDir
) -> None:
    h, n, p = nv.nvmlDeviceGetHandleByIndex(0), 2000, 0.1
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", probability=p, seed=7)
    first = [c != 0 for c in uuid_codes(h, n)]
    sd = math.sqrt(n * p * (1 - p))  # binomial: 200 +- 13.4; 5 sd is 1 run in 3 million
    assert abs(sum(first) - n * p) < 5 * sd, sum(first)
    assert first == fails_at(7, p, range(n))  # a function of (seed, call number) alone
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", probability=p, seed=7)  # a new knob: from 0
    assert [c != 0 for c in uuid_codes(h, n)] == first
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", probability=p, seed=8)
    assert [c != 0 for c in uuid_codes(h, n)] != first
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", probability=0.5, seed=3, after=10)
    assert [c != 0 for c in uuid_codes(h, 60)] == [
        i >= 10 and f for i, f in enumerate(fails_at(3, 0.5, range(60)))
    ]


CALLER = """
import ctypes, os, sys, time
ctypes.CDLL(os.environ["FAKENVML_LIBRARY"], mode=ctypes.RTLD_GLOBAL)
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
out = []
for _ in range(int(sys.argv[2])):
    try:
        nv.nvmlDeviceGetUUID(h)
        out.append(0)
    except nv.NVMLError as e:
        out.append(e.value)
nv.nvmlShutdown()
print(*out)
"""


def calls_in_processes(state: NodeDir, processes: int, calls: int) -> list[list[int]]:
    """Each of `processes` Python processes (nvidia-ml-py over the library) loads the
    library, then all call nvmlDeviceGetUUID `calls` times at once; their answers."""
    go = state.path.parent / f"go-{time.monotonic_ns()}"
    argv = [sys.executable, "-c", CALLER, str(go), str(calls)]
    pipe, env = subprocess.PIPE, subprocess_env(state.path)
    children = [
        subprocess.Popen(argv, text=True, stdout=pipe, stderr=pipe, env=env)
        for _ in range(processes)
    ]
    time.sleep(0.3)  # most of them initialised: their calls overlap
    go.touch()
    out = []
    for child in children:
        stdout, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr[-2000:]
        out.append([int(x) for x in stdout.split()])
    return out


def test_two_processes_count_the_node_calls_together(state: NodeDir) -> None:
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", after=150)
    a, b = calls_in_processes(state, 2, 200)
    assert (a + b).count(0) == 150  # the node's first 150 calls, whoever made them
    for mine in (a, b):  # each process's calls are numbered in its order: passes first
        assert mine == sorted(mine)
    state.fail("nvmlDeviceGetUUID", "GPU_IS_LOST", after=100, count=50)
    a, b = calls_in_processes(state, 2, 200)
    assert ((a + b).count(0), (a + b).count(LOST)) == (350, 50)


def test_two_processes_draw_the_node_sequence(state: NodeDir) -> None:
    state.fail("nvmlDeviceGetUUID", "UNKNOWN", probability=0.3, seed=11)
    a, b = calls_in_processes(state, 2, 300)
    assert (a + b).count(UNKNOWN) == sum(fails_at(11, 0.3, range(600)))


def test_without_the_node_counter_each_process_counts_alone(state: NodeDir) -> None:
    """A process that cannot map knobs.bin writable (a read-only mount, a state from before
    it, a broken file) counts the knob's calls itself, as every --count did before."""
    counters = state.path / knobs.COUNTERS_FILE
    for broken in (None, b"garbage", bytes(64) + bytes(16)):
        if broken is None:
            counters.unlink()
        else:
            counters.write_bytes(broken)
        state.fail("nvmlDeviceGetUUID", "UNKNOWN", after=150)
        a, b = calls_in_processes(state, 2, 200)
        assert (a.count(0), b.count(0)) == (150, 150)


def test_the_cli_writes_a_counted_knob_in_one_line(
    state: NodeDir, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--state-dir", str(state.path)]
    assert cli.main(["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--after", "100",
                     "--probability", "0.1", "--seed", "7", *d]) == 0  # fmt: skip
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    assert line.rstrip().endswith(
        "fail nvmlDeviceGetUUID UNKNOWN on every GPU, after 100 "
        "calls, p 0.1 seed 7, counted per node (slot 0)"
    ), line
    assert cli.main(["events", *d]) == 0
    assert "fail-when after 100 calls, p 0.1 seed 7" in capsys.readouterr().out


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
    assert "GPU 2     fail-when counted per node (slot 0)" in lines[0]  # a --count is counted
    assert "GPU 2     fail nvmlDeviceGetMemoryInfo GPU_IS_LOST x3" in lines[1]
    assert "GPU all   delay nvmlDeviceGetUUID 2000 ms" in lines[2]
    assert "GPU all   clear fail all" in lines[3]


FAIL_UUID = ["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN"]


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
        (["fail", "--clear", "--after", "3"], "--clear takes no"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--after=-1"], ">= 0"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--after", "ten"], "a number"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability", "0"], "0 < p <= 1"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability", "1.5"], "0 < p <= 1"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability=-0.1"], "0 < p <= 1"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability", "nan"], "0 < p <= 1"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability", "1e-12"], "2^-33"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--probability", "often"], "a number"),
        (["fail", "nvmlDeviceGetUUID", "--error", "UNKNOWN", "--seed", "7"], "goes with"),
        ([*FAIL_UUID, "--probability", ".5", "--seed", "-1"], "a number >= 0"),
        ([*FAIL_UUID, "--probability", ".5", "--seed", "4294967296"], "expected 0 to"),
        (
            ["fail", "nvmlDeviceGetUUID", "--error", "999", "--probability", ".5", "--seed", "5e9"],
            "a number",
        ),
        (["fail", "nvmlDeviceGetUUID", "--error", "LOSTISH", "--after", "3"], "expected an NVML"),
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
    counters = (state.path / knobs.COUNTERS_FILE).read_bytes()
    assert cli.main([argv[0], "--state-dir", str(state.path), *argv[1:]]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("fakenvml: error: ") and err.count("\n") == 1 and message in err, err
    assert journal.read_bytes() == before
    assert (state.path / knobs.COUNTERS_FILE).read_bytes() == counters  # no slot taken


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
    (20, 0xFFFFFFFF, 5, 7, 99999, 2**64 - 1),  # a FAIL_WHEN with no FAIL after it
    (20, 0, 0, 1, 4_000_000, 0),  # a slot past knobs.bin, a probability of 0, and its FAIL:
    (11, 0, 999, knobs.function_id("nvmlDeviceGetUUID"), 0, 0),  # counted alone, never fails
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
