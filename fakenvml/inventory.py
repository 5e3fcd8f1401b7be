"""A node's YAML inventory, validated into a model.Node.

    node: dgx-a                       # optional; --node or the file name otherwise
    driver_version: "580.95.05"       # optional; CUDA version follows the branch
    driver_branch: r582_49            # optional; nvmlSystemGetDriverBranch ("r580" otherwise)
    platform: vm-passthrough          # optional; bare-metal otherwise (fakenvml/platforms.py):
                                      # a VM's GPUs answer virtualization mode PASSTHROUGH,
                                      # no NUMA node of their own, and no NVLink
    gpus:
      - {profile: H100-SXM5-80GB, count: 8}
      - {profile: T4, uuid: GPU-..., serial: "...", bus_id: "0000:3b:00.0", memory: 16GiB}
      - {profile: A100-SXM4-80GB, count: 2, mig: all-1g.10gb}   # MIG enabled, 7 instances
      - {profile: H100-SXM5-80GB, mig: "3g.40gb,2g.20gb,1g.10gb"}  # (fakenvml/mig.py)
    topology:
      nvlink: {nvswitch: true}        # or {groups: [[0,1,2,3],[4,5,6,7]]},
                                      # {links: [{gpus: [0, 1], count: 4}]}, false (links
                                      # down), or {hidden: true} (no NVLink at all, as a VM
                                      # without the fabric sees: link getters NOT_SUPPORTED)
      pcie: {gpus_per_switch: 2, switches_per_upper: 2, uppers_per_bridge: 1}
      numa: {nodes: 2, cpus_per_node: 32}   # gpus: [0, 0, 1, 1] places them explicitly

Defaults are what real boxes look like: SXM GPUs sit on 8-GPU NVSwitch baseboards (fewer
than 8 are wired all-to-all), PCIe cards have no NVLink bridge, two GPUs share a PCIe
switch, and GPUs split evenly over two NUMA nodes. Identity is deterministic: UUIDs and
serials derive from (node name, index), so re-running init yields the same devices.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from fakenvml import branches, platforms, profiles, topology, yamlmodel
from fakenvml.errors import FakeNvmlError
from fakenvml.model import MAX_DEVICES, Gpu, Node
from fakenvml.profiles import Profile
from fakenvml.topology import BusAddr, Topology
from fakenvml.yamlmodel import Strict

SYS_PCI_DEVICES = Path("/sys/bus/pci/devices")
# Fake GPUs live in PCI domains no host uses, so nothing that reads
# /sys/bus/pci/devices/<busid>/ (NVIDIA's plugin reads numa_node) finds a real device.
FIRST_FAKE_DOMAIN = 0x0100
GPUS_PER_DOMAIN = 255  # buses 01..ff, one GPU each at device 00, as on real boards
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "fakenvml.gpulab")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_SERIAL = re.compile(r"[0-9A-Za-z-]{1,30}")
_BUS_ID = re.compile(r"([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", re.I)
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|TiB)?", re.I)
_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_DRIVER = re.compile(r"(\d{3})\.\d{1,3}(\.\d{1,3})?")
# --------------------------------------------------------------------------- schema


def _known(lookup: Callable[[str], Any], key: str) -> str:
    """The key as a table spells it (profiles.get, platforms.get), or ValueError."""
    try:
        return lookup(key).key
    except FakeNvmlError as e:
        raise ValueError(str(e)) from None


class GpuEntry(Strict):
    profile: str
    count: int = Field(1, ge=1, le=MAX_DEVICES)
    uuid: str | None = None
    serial: str | None = None
    bus_id: str | None = None
    memory: int | None = Field(None, gt=0)  # bytes; YAML may say 81559MiB or 80GiB
    mig: str | None = Field(None, min_length=1)  # a MIG layout made at init (fakenvml/mig.py)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        return _known(profiles.get, v)

    @field_validator("uuid")
    @classmethod
    def _uuid_shape(cls, v: str) -> str:
        if not _UUID.fullmatch(v):
            raise ValueError(f"expected GPU- and 8-4-4-4-12 hex digits, found {v!r}")
        return "GPU-" + v[4:].lower()

    @field_validator("serial", mode="before")
    @classmethod
    def _serial_shape(cls, v: object) -> object:
        v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if isinstance(v, str) and not _SERIAL.fullmatch(v):
            raise ValueError(f"expected 1-30 letters, digits or '-', found {v!r}")
        return v

    @field_validator("bus_id")
    @classmethod
    def _bus_id_shape(cls, v: str) -> str:
        parse_bus_id(v)
        return v

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_size(cls, v: object) -> object:
        if isinstance(v, str):
            m = _SIZE.fullmatch(v.strip())
            if not m:
                raise ValueError(f"expected bytes or a size like 81559MiB or 80GiB, found {v!r}")
            return int(m.group(1)) * _UNITS[(m.group(2) or "b").lower()]
        return v

    @model_validator(mode="after")
    def _identity_is_per_gpu(self) -> GpuEntry:
        given = [k for k in ("uuid", "serial", "bus_id") if getattr(self, k) is not None]
        if given and self.count != 1:
            raise ValueError(f"{'/'.join(given)} name one GPU; this entry has count {self.count}")
        return self


class Inventory(Strict):
    node: str | None = None
    driver_version: str | None = None
    driver_branch: str | None = Field(None, pattern=r"^r[0-9][0-9_.]{0,30}$")
    cuda_version: str | None = None
    platform: str = platforms.BARE_METAL.key
    gpus: list[GpuEntry] = Field(min_length=1)
    topology: Topology = Topology()

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, v: str) -> str:
        return _known(platforms.get, v)

    @field_validator("driver_version", "cuda_version", mode="before")
    @classmethod
    def _version_text(cls, v: object) -> object:
        # YAML reads `cuda_version: 12.4` as a float; a version is text.
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


# --------------------------------------------------------------------------- public API


def load(
    path: str | Path,
    node_name: str | None = None,
    *,
    sysfs: Path = SYS_PCI_DEVICES,
    driver_version: str | None = None,
) -> Node:
    """Read and validate an inventory file; errors name the file and the bad key."""
    path = Path(path)
    data = yamlmodel.read(path, what="inventory", error=FakeNvmlError)
    try:
        return from_dict(
            data, node_name, sysfs=sysfs, default_name=path.stem, driver_version=driver_version
        )
    except FakeNvmlError as e:
        raise FakeNvmlError(f"{path}: {e}") from None


def from_dict(
    data: object,
    node_name: str | None = None,
    *,
    sysfs: Path = SYS_PCI_DEVICES,
    default_name: str | None = None,
    driver_version: str | None = None,
) -> Node:
    """Validate parsed YAML into a Node; node_name (e.g. --node) overrides `node:`, and
    driver_version (--driver-version) the inventory's `driver_version:`."""
    inv = yamlmodel.validate(Inventory, data, error=FakeNvmlError)
    if driver_version is not None:
        inv = inv.model_copy(update={"driver_version": driver_version})
    name = node_name or inv.node or default_name
    if not name:
        raise FakeNvmlError("no node name: add `node: NAME` or pass --node")
    if not _NODE_NAME.fullmatch(name):
        raise FakeNvmlError(
            f"node name {name!r}: expected 1-63 letters, digits, '.', '_' or '-' "
            "starting with a letter or digit"
        )
    driver, nvml, cuda = _versions(inv)
    entries = [(e, profiles.PROFILES[e.profile]) for e in inv.gpus for _ in range(e.count)]
    if len(entries) > MAX_DEVICES:
        raise FakeNvmlError(f"a node holds 1 to {MAX_DEVICES} GPUs, not {len(entries)}")
    gpus = _build_gpus(entries, name, host_pci_domains(sysfs), branches.of(driver))
    topology.place(gpus, inv.topology.numa, inv.topology.pcie)
    profs = [p for _, p in entries]
    platform = platforms.get(inv.platform)
    nvlink = inv.topology.nvlink
    if nvlink is None and platform.hides_nvlink:
        nvlink = topology.NvlinkSpec(hidden=True)
    topology.wire(gpus, profs, nvlink, _switch_addresses(gpus, sysfs))
    return Node(name, gpus, driver, nvml, cuda, inv.driver_branch or "", platform.code)


def host_pci_domains(sysfs: Path = SYS_PCI_DEVICES) -> set[int]:
    """PCI domains that exist on this host (none when sysfs is absent, e.g. macOS)."""
    try:
        entries = [p.name for p in sysfs.iterdir()]
    except OSError:
        return set()
    return {int(m.group(1), 16) for e in entries if (m := _BUS_ID.fullmatch(e))}


def parse_bus_id(text: str) -> BusAddr:
    """'0000:3b:00.0' or NVML's '00000000:3B:00.0' -> (domain, bus, device, function)."""
    m = _BUS_ID.fullmatch(text.strip())
    if not m:
        raise ValueError(f"expected a PCI bus id like 0000:3b:00.0, found {text!r}")
    domain, bus, device, function = (int(g, 16) for g in m.groups())
    if domain > 0xFFFF or device > 0x1F:
        raise ValueError(f"PCI bus id {text!r}: domain must be <= ffff and device <= 1f")
    return domain, bus, device, function


def valid_driver_version(text: str) -> bool:
    """A driver version as NVML prints it: 580.95.05, 535.261.03, 550.54."""
    return _DRIVER.fullmatch(text) is not None


def default_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def default_serial(node_name: str, index: int) -> str:
    """13 digits like a real board's; the index part keeps serials unique within a node."""
    node_part = int(hashlib.sha256(node_name.encode()).hexdigest(), 16) % 10**7
    return f"1{node_part:07d}{index:05d}"


# --------------------------------------------------------------------------- internals


def _versions(inv: Inventory) -> tuple[str, str, int]:
    default = Node("", [])
    if inv.driver_version is None and inv.cuda_version is None:
        return default.driver_version, default.nvml_version, default.cuda_driver_version
    driver = inv.driver_version or default.driver_version
    if not valid_driver_version(driver):
        raise FakeNvmlError(f"driver_version: expected like 580.95.05, found {driver!r}")
    if inv.cuda_version is not None:
        m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})", inv.cuda_version)
        if not m:
            raise FakeNvmlError(f"cuda_version: expected like 12.4, found {inv.cuda_version!r}")
        cuda = int(m.group(1)) * 1000 + int(m.group(2)) * 10
    else:
        branch = branches.of(driver)
        if not branch.cuda:
            known = ", ".join(str(b) for b, x in branches.BRANCHES.items() if x.cuda)
            raise FakeNvmlError(
                f"driver branch {branch.major} is not one I know the CUDA version of "
                f"(known: {known}); add cuda_version"
            )
        cuda = branch.cuda
    # nvmlSystemGetNVMLVersion is "<CUDA major>.<driver version>", e.g. 12.550.54.15.
    return driver, f"{cuda // 1000}.{driver}", cuda


def _build_gpus(
    entries: list[tuple[GpuEntry, Profile]],
    node_name: str,
    host_domains: set[int],
    branch: branches.Branch,
) -> list[Gpu]:
    explicit = {i: parse_bus_id(e.bus_id) for i, (e, _) in enumerate(entries) if e.bus_id}
    _refuse_duplicates("PCI bus id", {i: _fmt_bus(a) for i, a in explicit.items()})
    free = _default_addresses(host_domains, set(explicit.values()))
    gpus = []
    for i, (entry, profile) in enumerate(entries):
        addr = explicit[i] if i in explicit else next(free)
        gpu = profile.make_gpu(
            i,
            entry.uuid or default_uuid(node_name, i),
            entry.serial or default_serial(node_name, i),
            addr,
            branch,
        )
        if entry.memory is not None:
            _override_memory(gpu, entry.memory, profile)
        if entry.mig is not None:
            from fakenvml import mig  # mig reads state through node, which this must not need

            gpu.mig_layout = entry.mig
            mig.check(gpu, entry.mig)  # a layout that cannot be made: refused before init
        gpus.append(gpu)
    _refuse_duplicates("uuid", {g.index: g.uuid for g in gpus})
    _refuse_duplicates("serial", {g.index: g.serial for g in gpus})
    return gpus


def _override_memory(gpu: Gpu, memory: int, profile: Profile) -> None:
    if memory <= gpu.memory_reserved:
        raise FakeNvmlError(
            f"GPU {gpu.index}: memory {memory} bytes is not above the "
            f"{profile.reserved_mib} MiB the driver reserves on a {profile.key}"
        )
    gpu.memory_total = memory


def _refuse_duplicates(what: str, values: dict[int, str]) -> None:
    first: dict[str, int] = {}
    for index, value in values.items():
        if value in first:
            raise FakeNvmlError(
                f"GPU {first[value]} and GPU {index} have the same {what} {value}; "
                f"each GPU needs its own"
            )
        first[value] = index


def _fake_domains(host_domains: set[int]) -> Iterator[int]:
    for domain in range(FIRST_FAKE_DOMAIN, 0x10000):
        if domain not in host_domains:
            yield domain
    raise FakeNvmlError("no free PCI domain left for fake devices")


def _default_addresses(host_domains: set[int], taken: set[BusAddr]) -> Iterator[BusAddr]:
    for domain in _fake_domains(host_domains):
        for bus in range(1, GPUS_PER_DOMAIN + 1):
            if (domain, bus, 0, 0) not in taken:
                yield domain, bus, 0, 0


def _switch_addresses(gpus: list[Gpu], sysfs: Path) -> Iterator[BusAddr]:
    """NVSwitch addresses: domains past the GPUs', so no switch id equals a GPU's."""
    used = host_pci_domains(sysfs) | {g.pci_domain for g in gpus}
    for domain in _fake_domains(used):
        for bus in range(256):
            for device in range(32):
                yield domain, bus, device, 0


def _fmt_bus(addr: BusAddr) -> str:
    return f"{addr[0]:08X}:{addr[1]:02X}:{addr[2]:02X}.{addr[3]:X}"
