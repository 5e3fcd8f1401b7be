"""The binary state format the C library reads (mirrored in src/state_format.h).

Why binary: fixed-size little-endian records are the simplest thing to validate in C —
bounds are known before a byte is parsed, strings are fixed arrays, and a trailing CRC-32
rejects a truncated or torn file. Layout:

    header (168 B) | device record x device_count | crc32 (4 B) of all preceding bytes

Writes are atomic (staged): a temp file in the same directory, fsync, rename.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from fakenvml.errors import FakeNvmlError
from fakenvml.model import MAX_DEVICES, MAX_LINKS, Gpu, Link, Node

STATE_FILE = "state.bin"
MAGIC = b"FNVMLST1"
VERSION = 1

HEADER = struct.Struct("<8sIIIIQiI32s32s64s")
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
DEVICE_SIZE = DEVICE_HEAD.size + MAX_LINKS * LINK.size
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
    return DEVICE_HEAD.pack(*values) + b"".join(links)


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
    )
    body = head + b"".join(_pack_device(g) for g in node.gpus)
    return body + CRC.pack(zlib.crc32(body))


def _dec(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def unpack(data: bytes) -> tuple[Node, int]:
    """Parse state.bin bytes back into (node, boot_id); FakeNvmlError when malformed."""
    if len(data) < HEADER.size + CRC.size:
        raise FakeNvmlError(f"state file is {len(data)} bytes: truncated")
    (body, (crc,)) = data[: -CRC.size], CRC.unpack(data[-CRC.size :])
    if zlib.crc32(body) != crc:
        raise FakeNvmlError("state file checksum mismatch: truncated or torn write")
    magic, version, hsize, dsize, count, boot_id, cuda, _, drv, nvml, name = HEADER.unpack_from(
        body
    )
    if magic != MAGIC or version != VERSION or hsize != HEADER.size or dsize != DEVICE_SIZE:
        raise FakeNvmlError("state file has a different format version; re-run `fakenvml init`")
    if len(body) != HEADER.size + count * DEVICE_SIZE:
        raise FakeNvmlError("state file length does not match its device count")
    gpus = [_unpack_device(body, HEADER.size + i * DEVICE_SIZE) for i in range(count)]
    node = Node(_dec(name), gpus, _dec(drv), _dec(nvml), cuda)
    return node, boot_id


def _unpack_device(body: bytes, offset: int) -> Gpu:
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
    return Gpu(links=links, **kw)  # type: ignore[arg-type]


class _Staged:
    def __init__(self, tmp: str, path: Path) -> None:
        self.tmp, self.path = tmp, path

    def commit(self) -> None:
        os.replace(self.tmp, self.path)  # atomic: readers see the old or the new file


@contextlib.contextmanager
def staged(path: Path, data: bytes) -> Iterator[_Staged]:
    """Write `data` to a synced temp file beside `path`; commit() renames it into place.
    Left uncommitted (an error, or the caller's choice), the temp file is removed."""
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


def read(state_dir: Path) -> tuple[Node, int]:
    path = Path(state_dir) / STATE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FakeNvmlError(f"no state in {state_dir}: run `fakenvml init` first") from None
    except OSError as e:
        raise FakeNvmlError(f"cannot read {path}: {e.strerror}") from None
    return unpack(data)
