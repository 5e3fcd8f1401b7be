"""NVML failure knobs: a chosen call answers a chosen error, or answers late.

    fakenvml fail nvmlInit --error DRIVER_NOT_LOADED      # the whole driver
    fakenvml fail nvmlInit --gpu 2 --error UNKNOWN        # one GPU fails at init
    fakenvml fail nvmlDeviceGetMemoryInfo --error GPU_IS_LOST --gpu 2 --count 3
    fakenvml fail nvmlDeviceGetUUID --error UNKNOWN --after 100      # calls 101, 102, ...
    fakenvml fail nvmlDeviceGetUUID --error UNKNOWN --probability 0.1 --seed 7
    fakenvml delay nvmlDeviceGetUUID 2s
    fakenvml fail --clear ; fakenvml delay --clear

A knob is a journal record (Kind.FAIL, DELAY, CLEAR) naming the function by crc32 of its
exported name (src/knobs.c matches it). A name without a `_vN` suffix also covers its
versions (nvmlDeviceGetMemoryInfo: _v2 too); nvmlInit, nvmlInit_v2 and nvmlInitWithFlags
are one knob, nvmlInit.

A counted knob (--after, --probability or --count) is a FAIL_WHEN record and its FAIL,
written in one append, and a slot in the node's knobs.bin where every process that loaded
the library counts the calls the knob matches: the node's calls, not each process's.
"""

from __future__ import annotations

import fcntl
import math
import os
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
COUNTERS_FILE, NO_SLOT, ALWAYS = layout.COUNTERS_FILE, layout.NO_SLOT, layout.ALWAYS
COUNTERS = layout.COUNTERS.span().struct  # magic, boot id, slots, next
COUNTERS_NEXT = layout.COUNTERS.offsets["next"]
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


def threshold(probability: float) -> int:
    """A probability as the library compares it: a draw in [0, 2^32) below this fails."""
    if not (math.isfinite(probability) and 0 < probability <= 1):
        raise FakeNvmlError(f"--probability {probability:g}: expected a number with 0 < p <= 1")
    t = round(probability * ALWAYS)
    if t == 0:
        raise FakeNvmlError(f"--probability {probability:g}: below 2^-33, the smallest there is")
    return t


def fail(
    name: str,
    error: str,
    gpu: int | None,
    count: int = 0,
    after: int = 0,
    probability: float | None = None,
    seed: int | None = None,
    slot: int = NO_SLOT,
) -> list[Entry]:
    """The records of a fail knob: FAIL, after its FAIL_WHEN when the knob is counted (an
    `after`, a `probability` or a `count`). Every argument is checked before any is used."""
    fid, flags = target(name)
    code = error_code(error)
    if not 0 <= count < 2**64:
        raise FakeNvmlError(f"--count {count}: expected a number >= 0 (0: every call)")
    if not 0 <= after < 2**64:
        raise FakeNvmlError(f"--after {after}: expected a number of calls >= 0")
    if seed is not None and probability is None:
        raise FakeNvmlError("--seed goes with --probability")
    if seed is not None and not 0 <= seed < 2**32:
        raise FakeNvmlError(f"--seed {seed}: expected 0 to {2**32 - 1}")
    limit = ALWAYS if probability is None else threshold(probability)
    where = ALL_GPUS if gpu is None else gpu
    knob: Entry = (Kind.FAIL, where, code, fid, flags, count)
    if not (count or after or limit < ALWAYS):
        return [knob]
    if seed is None:
        import secrets  # here: the knobs without a draw start faster

        seed = secrets.randbits(32)
    return [(Kind.FAIL_WHEN, where, after, seed, slot, limit), knob]


def when_text(after: int, limit: int, seed: int, slot: int) -> str:
    """A FAIL_WHEN record in words, for `fakenvml events` and the `fail` line."""
    parts = [f"after {after} calls"] if after else []
    if limit < ALWAYS:
        parts.append(f"p {limit / ALWAYS:.6g} seed {seed}")
    parts.append("counted per process" if slot == NO_SLOT else f"counted per node (slot {slot})")
    return ", ".join(parts)


def create_counters(boot_id: int) -> bytes:
    """knobs.bin of a fresh init: every slot unused, every counter zero."""
    head = COUNTERS.pack(layout.COUNTERS_MAGIC, boot_id, layout.MAX_COUNTED, 0)
    return head + bytes(layout.MAX_COUNTED * layout.COUNTER.size)


def claim_slot(state_dir: Path, boot_id: int) -> int:
    """The next unused counter slot of the node's knobs.bin (taken under its flock), or
    NO_SLOT where there is none to take (a state from before knobs.bin, or a foreign
    file): the library then counts the knob in each process."""
    path = Path(state_dir) / COUNTERS_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return NO_SLOT
    except OSError as e:
        raise FakeNvmlError(f"cannot open {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, COUNTERS.size, 0)
        if len(raw) < COUNTERS.size:
            return NO_SLOT
        magic, boot, slots, taken = COUNTERS.unpack(raw)
        if magic != layout.COUNTERS_MAGIC or boot != boot_id:
            return NO_SLOT
        if taken >= min(slots, layout.MAX_COUNTED):
            raise FakeNvmlError(
                f"{path}: this init's {slots} counted knobs are all used; "
                "run `fakenvml init` again for more"
            )
        os.pwrite(fd, (taken + 1).to_bytes(4, "little"), COUNTERS_NEXT)
        return int(taken)
    finally:
        os.close(fd)


def delay(name: str, ms: int, gpu: int | None) -> Entry:
    fid, flags = target(name)
    if not 0 <= ms <= MAX_DELAY_MS:
        raise FakeNvmlError(f"delay {ms} ms: expected 0 to {MAX_DELAY_MS} ms")
    return (Kind.DELAY, ALL_GPUS if gpu is None else gpu, ms, fid, flags, 0)


def clear(what: int, name: str | None = None) -> Entry:
    fid = target(name)[0] if name else 0
    return (Kind.CLEAR, ALL_GPUS, what, fid, 0, 0)
