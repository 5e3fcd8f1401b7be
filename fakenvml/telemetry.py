"""Telemetry that moves: sensor values and running processes set at run time.

    fakenvml set 3 temperature=88 power=350W util=90
    fakenvml set 3 temperature=70..90/30s      # a triangle wave: 70 -> 90 -> 70 every 30 s
    fakenvml set all util=idle                 # back to the profile's reading
    fakenvml process add 0 --pid 4242 --used 2GiB

Each setting is a journal record (Kind.SET, PROCESS_ADD, PROCESS_REMOVE), so every
process that loaded the library sees it at its next call. A wave is evaluated by the
library at each read from the record's CLOCK_MONOTONIC stamp: deterministic, the same
in every process, with nothing running in the background.
"""

from __future__ import annotations

import collections
import enum
import re

from fakenvml import durations, layout
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import Entry, Kind

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # the model's dataclasses stay off the path of `fakenvml inject`
    from fakenvml.model import Gpu

IDLE = "idle"  # a value that puts a sensor back to the profile's reading
SET_IDLE = layout.SET_IDLE
MAX_PERIOD_MS = 0xFFFFFFFE
MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP: only GPUs whose profile answers it
PROC_COMPUTE, PROC_GRAPHICS = layout.PROC_COMPUTE, layout.PROC_GRAPHICS
PROC_UTIL = layout.PROC_UTIL
MAX_PROCESSES = layout.MAX_PROCESSES

# nvmlClocksEventReason* bits, spelled as the rest of the CLI spells things.
CLOCK_REASONS = {
    "gpu-idle": 0x1,
    "applications-clocks-setting": 0x2,
    "sw-power-cap": 0x4,
    "hw-slowdown": 0x8,
    "sync-boost": 0x10,
    "sw-thermal-slowdown": 0x20,
    "hw-thermal-slowdown": 0x40,
    "hw-power-brake-slowdown": 0x80,
    "display-clock-setting": 0x100,
}


class Sensor(enum.IntEnum):
    """enum fnv_sensor in src/state_format.h: the numbers are the format."""

    TEMPERATURE = 1
    MEM_TEMPERATURE = 2
    POWER = 3
    UTIL = 4
    MEM_UTIL = 5
    GRAPHICS_CLOCK = 6
    SM_CLOCK = 7
    MEM_CLOCK = 8
    VIDEO_CLOCK = 9
    PSTATE = 10
    CLOCK_REASONS = 11
    COMPUTE_MODE = 12  # a setting, not telemetry: nvmlDeviceSetComputeMode writes it too

    @property
    def spelling(self) -> str:
        return self.name.lower().replace("_", "-")


# units: suffix -> factor to the stored unit ("" : a bare number); hint; wave (bool)
_Unit = collections.namedtuple("_Unit", "units hint wave", defaults=(True,))


_UNITS = {
    Sensor.TEMPERATURE: _Unit({"": 1, "c": 1}, "degrees C, e.g. 88 or 88C"),
    Sensor.MEM_TEMPERATURE: _Unit({"": 1, "c": 1}, "degrees C, e.g. 70 or 70C"),
    Sensor.POWER: _Unit({"": 1000, "w": 1000, "mw": 1}, "watts, e.g. 350W or 350000mW"),
    Sensor.UTIL: _Unit({"": 1, "%": 1}, "percent, e.g. 90 or 90%"),
    Sensor.MEM_UTIL: _Unit({"": 1, "%": 1}, "percent, e.g. 40 or 40%"),
    **{
        s: _Unit({"": 1, "mhz": 1}, "MHz, e.g. 1980 or 1980MHz")
        for s in (Sensor.GRAPHICS_CLOCK, Sensor.SM_CLOCK, Sensor.MEM_CLOCK, Sensor.VIDEO_CLOCK)
    },
    Sensor.PSTATE: _Unit({"": 1}, "a P-state, e.g. P0 or 2", wave=False),
    Sensor.CLOCK_REASONS: _Unit({"": 1}, "reasons joined by +, a mask, or none", wave=False),
    Sensor.COMPUTE_MODE: _Unit({"": 1}, "default, prohibited or exclusive-process", False),
}
# nvmlComputeMode_t by `nvidia-smi -c`'s words (EXCLUSIVE_THREAD, 1, is deprecated).
COMPUTE_MODES = {"default": 0, "exclusive-thread": 1, "prohibited": 2, "exclusive-process": 3}
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)([a-z%]*)")


class Setting(collections.namedtuple("Setting", "sensor start end period_ms idle",
                                      defaults=(0, 0, 0, False))):  # fmt: skip
    """One sensor's new value: constant (period_ms 0), a wave, or back to idle."""

    __slots__ = ()
    sensor: Sensor
    start: int
    end: int
    period_ms: int
    idle: bool

    def entry(self, gpu: int) -> Entry:
        if self.idle:
            return (Kind.SET, gpu, 0, self.sensor, SET_IDLE, 0)
        return (Kind.SET, gpu, self.start, self.sensor, self.period_ms, self.end)

    def text(self) -> str:
        """How `fakenvml events` shows it: temperature=88, power=200000..400000/30s (mW)."""
        if self.idle:
            return f"{self.sensor.spelling}={IDLE}"
        if self.sensor == Sensor.CLOCK_REASONS:
            return f"{self.sensor.spelling}={reasons_text(self.start)}"
        if self.sensor == Sensor.COMPUTE_MODE:
            word = next((w for w, n in COMPUTE_MODES.items() if n == self.start), self.start)
            return f"{self.sensor.spelling}={word}"
        unit, start, end = _SHOWN_UNIT[self.sensor], self.start, self.end
        if self.sensor == Sensor.POWER and start % 1000 == 0 and end % 1000 == 0:
            unit, start, end = "W", start // 1000, end // 1000
        if not self.period_ms:
            return f"{self.sensor.spelling}={start}{unit}"
        period = durations.duration_text(self.period_ms / 1000)
        return f"{self.sensor.spelling}={start}..{end}{unit}/{period}"


_SHOWN_UNIT = {
    **{s: "" for s in Sensor},
    Sensor.TEMPERATURE: "C", Sensor.MEM_TEMPERATURE: "C", Sensor.POWER: "mW",
    Sensor.UTIL: "%", Sensor.MEM_UTIL: "%", Sensor.GRAPHICS_CLOCK: "MHz",
    Sensor.SM_CLOCK: "MHz", Sensor.MEM_CLOCK: "MHz", Sensor.VIDEO_CLOCK: "MHz",
}  # fmt: skip


def setting_of(rec_data: int, sensor: int, period_or_idle: int, end: int) -> Setting | None:
    """A SET record's meaning, or None for a sensor this version does not know."""
    try:
        s = Sensor(sensor)
    except ValueError:
        return None
    if period_or_idle == SET_IDLE:
        return Setting(s, idle=True)
    return Setting(s, rec_data, end, period_or_idle)


def reasons_text(mask: int) -> str:
    names = [n for n, bit in CLOCK_REASONS.items() if mask & bit]
    return "+".join(names) if names else "none"


def parse(assignments: list[str], gpu: Gpu) -> list[Setting]:
    """`FIELD=VALUE ...` for one GPU, each checked against what that GPU can report;
    a FakeNvmlError (one line) on the first that is wrong."""
    if not assignments:
        raise FakeNvmlError(f"nothing to set: give FIELD=VALUE ({_fields()})")
    out: dict[Sensor, Setting] = {}
    for text in assignments:
        name, sep, value = text.partition("=")
        sensor = next((s for s in Sensor if s.spelling == name.strip().lower()), None)
        if not sep or sensor is None:
            raise FakeNvmlError(f"{text!r}: expected FIELD=VALUE, FIELD one of {_fields()}")
        if sensor in out:
            raise FakeNvmlError(f"{name} given twice")
        out[sensor] = _setting(sensor, value.strip(), gpu)
    return list(out.values())


def _fields() -> str:
    return ", ".join(s.spelling for s in Sensor)


def _setting(sensor: Sensor, value: str, gpu: Gpu) -> Setting:
    where = f"{sensor.spelling}={value}"
    if value.lower() == IDLE:
        return Setting(sensor, idle=True)
    if sensor == Sensor.MEM_TEMPERATURE and MEMORY_TEMP_FIELD not in gpu.fields:
        raise FakeNvmlError(f"{where}: GPU {gpu.index} ({gpu.name}) has no memory sensor")
    if sensor == Sensor.PSTATE:
        return Setting(sensor, _pstate(value, gpu, where))
    if sensor == Sensor.CLOCK_REASONS:
        return Setting(sensor, _reasons(value, where))
    if sensor == Sensor.COMPUTE_MODE:
        if value.lower() not in COMPUTE_MODES:
            raise FakeNvmlError(f"{where}: expected {_UNITS[sensor].hint}")
        return Setting(sensor, COMPUTE_MODES[value.lower()])
    unit = _UNITS[sensor]
    span, slash, period = value.partition("/")
    ends = span.split("..")
    if len(ends) > 2 or (slash and len(ends) != 2) or (len(ends) == 2 and not slash):
        raise FakeNvmlError(f"{where}: expected a value, or FROM..TO/PERIOD such as 70..90/30s")
    last_unit = _NUMBER.fullmatch(ends[-1].strip().lower())
    implied = last_unit.group(2) if last_unit else ""
    numbers = [_number(e, unit, implied, where) for e in ends]
    for n in numbers:
        _check_range(sensor, n, gpu, where)
    if len(numbers) == 1:
        return Setting(sensor, numbers[0])
    try:
        ms = round(durations.seconds(period) * 1000)
    except ValueError as e:
        raise FakeNvmlError(f"{where}: period {e}") from None
    if not 0 < ms <= MAX_PERIOD_MS:
        raise FakeNvmlError(f"{where}: the period must be at least 1 ms")
    return Setting(sensor, numbers[0], numbers[1], ms)


def _number(text: str, unit: _Unit, implied: str, where: str) -> int:
    text = text.strip().lower()
    if text.startswith("-"):
        raise FakeNvmlError(f"{where}: cannot be negative")
    m = _NUMBER.fullmatch(text)
    suffix = (m.group(2) or implied) if m else None
    if not m or suffix not in unit.units:
        raise FakeNvmlError(f"{where}: expected {unit.hint}")
    return round(float(m.group(1)) * unit.units[suffix])


def _check_range(sensor: Sensor, n: int, gpu: Gpu, where: str) -> None:
    if sensor in (Sensor.UTIL, Sensor.MEM_UTIL) and n > 100:
        raise FakeNvmlError(f"{where}: a utilisation is 0-100%")
    if sensor in (Sensor.TEMPERATURE, Sensor.MEM_TEMPERATURE) and n > 200:
        raise FakeNvmlError(f"{where}: at most 200 C (shutdown is {gpu.temp_shutdown} C)")
    if sensor == Sensor.POWER and n > 10 * max(gpu.power_max_mw, 1000):
        raise FakeNvmlError(f"{where}: more than 10x the board's {gpu.power_max_mw // 1000} W")
    slot = sensor - Sensor.GRAPHICS_CLOCK
    if 0 <= slot < 4 and n > gpu.max_clocks[slot]:
        raise FakeNvmlError(f"{where}: above GPU {gpu.index}'s max {gpu.max_clocks[slot]} MHz")


def _pstate(value: str, gpu: Gpu, where: str) -> int:
    m = re.fullmatch(r"[pP]?(\d+)", value)
    if not m or int(m.group(1)) > 15:
        raise FakeNvmlError(f"{where}: expected a P-state P0-P15")
    p = int(m.group(1))
    if gpu.pstates and p not in gpu.pstates:
        have = ", ".join(f"P{s}" for s in gpu.pstates)
        raise FakeNvmlError(f"{where}: GPU {gpu.index} ({gpu.name}) has only {have}")
    return p


def _reasons(value: str, where: str) -> int:
    text = value.strip().lower()
    if text == "none":
        return 0
    if re.fullmatch(r"0x[0-9a-f]+|\d+", text):
        mask = int(text, 0)
        if mask & ~sum(CLOCK_REASONS.values()):
            raise FakeNvmlError(f"{where}: bits outside nvmlClocksEventReasonAll (0x1ff)")
        return mask
    mask = 0
    for name in text.split("+"):
        if name not in CLOCK_REASONS:
            raise FakeNvmlError(f"{where}: {name!r} is not one of {', '.join(CLOCK_REASONS)}")
        mask |= CLOCK_REASONS[name]
    return mask


# --------------------------------------------------------------------------- processes

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(b|kib|mib|gib|tib|kb|mb|gb|tb)?", re.I)
_SIZE_UNIT = {
    None: 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip


def size_bytes(text: str) -> int:
    """`2GiB`, `512MiB`, `1.5GB`, or bytes; FakeNvmlError otherwise (never negative)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise FakeNvmlError(f"{text!r}: expected a size such as 2GiB, 512MiB or bytes")
    unit = m.group(2).lower() if m.group(2) else None
    return round(float(m.group(1)) * _SIZE_UNIT[unit])


def process_util(sm: int | None, mem: int | None) -> int:
    """A process-add's data2: the process's own SM and memory utilisation (percent), or 0
    (neither given): an even share of its GPU's, as the library computes it."""
    if sm is None and mem is None:
        return 0
    for flag, value in (("--sm-util", sm), ("--mem-util", mem)):
        if value is not None and not 0 <= value <= 100:
            raise FakeNvmlError(f"{flag} {value}: expected a percentage, 0 to 100")
    return layout.PROC_UTIL | (sm or 0) | (mem or 0) << 8


def process_kinds(kind: str) -> int:
    return {"compute": PROC_COMPUTE, "graphics": PROC_GRAPHICS, "both": 3}[kind]
