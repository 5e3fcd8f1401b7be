"""NVML failure knobs: a chosen call answers a chosen error, or answers late.

    fakenvml fail nvmlInit --error DRIVER_NOT_LOADED      # the whole driver
    fakenvml fail nvmlInit --gpu 2 --error UNKNOWN        # one GPU fails at init
    fakenvml fail nvmlDeviceGetMemoryInfo --error GPU_IS_LOST --gpu 2 --count 3
    fakenvml delay nvmlDeviceGetUUID 2s
    fakenvml fail --clear ; fakenvml delay --clear

A knob is a journal record (Kind.FAIL, DELAY, CLEAR) naming the function by crc32 of its
exported name (src/knobs.c matches it). A name without a `_vN` suffix also covers its
versions (nvmlDeviceGetMemoryInfo: _v2 too); nvmlInit, nvmlInit_v2 and nvmlInitWithFlags
are one knob, nvmlInit.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from fakenvml import layout
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import ALL_GPUS, Entry, Kind

# Every function the library exports (`nm -D`), kept equal to the build by a test and
# regenerated with `python -m fakenvml.native.readme`.
FUNCTIONS_FILE = Path(__file__).resolve().parent / "nvml_functions.txt"
INIT = "nvmlInit"
INIT_NAMES = frozenset({"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags"})
# Exports no knob reaches: no nvmlReturn_t to answer, or no call to hold back.
UNREACHABLE = frozenset({"nvmlErrorString", "nvmlShutdown", "nvmlInternalGetExportTable",
                         "nvmlEventSetFree"})  # fmt: skip
VERSIONS = layout.KNOB_VERSIONS
CLEAR_FAIL, CLEAR_DELAY = layout.CLEAR_FAIL, layout.CLEAR_DELAY
MAX_DELAY_MS = 2**32 - 1
_VERSIONED = re.compile(r".*_v\d+")

# nvmlReturn_t, as nvml.h numbers them (a test holds them to nvidia-ml-py's constants).
ERRORS = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11, "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14, "GPU_IS_LOST": 15, "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17, "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20,
    "NO_DATA": 21, "VGPU_ECC_NOT_SUPPORTED": 22, "INSUFFICIENT_RESOURCES": 23,
    "FREQ_NOT_SUPPORTED": 24, "ARGUMENT_VERSION_MISMATCH": 25, "DEPRECATED": 26,
    "NOT_READY": 27, "GPU_NOT_FOUND": 28, "INVALID_STATE": 29, "RESET_TYPE_NOT_SUPPORTED": 30,
    "UNKNOWN": 999,
}  # fmt: skip
ERROR_NAMES = {v: k for k, v in ERRORS.items()}


def functions() -> list[str]:
    return FUNCTIONS_FILE.read_text().split()


def function_id(name: str) -> int:
    return zlib.crc32(name.encode())


def function_name(fid: int) -> str:
    """The name behind an id, for `fakenvml events`."""
    for name in (INIT, *functions()):
        if function_id(name) == fid:
            return name
    return f"function {fid:#010x}"


def target(name: str) -> tuple[int, int]:
    """(id, flags) of a function by its exported name; FakeNvmlError if no knob reaches it."""
    name = name.strip()
    if name in INIT_NAMES:
        return function_id(INIT), 0
    if name in UNREACHABLE:
        raise FakeNvmlError(f"{name}: no knob reaches it (it answers no nvmlReturn_t or call)")
    if name not in set(functions()):
        close = [f for f in functions() if name.lower() in f.lower()][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise FakeNvmlError(f"{name!r} is not a function libnvidia-ml exports{hint}")
    return function_id(name), 0 if _VERSIONED.fullmatch(name) else VERSIONS


def error_code(text: str) -> int:
    """GPU_IS_LOST, NVML_ERROR_GPU_IS_LOST (any case) or the number."""
    key = text.strip().upper().removeprefix("NVML_ERROR_")
    if key in ERRORS:
        return ERRORS[key]
    if key.isdigit() and int(key) in ERROR_NAMES:
        return int(key)
    raise FakeNvmlError(f"{text!r}: expected an NVML error ({', '.join(ERRORS)})")


def fail(name: str, error: str, gpu: int | None, count: int) -> Entry:
    fid, flags = target(name)
    if count < 0:
        raise FakeNvmlError(f"--count {count}: expected a number >= 0 (0: every call)")
    where = ALL_GPUS if gpu is None else gpu
    return (Kind.FAIL, where, error_code(error), fid, flags, count)


def delay(name: str, ms: int, gpu: int | None) -> Entry:
    fid, flags = target(name)
    if not 0 <= ms <= MAX_DELAY_MS:
        raise FakeNvmlError(f"delay {ms} ms: expected 0 to {MAX_DELAY_MS} ms")
    return (Kind.DELAY, ALL_GPUS if gpu is None else gpu, ms, fid, flags, 0)


def clear(what: int, name: str | None = None) -> Entry:
    fid = target(name)[0] if name else 0
    return (Kind.CLEAR, ALL_GPUS, what, fid, 0, 0)
