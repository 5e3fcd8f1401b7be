"""The binary state format the C library reads (mirrored in src/state_format.h).

Why binary: fixed-size little-endian records are the simplest thing to validate in C —
bounds are known before a byte is parsed, strings are fixed arrays, and a trailing CRC-32
rejects a truncated or torn file. Layout:

    header (200 B) | device record x device_count | crc32 (4 B) of all preceding bytes

A device record is its fixed fields, 36 NVLink slots, then (since version 2) the profile's
capabilities: event types, ECC locations, clocks, P-states, MIG profiles, field values.

Writes are atomic (staged): a temp file in the same directory, fsync, rename.
"""

from __future__ import annotations

import collections
import contextlib
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from fakenvml.errors import FakeNvmlError
from fakenvml.nvmlconst import FIELD_UNKNOWN, MAX_DEVICES, MAX_LINKS, VALUE_DOUBLE, VALUE_SINT

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # imported where used: `inject` reads identities without the dataclasses
    from fakenvml.model import FieldValue, Gpu, Link, MigProfile, Node

STATE_FILE = "state.bin"
MAGIC = b"FNVMLST1"
VERSION = 2  # 2: driver branch in the header, capabilities after the links

HEADER = struct.Struct("<8sIIIIQiI32s32s64s32s")
LINK = struct.Struct("<IIII32s")
# Field order is the C struct's; tests round-trip every field through the library.
DEVICE_FIELDS: list[tuple[str, str]] = [
    ("index", "I"), ("minor", "I"),
    ("uuid", "96s"), ("name", "96s"), ("serial", "32s"), ("part_number", "80s"),
    ("vbios", "32s"), ("inforom", "16s"),
    ("pci_domain", "I"), ("pci_bus", "I"), ("pci_device", "I"), ("pci_function", "I"),
    ("pci_device_id", "I"), ("pci_subsystem_id", "I"), ("bus_id", "32s"),
    ("brand", "I"), ("arch", "I"), ("cc_major", "I"), ("cc_minor", "I"),
    ("memory_total", "Q"), ("memory_reserved", "Q"), ("memory_used", "Q"), ("bar1_total", "Q"),
    ("power_usage_mw", "I"), ("power_limit_mw", "I"), ("power_min_mw", "I"),
    ("power_max_mw", "I"), ("power_default_mw", "I"), ("_pad0", "I"),
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
]  # fmt: skip
DEVICE_HEAD = struct.Struct("<" + "".join(f for _, f in DEVICE_FIELDS))
MAX_MIG_PROFILES, MAX_FIELDS, MAX_MEM_CLOCKS, MAX_PSTATES = 8, 80, 4, 4
# event_types, clock_event_reasons, ecc_locations, display_mode, app_clocks, boost_clocks,
# mem_clocks, mem_clock_count, gfx_clock_min, gfx_clock_step, pstates, pstate_count,
# row_remap_max, conf_compute, mig_count, field_count
CAPS = struct.Struct("<QQII4I4I4IIII4IIIIII")
MIG = struct.Struct("<14IQ32s")
FIELD = struct.Struct("<IIQ")
DEVICE_SIZE = (
    DEVICE_HEAD.size + MAX_LINKS * LINK.size + CAPS.size
    + MAX_MIG_PROFILES * MIG.size + MAX_FIELDS * FIELD.size
)  # fmt: skip
CRC = struct.Struct("<I")
_NUMA_NONE = 0xFFFFFFFF


def _enc(text: str, size: int, what: str) -> bytes:
    raw = text.encode()
    if len(raw) >= size:
        raise FakeNvmlError(f"{what} {text!r} is {len(raw)} bytes; at most {size - 1} fit")
    return raw


def _pack_link(link: Link | None) -> bytes:
    if link is None:
        return LINK.pack(0, 0, 0, 0, b"")
    return LINK.pack(
        int(link.active),
        link.remote_kind,
        link.remote_index,
        link.remote_device_id,
        _enc(link.remote_bus_id, 32, "NVLink remote bus id"),
    )


def _pack_device(gpu: Gpu) -> bytes:
    if len(gpu.links) > MAX_LINKS:
        raise FakeNvmlError(f"GPU {gpu.index} has {len(gpu.links)} NVLinks; at most {MAX_LINKS}")
    values: list[object] = []
    for name, fmt in DEVICE_FIELDS:
        if name == "_pad0":
            values.append(0)
        elif name == "minor":
            values.append(gpu.index if gpu.minor < 0 else gpu.minor)
        elif name == "bus_id":
            values.append(_enc(gpu.bus_id, 32, "PCI bus id"))
        elif name == "nvlink_count":
            values.append(len(gpu.links))
        elif name == "numa_node":
            values.append(_NUMA_NONE if gpu.numa_node < 0 else gpu.numa_node)
        elif fmt.endswith("s"):
            values.append(_enc(getattr(gpu, name), int(fmt[:-1]), name))
        elif fmt == "4I":
            values.extend(getattr(gpu, name))
        else:
            values.append(int(getattr(gpu, name)))
    links = [_pack_link(gpu.links[i] if i < len(gpu.links) else None) for i in range(MAX_LINKS)]
    return DEVICE_HEAD.pack(*values) + b"".join(links) + _pack_caps(gpu)


def _fixed(values: tuple[int, ...], size: int, what: str) -> list[int]:
    if len(values) > size:
        raise FakeNvmlError(f"{what}: at most {size}, found {len(values)}")
    return [*values, *[0] * (size - len(values))]


def _pack_field(field_id: int, fv: FieldValue) -> bytes:
    kind, value = fv
    if kind == VALUE_DOUBLE:
        (bits,) = struct.unpack("<Q", struct.pack("<d", float(value)))
    else:
        bits = int(value) & 0xFFFFFFFFFFFFFFFF  # signed values as two's complement
    return FIELD.pack(field_id, kind, bits)


def _pack_mig(m: MigProfile) -> bytes:
    starts = sum(1 << s for s in m.placement_starts)
    return MIG.pack(
        m.profile, m.id, int(m.is_p2p), m.slice_count, m.instance_count, m.multiprocessors,
        m.copy_engines, m.decoders, m.encoders, m.jpegs, m.ofas, m.placement_size, starts, 0,
        m.memory_mib, _enc(m.name, 32, "MIG profile name"),
    )  # fmt: skip


def _pack_caps(gpu: Gpu) -> bytes:
    if len(gpu.mig_profiles) > MAX_MIG_PROFILES or len(gpu.fields) > MAX_FIELDS:
        raise FakeNvmlError(
            f"GPU {gpu.index}: at most {MAX_MIG_PROFILES} MIG profiles and {MAX_FIELDS} fields"
        )
    assert gpu.app_clocks is not None and gpu.boost_clocks is not None
    caps = CAPS.pack(
        gpu.event_types, gpu.clock_event_reasons, gpu.ecc_locations, gpu.display_mode,
        *gpu.app_clocks, *gpu.boost_clocks,
        *_fixed(gpu.mem_clocks, MAX_MEM_CLOCKS, "memory clocks"), len(gpu.mem_clocks),
        gpu.gfx_clock_min, gpu.gfx_clock_step,
        *_fixed(gpu.pstates, MAX_PSTATES, "P-states"), len(gpu.pstates),
        gpu.row_remap_max, int(gpu.conf_compute), len(gpu.mig_profiles), len(gpu.fields),
    )  # fmt: skip
    migs = [_pack_mig(m) for m in gpu.mig_profiles]
    migs += [bytes(MIG.size)] * (MAX_MIG_PROFILES - len(migs))
    fields = [_pack_field(i, fv) for i, fv in sorted(gpu.fields.items())]
    fields += [bytes(FIELD.size)] * (MAX_FIELDS - len(fields))
    return caps + b"".join(migs) + b"".join(fields)


def pack(node: Node, boot_id: int) -> bytes:
    """The bytes of state.bin for `node`; raises FakeNvmlError on values that do not fit."""
    if not 1 <= len(node.gpus) <= MAX_DEVICES:
        raise FakeNvmlError(f"a node holds 1 to {MAX_DEVICES} GPUs, not {len(node.gpus)}")
    head = HEADER.pack(
        MAGIC,
        VERSION,
        HEADER.size,
        DEVICE_SIZE,
        len(node.gpus),
        boot_id,
        node.cuda_driver_version,
        0,
        _enc(node.driver_version, 32, "driver version"),
        _enc(node.nvml_version, 32, "NVML version"),
        _enc(node.name, 64, "node name"),
        _enc(node.driver_branch, 32, "driver branch"),
    )
    body = head + b"".join(_pack_device(g) for g in node.gpus)
    return body + CRC.pack(zlib.crc32(body))


def _dec(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


# What names a GPU on the command line (index, uuid, serial, bus_id), and a state's node
# name, boot id and GPU names, read without building the model.
GpuId = collections.namedtuple("GpuId", "index uuid serial bus_id")
Identities = collections.namedtuple("Identities", "node boot_id gpus")


def _checked(data: bytes) -> tuple[bytes, tuple]:  # type: ignore[type-arg]
    """(body, header fields) of state.bin bytes; FakeNvmlError when malformed."""
    if len(data) < HEADER.size + CRC.size:
        raise FakeNvmlError(f"state file is {len(data)} bytes: truncated")
    (body, (crc,)) = data[: -CRC.size], CRC.unpack(data[-CRC.size :])
    if zlib.crc32(body) != crc:
        raise FakeNvmlError("state file checksum mismatch: truncated or torn write")
    header = HEADER.unpack_from(body)
    magic, version, hsize, dsize, count = header[:5]
    if magic != MAGIC or version != VERSION or hsize != HEADER.size or dsize != DEVICE_SIZE:
        raise FakeNvmlError("state file has a different format version; re-run `fakenvml init`")
    if len(body) != HEADER.size + count * DEVICE_SIZE:
        raise FakeNvmlError("state file length does not match its device count")
    return body, header


def unpack(data: bytes) -> tuple[Node, int]:
    """Parse state.bin bytes back into (node, boot_id); FakeNvmlError when malformed."""
    from fakenvml.model import Node

    body, header = _checked(data)
    _, _, _, _, count, boot_id, cuda, _, drv, nvml, name, branch = header
    gpus = [_unpack_device(body, HEADER.size + i * DEVICE_SIZE) for i in range(count)]
    node = Node(_dec(name), gpus, _dec(drv), _dec(nvml), cuda, _dec(branch))
    return node, boot_id


_ID_FIELDS = [
    DEVICE_FIELDS.index((n, f)) for n, f in DEVICE_FIELDS if n in ("uuid", "serial", "bus_id")
]
_ID_OFFSETS = [struct.calcsize("<" + "".join(f for _, f in DEVICE_FIELDS[:i])) for i in _ID_FIELDS]


def identities(state_dir: Path) -> Identities:
    """The node's name, boot id and each GPU's names: what `inject` needs, parsed from the
    same checked bytes as `read` but without the model (about a tenth of the time)."""
    body, header = _checked(_read_bytes(state_dir))
    count, boot_id, name = header[4], header[5], header[10]
    (uuid_at, serial_at, bus_at) = _ID_OFFSETS
    gpus = []
    for i in range(count):
        at = HEADER.size + i * DEVICE_SIZE
        gpus.append(GpuId(i, _dec(body[at + uuid_at : at + uuid_at + 96]),
                          _dec(body[at + serial_at : at + serial_at + 32]),
                          _dec(body[at + bus_at : at + bus_at + 32])))  # fmt: skip
    return Identities(_dec(name), boot_id, gpus)


def _unpack_device(body: bytes, offset: int) -> Gpu:
    from fakenvml.model import Gpu, Link

    values = list(DEVICE_HEAD.unpack_from(body, offset))
    kw: dict[str, object] = {}
    for name, fmt in DEVICE_FIELDS:
        if fmt == "4I":
            kw[name], values = tuple(values[:4]), values[4:]
            continue
        value = values.pop(0)
        kw[name] = _dec(value) if fmt.endswith("s") else value
    nlinks = int(kw.pop("nvlink_count"))  # type: ignore[arg-type]
    for key in ("_pad0", "bus_id"):
        kw.pop(key)
    if kw["numa_node"] == _NUMA_NONE:
        kw["numa_node"] = -1
    for key in ("ecc_enabled", "persistence", "multi_gpu_board"):
        kw[key] = bool(kw[key])
    links = []
    for i in range(nlinks):
        active, kind, remote, dev_id, bus = LINK.unpack_from(
            body, offset + DEVICE_HEAD.size + i * LINK.size
        )
        links.append(Link(kind, remote, _dec(bus), dev_id, bool(active)))
    kw.update(_unpack_caps(body, offset + DEVICE_HEAD.size + MAX_LINKS * LINK.size))
    return Gpu(links=links, **kw)  # type: ignore[arg-type]


def _unpack_caps(body: bytes, offset: int) -> dict[str, object]:
    from fakenvml.model import MigProfile

    v = CAPS.unpack_from(body, offset)
    events, reasons, locations, display = v[:4]
    app, boost, mem = tuple(v[4:8]), tuple(v[8:12]), v[12:16]
    nmem, gmin, gstep, pst, npst = v[16], v[17], v[18], v[19:23], v[23]
    remap, conf, nmig, nfields = v[24:28]
    offset += CAPS.size
    migs = []
    for i in range(nmig):
        m = MIG.unpack_from(body, offset + i * MIG.size)
        starts = tuple(s for s in range(32) if m[12] >> s & 1)
        migs.append(
            MigProfile(
                profile=m[0],
                id=m[1],
                is_p2p=bool(m[2]),
                slice_count=m[3],
                instance_count=m[4],
                multiprocessors=m[5],
                copy_engines=m[6],
                decoders=m[7],
                encoders=m[8],
                jpegs=m[9],
                ofas=m[10],
                placement_size=m[11],
                placement_starts=starts,
                memory_mib=m[14],
                name=_dec(m[15]),
            )
        )
    offset += MAX_MIG_PROFILES * MIG.size
    fields: dict[int, FieldValue] = {}
    for i in range(nfields):
        fid, kind, bits = FIELD.unpack_from(body, offset + i * FIELD.size)
        value: int | float = bits
        if kind == VALUE_DOUBLE:
            (value,) = struct.unpack("<d", struct.pack("<Q", bits))
        elif kind == VALUE_SINT or (kind != FIELD_UNKNOWN and bits >> 63):
            value = bits - (1 << 64) if bits >> 63 else bits
        fields[fid] = (kind, value)
    return {
        "event_types": events, "clock_event_reasons": reasons, "ecc_locations": locations,
        "display_mode": display, "app_clocks": app, "boost_clocks": boost,
        "mem_clocks": tuple(mem[:nmem]), "gfx_clock_min": gmin, "gfx_clock_step": gstep,
        "pstates": tuple(pst[:npst]), "row_remap_max": remap, "conf_compute": bool(conf),
        "mig_profiles": migs, "fields": fields,
    }  # fmt: skip


class _Staged:
    def __init__(self, tmp: str, path: Path) -> None:
        self.tmp, self.path = tmp, path

    def commit(self) -> None:
        os.replace(self.tmp, self.path)  # atomic: readers see the old or the new file


@contextlib.contextmanager
def staged(path: Path, data: bytes) -> Iterator[_Staged]:
    """Write `data` to a synced temp file beside `path`; commit() renames it into place.
    Left uncommitted (an error, or the caller's choice), the temp file is removed."""
    import tempfile  # here: the commands that only append (inject, set) start faster

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        yield _Staged(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_bytes(state_dir: Path) -> bytes:
    path = Path(state_dir) / STATE_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FakeNvmlError(f"no state in {state_dir}: run `fakenvml init` first") from None
    except OSError as e:
        raise FakeNvmlError(f"cannot read {path}: {e.strerror}") from None


def read(state_dir: Path) -> tuple[Node, int]:
    return unpack(_read_bytes(state_dir))
