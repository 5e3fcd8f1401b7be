"""Bad state never crashes a process that loaded the library: missing, malformed,
truncated or concurrently rewritten state makes nvmlInit fail with a clear code and one
log line; threads, re-initialisation and dlopen/dlclose cycles are safe."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pynvml as nv
import pytest

from fakenvml import driver, library, statefile
from fakenvml.journal import HEADER as JOURNAL_HEADER
from fakenvml.node import STATE_DIR_ENV, NodeDir
from tests.fakenvml.conftest import build_node, subprocess_env

NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_UNKNOWN = 999

INIT_AND_COUNT = """
import ctypes, os
lib = ctypes.CDLL(os.environ["FAKENVML_LIBRARY"])
ret = lib.nvmlInit_v2()
count = ctypes.c_uint(0)
if ret == 0:
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    assert lib.nvmlShutdown() == 0
print(ret, count.value)
"""


def run_child(state_dir: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=subprocess_env(state_dir), timeout=timeout,
    )  # fmt: skip


def init_in_child(state_dir: Path) -> tuple[int, int, list[str]]:
    res = run_child(state_dir, INIT_AND_COUNT)
    assert res.returncode == 0, f"child crashed ({res.returncode}): {res.stderr[-2000:]}"
    ret, count = map(int, res.stdout.split())
    log = [ln for ln in res.stderr.splitlines() if ln.startswith("fakenvml:")]
    return ret, count, log


def test_missing_state_fails_init_with_driver_not_loaded(tmp_path: Path) -> None:
    ret, _, log = init_in_child(tmp_path / "nothing-here")
    assert ret == NVML_ERROR_DRIVER_NOT_LOADED
    assert len(log) == 1 and "fakenvml init" in log[0]


def test_a_library_in_a_driver_root_finds_the_state_in_that_root(tmp_path: Path) -> None:
    """Without FAKENVML_STATE_DIR, a library installed under <root>/usr/lib/x86_64-linux-gnu
    reads <root>/var/lib/fakenvml: how a plugin that mounts only the driver root (NVIDIA's
    Helm chart) reaches the state. The variable, where set, still wins."""
    root = tmp_path / "driver-root"
    lib = driver.install(root).library
    NodeDir(root / "var/lib/fakenvml").init(build_node({"gpus": [{"profile": "T4", "count": 3}]}))

    def init(state_env: str | None) -> list[str]:
        env = {**subprocess_env(tmp_path), library.LIBRARY_ENV: str(lib)}
        env.pop(STATE_DIR_ENV)
        if state_env is not None:
            env[STATE_DIR_ENV] = state_env
        res = subprocess.run([sys.executable, "-c", INIT_AND_COUNT], capture_output=True,
                             text=True, env=env, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr
        return [*res.stdout.split(), res.stderr]

    assert init(None)[:2] == ["0", "3"]
    ret, _, log = init(str(tmp_path / "elsewhere"))
    assert int(ret) == NVML_ERROR_DRIVER_NOT_LOADED and "elsewhere/state.bin" in log


def _valid_state_bytes(tmp_path: Path) -> tuple[NodeDir, bytes]:
    d = NodeDir(tmp_path / "n")
    d.init(build_node({"gpus": [{"profile": "A100-SXM4-80GB", "count": 4}]}, "n"))
    return d, (d.path / statefile.STATE_FILE).read_bytes()


def _corruptions(good: bytes) -> dict[str, bytes]:
    flipped = bytearray(good)
    flipped[400] ^= 0x40
    other_version = bytearray(good)
    other_version[8] = 99
    return {
        "empty": b"",
        "garbage": bytes(range(256)) * 40,
        "one-byte-flipped": bytes(flipped),
        "other-version": bytes(other_version),
        **{f"truncated-at-{n}": good[:n] for n in (7, 167, 168, 2000)},
        "last-byte-missing": good[:-1],
        "trailing-junk": good + b"\0" * 64,
    }


@pytest.mark.parametrize("case", list(_corruptions(b"\0" * 4096)))
def test_malformed_state_fails_init_cleanly(tmp_path: Path, case: str) -> None:
    d, good = _valid_state_bytes(tmp_path)
    (d.path / statefile.STATE_FILE).write_bytes(_corruptions(good)[case])
    ret, _, log = init_in_child(d.path)
    assert ret == NVML_ERROR_UNKNOWN, case
    assert len(log) == 1, f"expected one log line, got {log}"


def test_state_dir_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / statefile.STATE_FILE).mkdir()
    ret, _, log = init_in_child(tmp_path)
    assert ret == NVML_ERROR_DRIVER_NOT_LOADED and len(log) == 1


def test_corrupt_journal_records_are_skipped_not_trusted(tmp_path: Path) -> None:
    d, _ = _valid_state_bytes(tmp_path)
    d.inject_xid(0, 79)
    journal = d.path / "journal.bin"
    data = bytearray(journal.read_bytes())
    data[JOURNAL_HEADER.size + 20] ^= 0xFF  # break the record's CRC
    journal.write_bytes(bytes(data) + b"\xff" * 64)  # and add a record of garbage
    ret, count, _ = init_in_child(d.path)
    assert (ret, count) == (0, 4)


def test_calls_before_init_answer_uninitialized(tmp_path: Path) -> None:
    res = run_child(tmp_path, """
        import ctypes, os
        lib = ctypes.CDLL(os.environ["FAKENVML_LIBRARY"])
        c = ctypes.c_uint()
        print(lib.nvmlDeviceGetCount_v2(ctypes.byref(c)), lib.nvmlShutdown())
    """)  # fmt: skip
    assert res.stdout.split() == ["1", "1"]  # NVML_ERROR_UNINITIALIZED twice


def test_garbage_handles_are_rejected(nvml: object) -> None:
    lib = library.preload()
    name = ctypes.create_string_buffer(96)
    for bogus in (None, 0x1234, ctypes.addressof(name)):
        assert lib.nvmlDeviceGetName(ctypes.c_void_p(bogus), name, 96) == 2  # INVALID_ARGUMENT
    assert lib.nvmlEventSetWait_v2(ctypes.c_void_p(0x4000), ctypes.byref(name), 0) == 2
    assert lib.nvmlEventSetFree(ctypes.c_void_p(0x4000)) == 2


def test_state_rewritten_while_processes_init_is_never_torn(tmp_path: Path) -> None:
    d = NodeDir(tmp_path / "n")
    small = build_node({"gpus": [{"profile": "T4", "count": 8}]}, "n")
    large = build_node({"gpus": [{"profile": "H100-SXM5-80GB", "count": 16}]}, "n")
    d.init(small)
    stop = threading.Event()

    def rewrite() -> None:
        i = 0
        while not stop.is_set():
            d.init(large if i % 2 else small)
            i += 1

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        res = run_child(d.path, """
            import ctypes, os
            lib = ctypes.CDLL(os.environ["FAKENVML_LIBRARY"])
            seen = {}
            for _ in range(300):
                assert lib.nvmlInit_v2() == 0
                c = ctypes.c_uint()
                lib.nvmlDeviceGetCount_v2(ctypes.byref(c))
                h = ctypes.c_void_p()
                assert lib.nvmlDeviceGetHandleByIndex_v2(c.value - 1, ctypes.byref(h)) == 0
                name = ctypes.create_string_buffer(96)
                assert lib.nvmlDeviceGetName(h, name, 96) == 0
                seen[c.value] = name.value.decode()
                assert lib.nvmlShutdown() == 0
            print(sorted(seen.items()))
        """)  # fmt: skip
    finally:
        stop.set()
        writer.join()
    assert res.returncode == 0, res.stderr[-2000:]
    # Every read saw one whole inventory: 8 T4s or 16 H100s, never a mix.
    for count, name in eval(res.stdout):
        assert (count, name) in ((8, "Tesla T4"), (16, "NVIDIA H100 80GB HBM3"))


def test_dlopen_dlclose_cycles_and_threads(state: NodeDir) -> None:
    res = run_child(state.path, """
        import ctypes, os, threading, _ctypes
        path = os.environ["FAKENVML_LIBRARY"]
        for i in range(30):
            lib = ctypes.CDLL(path)
            assert lib.nvmlInit_v2() == 0
            if i % 3:  # sometimes unload while still initialised, as a crashing consumer would
                assert lib.nvmlShutdown() == 0
            _ctypes.dlclose(lib._handle)
        lib = ctypes.CDLL(path)
        errors = []
        def worker():
            for _ in range(200):
                if lib.nvmlInit_v2() != 0:
                    errors.append("init")
                    return
                h = ctypes.c_void_p()
                uuid = ctypes.create_string_buffer(96)
                for i in range(8):
                    lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
                    if lib.nvmlDeviceGetUUID(h, uuid, 96) != 0:
                        errors.append("uuid")
                es = ctypes.c_void_p()
                lib.nvmlEventSetCreate(ctypes.byref(es))
                lib.nvmlDeviceRegisterEvents(h, 8, es)
                lib.nvmlEventSetFree(es)
                lib.nvmlShutdown()
        threads = [threading.Thread(target=worker) for _ in range(6)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(len(errors))
    """)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "0"


def test_event_set_freed_while_another_thread_waits(nvml: object, state: NodeDir) -> None:
    es = nv.nvmlEventSetCreate()
    xid = nv.nvmlEventTypeXidCriticalError
    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(0), xid, es)
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(nv.nvmlEventSetWait_v2(es, 400))
        except nv.NVMLError as e:
            outcome.append(e.value)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.1)  # let the waiter block inside nvmlEventSetWait (nothing to poll for)
    nv.nvmlEventSetFree(es)  # the waiter keeps the set alive until it returns
    t.join()
    assert outcome == [nv.NVML_ERROR_TIMEOUT]
