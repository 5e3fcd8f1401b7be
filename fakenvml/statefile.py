"""The binary state format the C library reads (src/state_format.h, through the one table
of it in fakenvml/layout.py).

Why binary: fixed-size little-endian records are the simplest thing to validate in C —
bounds are known before a byte is parsed, strings are fixed arrays, and a trailing CRC-32
rejects a truncated or torn file. Layout:

    header (fnv_header) | device record (fnv_device) x device_count | crc32 (4 B) of all
    preceding bytes

A device record is its fixed fields, 36 NVLink slots, then (since version 2) the profile's
capabilities: event types, ECC locations, clocks, P-states, MIG profiles, field values.
Every field is packed and read by its C name; layout.py has the offsets.

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

from fakenvml import layout
from fakenvml.errors import FakeNvmlError
from fakenvml.layout import (
    DEVICE,
    FIELD_UNKNOWN,
    MAX_DEVICES,
    MAX_FIELDS,
    MAX_LINKS,
    MAX_MIG_PROFILES,
    NO_NUMA,
)
from fakenvml.nvmlconst import VALUE_DOUBLE, VALUE_SINT

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # imported where used: `inject` reads identities without the dataclasses
    from typing import Any

    from fakenvml.model import FieldValue, Gpu, Link, MigProfile, Node

STATE_FILE = layout.STATE_FILE
HEADER = layout.HEADER.span()
LINK = layout.LINK.span()
MIG = layout.MIG_PROFILE.span()
FIELD = layout.FIELD.span()
# The device record's runs of plain fields, around its arrays of links, MIG profiles and
# field values.
DEVICE_HEAD = DEVICE.span("index", "memory_bus_width")
CAPS = DEVICE.span("event_types", "field_count")
CRC = struct.Struct("<I")
# Fields the model keeps under another shape (counts of its lists, -1 for no NUMA node).
_DERIVED = ("minor", "bus_id", "nvlink_count", "numa_node")
_STRINGS = [name for name, code in DEVICE_HEAD.fields if code.endswith("s")]
_BOOLS = ("ecc_enabled", "persistence", "multi_gpu_board")


def _enc(text: str, size: int, what: str) -> bytes:
    raw = text.encode()
    if len(raw) >= size:
        raise FakeNvmlError(f"{what} {text!r} is {len(raw)} bytes; at most {size - 1} fit")
    return raw


def _pack_link(link: Link | None) -> bytes:
    if link is None:
        return bytes(LINK.size)
    return LINK.pack({
        "active": int(link.active), "remote_kind": link.remote_kind,
        "remote_index": link.remote_index, "remote_device_id": link.remote_device_id,
        "remote_bus_id": _enc(link.remote_bus_id, 32, "NVLink remote bus id"),
    })  # fmt: skip


def pack_device(gpu: Gpu) -> bytes:
    """One GPU's device record (fnv_device) as state.bin holds it; FakeNvmlError on values
    that do not fit. (fakenvml/mig.py hands it to the library's MIG rules too.)"""
    if len(gpu.links) > MAX_LINKS:
        raise FakeNvmlError(f"GPU {gpu.index} has {len(gpu.links)} NVLinks; at most {MAX_LINKS}")
    values: dict[str, Any] = {
        name: getattr(gpu, name) for name, _ in DEVICE_HEAD.fields if name not in _DERIVED
    }
    for name in _STRINGS:
        if name != "bus_id":
            values[name] = _enc(values[name], DEVICE.sizes[name], name)
    values.update(
        minor=gpu.index if gpu.minor < 0 else gpu.minor,
        bus_id=_enc(gpu.bus_id, DEVICE.sizes["bus_id"], "PCI bus id"),
        nvlink_count=len(gpu.links),
        numa_node=NO_NUMA if gpu.numa_node < 0 else gpu.numa_node,
    )
    for name in _BOOLS:
        values[name] = int(values[name])
    links = [_pack_link(gpu.links[i] if i < len(gpu.links) else None) for i in range(MAX_LINKS)]
    return DEVICE_HEAD.pack(values) + b"".join(links) + _pack_caps(gpu)


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
    return FIELD.pack({"id": field_id, "type": kind, "value": bits})


def _pack_mig(m: MigProfile) -> bytes:
    values = {name: getattr(m, name) for name, _ in MIG.fields if hasattr(m, name)}
    values.update(
        is_p2p=int(m.is_p2p),
        placement_starts=sum(1 << s for s in m.placement_starts),
        name=_enc(m.name, layout.MIG_PROFILE.sizes["name"], "MIG profile name"),
    )
    return MIG.pack(values)


def _pack_caps(gpu: Gpu) -> bytes:
    if len(gpu.mig_profiles) > MAX_MIG_PROFILES or len(gpu.fields) > MAX_FIELDS:
        raise FakeNvmlError(
            f"GPU {gpu.index}: at most {MAX_MIG_PROFILES} MIG profiles and {MAX_FIELDS} fields"
        )
    caps = CAPS.pack({
        "event_types": gpu.event_types, "clock_event_reasons": gpu.clock_event_reasons,
        "ecc_locations": gpu.ecc_locations, "display_mode": gpu.display_mode,
        "app_clocks": gpu.app_clocks, "boost_clocks": gpu.boost_clocks,
        "mem_clocks": _fixed(gpu.mem_clocks, layout.MAX_MEM_CLOCKS, "memory clocks"),
        "mem_clock_count": len(gpu.mem_clocks),
        "gfx_clock_min": gpu.gfx_clock_min, "gfx_clock_step": gpu.gfx_clock_step,
        "pstates": _fixed(gpu.pstates, layout.MAX_PSTATES, "P-states"),
        "pstate_count": len(gpu.pstates), "row_remap_max": gpu.row_remap_max,
        "conf_compute": int(gpu.conf_compute), "mig_count": len(gpu.mig_profiles),
        "field_count": len(gpu.fields),
    })  # fmt: skip
    migs = [_pack_mig(m) for m in gpu.mig_profiles]
    migs += [bytes(MIG.size)] * (MAX_MIG_PROFILES - len(migs))
    fields = [_pack_field(i, fv) for i, fv in sorted(gpu.fields.items())]
    fields += [bytes(FIELD.size)] * (MAX_FIELDS - len(fields))
    return caps + b"".join(migs) + b"".join(fields)


def pack(node: Node, boot_id: int) -> bytes:
    """The bytes of state.bin for `node`; raises FakeNvmlError on values that do not fit."""
    if not 1 <= len(node.gpus) <= MAX_DEVICES:
        raise FakeNvmlError(f"a node holds 1 to {MAX_DEVICES} GPUs, not {len(node.gpus)}")
    head = HEADER.pack({
        "magic": layout.STATE_MAGIC, "version": layout.FORMAT_VERSION,
        "header_size": HEADER.size, "device_size": DEVICE.size, "device_count": len(node.gpus),
        "boot_id": boot_id, "cuda_driver_version": node.cuda_driver_version,
        "driver_version": _enc(node.driver_version, 32, "driver version"),
        "nvml_version": _enc(node.nvml_version, 32, "NVML version"),
        "node_name": _enc(node.name, 64, "node name"),
        "driver_branch": _enc(node.driver_branch, 32, "driver branch"),
        "platform": node.platform,
    })  # fmt: skip
    body = head + b"".join(pack_device(g) for g in node.gpus)
    return body + CRC.pack(zlib.crc32(body))


def _dec(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


# What names a GPU on the command line (index, uuid, serial, bus_id), and a state's node
# name, boot id and GPU names, read without building the model.
GpuId = collections.namedtuple("GpuId", "index uuid serial bus_id")
Identities = collections.namedtuple("Identities", "node boot_id gpus")


def _checked(data: bytes) -> tuple[bytes, dict[str, Any]]:
    """(body, header fields) of state.bin bytes; FakeNvmlError when malformed."""
    if len(data) < HEADER.size + CRC.size:
        raise FakeNvmlError(f"state file is {len(data)} bytes: truncated")
    (body, (crc,)) = data[: -CRC.size], CRC.unpack(data[-CRC.size :])
    if zlib.crc32(body) != crc:
        raise FakeNvmlError("state file checksum mismatch: truncated or torn write")
    h = HEADER.unpack_from(body)
    ours = {"magic": layout.STATE_MAGIC, "version": layout.FORMAT_VERSION,
            "header_size": HEADER.size, "device_size": DEVICE.size}  # fmt: skip
    if any(h[name] != value for name, value in ours.items()):
        raise FakeNvmlError("state file has a different format version; re-run `fakenvml init`")
    if len(body) != HEADER.size + h["device_count"] * DEVICE.size:
        raise FakeNvmlError("state file length does not match its device count")
    return body, h


def unpack(data: bytes) -> tuple[Node, int]:
    """Parse state.bin bytes back into (node, boot_id); FakeNvmlError when malformed."""
    from fakenvml.model import Node

    body, h = _checked(data)
    gpus = [_unpack_device(body, HEADER.size + i * DEVICE.size) for i in range(h["device_count"])]
    node = Node(_dec(h["node_name"]), gpus, _dec(h["driver_version"]), _dec(h["nvml_version"]),
                h["cuda_driver_version"], _dec(h["driver_branch"]), h["platform"])  # fmt: skip
    return node, h["boot_id"]


def identities(state_dir: Path) -> Identities:
    """The node's name, boot id and each GPU's names: what `inject` needs, parsed from the
    same checked bytes as `read` but without the model (about a tenth of the time)."""
    body, h = _checked(_read_bytes(state_dir))
    names = [(DEVICE.offsets[n], DEVICE.sizes[n]) for n in ("uuid", "serial", "bus_id")]
    gpus = []
    for i in range(h["device_count"]):
        at = HEADER.size + i * DEVICE.size
        gpus.append(GpuId(i, *(_dec(body[at + o : at + o + n]) for o, n in names)))
    return Identities(_dec(h["node_name"]), h["boot_id"], gpus)


def _unpack_device(body: bytes, offset: int) -> Gpu:
    from fakenvml.model import Gpu, Link

    kw = DEVICE_HEAD.unpack_from(body, offset)
    for name in _STRINGS:
        kw[name] = _dec(kw[name])
    nlinks = kw.pop("nvlink_count")
    kw.pop("bus_id")
    if kw["numa_node"] == NO_NUMA:
        kw["numa_node"] = -1
    for key in _BOOLS:
        kw[key] = bool(kw[key])
    links = []
    for i in range(min(nlinks, MAX_LINKS)):
        x = LINK.unpack_from(body, offset + DEVICE.offsets["links"] + i * LINK.size)
        links.append(Link(x["remote_kind"], x["remote_index"], _dec(x["remote_bus_id"]),
                          x["remote_device_id"], bool(x["active"])))  # fmt: skip
    kw.update(_unpack_caps(body, offset))
    return Gpu(links=links, **kw)


def _unpack_caps(body: bytes, offset: int) -> dict[str, object]:
    from fakenvml.model import MigProfile

    v = CAPS.unpack_from(body, offset + DEVICE.offsets["event_types"])
    migs = []
    for i in range(v.pop("mig_count")):
        m = MIG.unpack_from(body, offset + DEVICE.offsets["mig"] + i * MIG.size)
        starts = m.pop("placement_starts")
        del m["pad"]
        m.update(
            is_p2p=bool(m["is_p2p"]),
            placement_starts=tuple(s for s in range(32) if starts >> s & 1),
            name=_dec(m["name"]),
        )
        migs.append(MigProfile(**m))
    fields: dict[int, FieldValue] = {}
    for i in range(v.pop("field_count")):
        f = FIELD.unpack_from(body, offset + DEVICE.offsets["fields"] + i * FIELD.size)
        kind, bits = f["type"], f["value"]
        value: int | float = bits
        if kind == VALUE_DOUBLE:
            (value,) = struct.unpack("<d", struct.pack("<Q", bits))
        elif kind == VALUE_SINT or (kind != FIELD_UNKNOWN and bits >> 63):
            value = bits - (1 << 64) if bits >> 63 else bits
        fields[f["id"]] = (kind, value)
    v["mem_clocks"] = v["mem_clocks"][: v.pop("mem_clock_count")]
    v["pstates"] = v["pstates"][: v.pop("pstate_count")]
    v["conf_compute"] = bool(v["conf_compute"])
    return {**v, "mig_profiles": migs, "fields": fields}


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
