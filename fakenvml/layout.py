"""The C library's formats as Python reads and writes them: one table per struct of
src/state_format.h, and its FNV_ numbers under the same names less the prefix.

The header is the source (the compiler checks its own layouts; the library is what every
NVML client runs). This module is its one Python copy: statefile.py, journal.py and
mig.py take every struct format, offset and number from here, none of their own, and
tests/fakenvml/test_layout.py compiles a program against the header and holds each struct,
field (offset and size), #define and enum here to it, naming the first that differs. So a
field added on one side and not the other fails a test, not a node.

Why not the other way round (a Python table generating the header): the C side would
then build from generated text, and every reader of the C would read generated text; a
check costs one small compile in the tests instead.

Each field is (C name, format): a struct code for little-endian, packed fields ('I',
'Q', 'i', 'B', '32s' for char[32], '4I' for uint32_t[4], '40x' for bytes nobody reads),
or (Layout, count) for an array of structs. Fields named pad* or reserved* pack as zero.
"""

from __future__ import annotations

import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

# #define FNV_* in src/state_format.h, without the prefix.
STATE_FILE = "state.bin"
JOURNAL_FILE = "journal.bin"
GEN_FILE = "journal.gen"
STATE_MAGIC = b"FNVMLST1"
JOURNAL_MAGIC = b"FNVMLJR1"
GEN_MAGIC = b"FNVMLGN1"
COUNTERS_FILE = "knobs.bin"
COUNTERS_MAGIC = b"FNVMLKC1"
MAX_COUNTED = 4096  # counted fail knobs per init: slots in knobs.bin
NO_SLOT = 0xFFFFFFFF  # a counted knob with no slot counts in each process
FORMAT_VERSION = 2  # state.bin; 2 added the driver branch and the profile tail
JOURNAL_VERSION = 1
MAX_DEVICES = 4096
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvml.h 13.x; NVIDIA's plugin probes 0..35
NO_NUMA = 0xFFFFFFFF
MAX_MIG_PROFILES = 8
MAX_FIELDS = 80
MAX_MEM_CLOCKS = 4
MAX_PSTATES = 4
FIELD_UNKNOWN = 0xFFFFFFFF  # a field value's type: ids the driver rejects (id..value)
PLATFORM_BARE_METAL = 0
PLATFORM_VM_PASSTHROUGH = 1  # the GPUs passed through to a virtual machine
ALL_GPUS = 0xFFFFFFFF  # fail / delay / clear: every GPU, and calls that name none
SET_IDLE = 0xFFFFFFFF  # a `set` record back to the profile's value
NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t gpuInstanceId/computeInstanceId outside MIG
PROC_COMPUTE = 1
PROC_GRAPHICS = 2
MAX_PROCESSES = 64  # per GPU
PROC_UTIL = 0x10000  # a process-add's data2: SM % | memory % << 8 given
KNOB_VERSIONS = 1  # a knob also matches the function's _vN versions
CLEAR_FAIL = 1
CLEAR_DELAY = 2
ALWAYS = 2**32  # a fail-when's probability 1 (fixed point, 2^-32 units)
MIG_GIS = 15  # GPU instance ids 0-14
MIG_CIS = 8  # compute instance ids 0-7
ANY = 0xFFFFFFFF  # a MIG create's instance id or placement start: the first that fits


class Span:
    """A run of fixed-size fields, packed and unpacked by name."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields
        self.struct = struct.Struct("<" + "".join(code for _, code in fields))
        self.size = self.struct.size
        # How many values each field takes: 0 (padding), 1, or an array's length.
        self._arity = [(name, _arity(code)) for name, code in fields]

    def pack(self, values: dict[str, Any]) -> bytes:
        """Every field by name (KeyError names a missing one); pad* and reserved* are 0."""
        args: list[object] = []
        for name, n in self._arity:
            if n == 0:
                continue
            if name.startswith(("pad", "reserved")) and name not in values:
                args.extend([0] * n)
            elif n == 1:
                args.append(values[name])
            else:
                args.extend(values[name])
        return self.struct.pack(*args)

    def unpack_from(self, buf: bytes, offset: int = 0) -> dict[str, Any]:
        """name -> value: an int, bytes (NUL padded), or a tuple for an array."""
        flat = self.struct.unpack_from(buf, offset)
        out: dict[str, Any] = {}
        at = 0
        for name, n in self._arity:
            if n == 1:
                out[name] = flat[at]
            elif n > 1:
                out[name] = flat[at : at + n]
            at += n
        return out


def _arity(code: str) -> int:
    count = int(code[:-1]) if code[:-1] else 1
    if code.endswith("x"):
        return 0
    return 1 if code.endswith("s") else count


Field = tuple[str, "str | tuple[Layout, int]"]


class Layout:
    """One C struct: its fields in order, their offsets and sizes."""

    def __init__(self, c_name: str, fields: list[Field]) -> None:
        self.c_name = c_name
        self.fields = fields
        self.offsets: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        at = 0
        for name, kind in fields:
            size = (
                kind[0].size * kind[1] if isinstance(kind, tuple) else struct.calcsize(f"<{kind}")
            )
            self.offsets[name], self.sizes[name] = at, size
            at += size
        self.size = at

    def span(self, first: str | None = None, last: str | None = None) -> Span:
        """The fields from `first` to `last` (default: all), none of them an array of
        structs, as one Span."""
        names = [name for name, _ in self.fields]
        i = names.index(first) if first else 0
        j = names.index(last) + 1 if last else len(names)
        run = self.fields[i:j]
        nested = [name for name, kind in run if isinstance(kind, tuple)]
        if nested:
            raise ValueError(f"{self.c_name}: {', '.join(nested)} are arrays of structs")
        return Span(run)  # type: ignore[arg-type]


HEADER = Layout("fnv_header", [
    ("magic", "8s"), ("version", "I"), ("header_size", "I"), ("device_size", "I"),
    ("device_count", "I"), ("boot_id", "Q"), ("cuda_driver_version", "i"), ("platform", "I"),
    ("driver_version", "32s"), ("nvml_version", "32s"), ("node_name", "64s"),
    ("driver_branch", "32s"),
])  # fmt: skip

LINK = Layout("fnv_link", [
    ("active", "I"), ("remote_kind", "I"), ("remote_index", "I"), ("remote_device_id", "I"),
    ("remote_bus_id", "32s"),
])  # fmt: skip

MIG_PROFILE = Layout("fnv_mig_profile", [
    ("profile", "I"), ("id", "I"), ("is_p2p", "I"), ("slice_count", "I"),
    ("instance_count", "I"), ("multiprocessors", "I"), ("copy_engines", "I"),
    ("decoders", "I"), ("encoders", "I"), ("jpegs", "I"), ("ofas", "I"),
    ("placement_size", "I"), ("placement_starts", "I"), ("pad", "I"), ("memory_mib", "Q"),
    ("name", "32s"),
])  # fmt: skip

FIELD = Layout("fnv_field", [("id", "I"), ("type", "I"), ("value", "Q")])

DEVICE = Layout("fnv_device", [
    ("index", "I"), ("minor", "I"),
    ("uuid", "96s"), ("name", "96s"), ("serial", "32s"), ("part_number", "80s"),
    ("vbios", "32s"), ("inforom", "16s"),
    ("pci_domain", "I"), ("pci_bus", "I"), ("pci_device", "I"), ("pci_function", "I"),
    ("pci_device_id", "I"), ("pci_subsystem_id", "I"), ("bus_id", "32s"),
    ("brand", "I"), ("arch", "I"), ("cc_major", "I"), ("cc_minor", "I"),
    ("memory_total", "Q"), ("memory_reserved", "Q"), ("memory_used", "Q"), ("bar1_total", "Q"),
    ("power_usage_mw", "I"), ("power_limit_mw", "I"), ("power_min_mw", "I"),
    ("power_max_mw", "I"), ("power_default_mw", "I"), ("nvlink_board", "I"),
    ("energy_mj", "Q"),
    ("temp_gpu", "I"), ("temp_slowdown", "I"), ("temp_shutdown", "I"), ("temp_gpu_max", "I"),
    ("temp_mem_max", "I"), ("fan_count", "I"), ("fan_speed", "I"),
    ("clocks", "4I"), ("max_clocks", "4I"),
    ("util_gpu", "I"), ("util_mem", "I"), ("pstate", "I"),
    ("ecc_enabled", "I"), ("persistence", "I"), ("compute_mode", "I"),
    ("numa_node", "I"), ("cpu_first", "I"), ("cpu_count", "I"),
    ("pcie_switch", "I"), ("pcie_upper_switch", "I"), ("host_bridge", "I"),
    ("pcie_gen", "I"), ("pcie_width", "I"),
    ("board_id", "I"), ("multi_gpu_board", "I"),
    ("nvlink_version", "I"), ("nvlink_count", "I"),
    ("num_cores", "I"), ("memory_bus_width", "I"),
    ("links", (LINK, MAX_LINKS)),
    # The profile's capabilities (format 2).
    ("event_types", "Q"), ("clock_event_reasons", "Q"), ("ecc_locations", "I"),
    ("display_mode", "I"), ("app_clocks", "4I"), ("boost_clocks", "4I"),
    ("mem_clocks", f"{MAX_MEM_CLOCKS}I"), ("mem_clock_count", "I"),
    ("gfx_clock_min", "I"), ("gfx_clock_step", "I"),
    ("pstates", f"{MAX_PSTATES}I"), ("pstate_count", "I"),
    ("row_remap_max", "I"), ("conf_compute", "I"), ("mig_count", "I"), ("field_count", "I"),
    ("mig", (MIG_PROFILE, MAX_MIG_PROFILES)),
    ("fields", (FIELD, MAX_FIELDS)),
])  # fmt: skip

JOURNAL_HEADER = Layout("fnv_journal_header", [
    ("magic", "8s"), ("version", "I"), ("record_size", "I"), ("boot_id", "Q"),
    ("reserved", "40x"),
])  # fmt: skip

GEN = Layout("fnv_gen", [
    ("magic", "8s"), ("boot_id", "Q"), ("committed", "Q"), ("reserved", "40x"),
])  # fmt: skip

COUNTERS = Layout("fnv_counters", [
    ("magic", "8s"), ("boot_id", "Q"), ("slots", "I"), ("next", "I"), ("reserved", "40x"),
])  # fmt: skip
COUNTER = Layout("fnv_counter", [("calls", "Q"), ("fails", "Q")])

# gpu_instance / compute_instance share their words with arg0 / arg1 (a union in C).
RECORD = Layout("fnv_record", [
    ("seq", "Q"), ("realtime_ns", "Q"), ("monotonic_ns", "Q"), ("kind", "I"), ("gpu", "I"),
    ("data", "Q"), ("gpu_instance", "I"), ("compute_instance", "I"), ("data2", "Q"),
    ("reserved", "4x"), ("crc", "I"),
])  # fmt: skip

MIG_CI = Layout("fnv_ci", [("used", "B"), ("profile", "B"), ("start", "B"), ("slices", "B")])
MIG_GI = Layout("fnv_gi", [
    ("used", "B"), ("prof", "B"), ("start", "B"), ("pad", "B"), ("ci", (MIG_CI, MIG_CIS)),
])  # fmt: skip
MIG_LAYOUT = Layout("fnv_mig", [("current", "I"), ("pending", "I"), ("gi", (MIG_GI, MIG_GIS))])

# Every struct of the header, for the test that holds them to it.
LAYOUTS = [
    HEADER, LINK, MIG_PROFILE, FIELD, DEVICE, JOURNAL_HEADER, GEN, COUNTERS, COUNTER, RECORD,
    MIG_CI, MIG_GI, MIG_LAYOUT,
]  # fmt: skip
