"""A node's topology: the inventory's `topology:` key (its schema) and the policy that
applies it: where GPUs sit (NUMA node, PCIe tree) and how NVLinks wire them.

The C library only compares ids: two GPUs behind the same `pcie_switch` are
NVML_TOPOLOGY_SINGLE apart, the same upper switch MULTIPLE, the same host bridge HOSTBRIDGE,
the same NUMA node NODE, anything else SYSTEM. So the PCIe tree is built inside each NUMA
node, which keeps those levels nested the way real hardware nests them.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field, field_validator, model_validator

from fakenvml.errors import FakeNvmlError
from fakenvml.model import LINK_REMOTE_GPU, LINK_REMOTE_SWITCH, VALUE_UINT, Gpu, Link
from fakenvml.nvmlconst import FI_NVLINK_SPEED_MBPS_COMMON
from fakenvml.profiles import Profile
from fakenvml.yamlmodel import Strict

BusAddr = tuple[int, int, int, int]  # domain, bus, device, function
HGX_BOARD = 8  # GPUs per NVSwitch baseboard (HGX A100/H100/H200/B200)

# --------------------------------------------------------------------------- schema
# Here rather than in inventory.py, which takes `Topology` whole: the policy below reads
# these types, and inventory.py calls the policy.


class NvlinkPair(Strict):
    gpus: list[int] = Field(min_length=2, max_length=2)
    count: int = Field(1, ge=1)


class NvlinkSpec(Strict):
    hidden: bool = False  # the driver shows no NVLink (a GPU passed through to a VM)
    nvswitch: bool = False
    board_size: int | None = Field(None, ge=1)  # GPUs per NVSwitch baseboard (default 8)
    groups: list[list[int]] | None = None
    links: list[NvlinkPair] | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> NvlinkSpec:
        given = {
            "hidden": self.hidden,
            "nvswitch": self.nvswitch,
            "groups": self.groups,
            "links": self.links,
        }
        modes = [k for k, v in given.items() if v not in (None, False)]
        if len(modes) > 1:
            raise ValueError(f"give one of nvswitch, groups or links, not {' and '.join(modes)}")
        if self.board_size is not None and not self.nvswitch:
            raise ValueError("board_size only applies with nvswitch: true")
        return self


class PcieSpec(Strict):
    gpus_per_switch: int = Field(2, ge=1)
    switches_per_upper: int = Field(2, ge=1)
    uppers_per_bridge: int = Field(1, ge=1)


class NumaSpec(Strict):
    nodes: int = Field(2, ge=0, le=1024)  # 0: no NUMA (numa_node -1), as in most VMs
    cpus_per_node: int = Field(32, ge=1, le=65536)
    gpus: list[int] | None = None  # NUMA node of each GPU, by index


class Topology(Strict):
    nvlink: NvlinkSpec | None = None  # None: the profile's default wiring
    pcie: PcieSpec = PcieSpec()
    numa: NumaSpec = NumaSpec()

    @field_validator("nvlink", mode="before")
    @classmethod
    def _nvlink_flag(cls, v: object) -> object:
        # `nvlink: false` keeps the links but connects none; `true` is the default wiring.
        if v is False:
            return {"groups": []}
        return None if v is True else v


# --------------------------------------------------------------------------- policy


def place(gpus: list[Gpu], numa: NumaSpec, pcie: PcieSpec) -> None:
    """Set numa_node, CPU affinity and PCIe switch / upper switch / host bridge ids."""
    n = len(gpus)
    if numa.gpus is not None:
        node_of = _explicit_numa(numa, n)
    elif numa.nodes == 0:
        node_of = [-1] * n
    else:
        node_of = [i * numa.nodes // n for i in range(n)]  # even split, in index order
    by_node: dict[int, list[Gpu]] = {}
    for gpu, node in zip(gpus, node_of, strict=True):
        by_node.setdefault(node, []).append(gpu)
    switch = upper = bridge = 0
    for node in sorted(by_node):
        for k, gpu in enumerate(by_node[node]):
            s = k // pcie.gpus_per_switch
            u = s // pcie.switches_per_upper
            gpu.pcie_switch = switch + s
            gpu.pcie_upper_switch = upper + u
            gpu.host_bridge = bridge + u // pcie.uppers_per_bridge
            gpu.numa_node = node
            gpu.cpu_first = max(node, 0) * numa.cpus_per_node
            gpu.cpu_count = numa.cpus_per_node
        last = by_node[node][-1]
        switch, upper = last.pcie_switch + 1, last.pcie_upper_switch + 1
        bridge = last.host_bridge + 1


def wire(
    gpus: list[Gpu],
    profs: list[Profile],
    spec: NvlinkSpec | None,
    switch_addrs: Iterator[BusAddr],
) -> None:
    """Give every GPU its profile's NVLinks (inactive), then connect them per `spec`."""
    for gpu, prof in zip(gpus, profs, strict=True):
        gpu.links = (
            [] if spec and spec.hidden else [Link(active=False) for _ in range(prof.nvlinks)]
        )
        if gpu.links and prof.nvlink_mbps:  # the speed each active link answers
            speed = (VALUE_UINT, prof.nvlink_mbps)
            gpu.fields = {**gpu.fields, FI_NVLINK_SPEED_MBPS_COMMON: speed}
    if spec and spec.hidden:
        return
    if spec is None or not (spec.nvswitch or spec.groups is not None or spec.links):
        _wire_defaults(gpus, profs, switch_addrs)
    elif spec.nvswitch:
        _wire_switches(gpus, profs, spec.board_size or HGX_BOARD, switch_addrs, _Counter())
    elif spec.groups is not None:
        _wire_groups(gpus, profs, spec.groups)
    elif spec.links is not None:
        _wire_pairs(gpus, spec.links)


class _Counter:
    """Global NVSwitch numbering across boards (Link.remote_index of switch links)."""

    def __init__(self) -> None:
        self.next = 0


def _explicit_numa(numa: NumaSpec, n: int) -> list[int]:
    assert numa.gpus is not None
    if len(numa.gpus) != n:
        raise FakeNvmlError(
            f"topology.numa.gpus: expected one NUMA node per GPU ({n}), found {len(numa.gpus)}"
        )
    for i, node in enumerate(numa.gpus):
        if not 0 <= node < numa.nodes:
            raise FakeNvmlError(
                f"topology.numa.gpus[{i}]: expected a NUMA node 0-{numa.nodes - 1}, found {node}"
            )
    return list(numa.gpus)


def _wire_defaults(gpus: list[Gpu], profs: list[Profile], switch_addrs: Iterator[BusAddr]) -> None:
    # Each SXM model gets its own baseboards; PCIe cards get no bridge unless asked for.
    by_profile: dict[str, list[int]] = {}
    for i, prof in enumerate(profs):
        if prof.sxm:
            by_profile.setdefault(prof.key, []).append(i)
    counter = _Counter()
    for indexes in by_profile.values():
        members = [gpus[i] for i in indexes]
        member_profs = [profs[i] for i in indexes]
        if len(members) >= HGX_BOARD:
            _wire_switches(members, member_profs, HGX_BOARD, switch_addrs, counter)
        elif len(members) >= 2:
            # HGX 4-GPU boards have no NVSwitch: every pair is wired directly.
            _connect_group(members, member_profs, "default NVLink wiring")


def _wire_switches(
    gpus: list[Gpu],
    profs: list[Profile],
    board_size: int,
    switch_addrs: Iterator[BusAddr],
    counter: _Counter,
) -> None:
    where = "topology.nvlink.nvswitch"
    for start in range(0, len(gpus), board_size):
        board = range(start, min(start + board_size, len(gpus)))
        prof = profs[start]
        for i in board:
            if not profs[i].sxm:
                raise FakeNvmlError(
                    f"{where}: GPU {gpus[i].index} is a {profs[i].key}, a PCIe card; "
                    "NVSwitch baseboards hold SXM GPUs"
                )
            if profs[i].key != prof.key:
                raise FakeNvmlError(
                    f"{where}: GPUs {gpus[start].index} and {gpus[i].index} share a baseboard "
                    f"but are different models ({prof.key}, {profs[i].key})"
                )
        switches = []
        for _ in range(prof.nvswitches_per_board):
            switches.append((counter.next, _bus_id(next(switch_addrs))))
            counter.next += 1
        # Spread each GPU's links over the board's switches in blocks (18 over 4: 5,5,4,4).
        per_switch = [
            prof.nvlinks // len(switches) + (s < prof.nvlinks % len(switches))
            for s in range(len(switches))
        ]
        for i in board:
            slot = 0
            for (number, bus_id), count in zip(switches, per_switch, strict=True):
                for _ in range(count):
                    gpus[i].links[slot] = Link(
                        LINK_REMOTE_SWITCH, number, bus_id, prof.nvswitch_device_id, True
                    )
                    slot += 1


def _wire_groups(gpus: list[Gpu], profs: list[Profile], groups: list[list[int]]) -> None:
    seen: dict[int, int] = {}
    for g, group in enumerate(groups):
        where = f"topology.nvlink.groups[{g}]"
        if len(group) < 2:
            raise FakeNvmlError(f"{where}: expected at least 2 GPUs, found {group}")
        for index in group:
            _check_index(where, index, len(gpus))
            if index in seen:
                other = "twice in it" if seen[index] == g else f"also in groups[{seen[index]}]"
                raise FakeNvmlError(f"{where}: GPU {index} is {other}; groups must not overlap")
            seen[index] = g
        _connect_group([gpus[i] for i in group], [profs[i] for i in group], where)


def _connect_group(members: list[Gpu], profs: list[Profile], where: str) -> None:
    """Wire every pair directly, with as many links per peer as every member can spare."""
    need = len(members) - 1
    for gpu, prof in zip(members, profs, strict=True):
        if prof.nvlinks < need:
            raise FakeNvmlError(
                f"{where}: {len(members)} GPUs need {need} NVLinks each to be fully connected; "
                f"GPU {gpu.index} ({prof.key}) has {prof.nvlinks}"
            )
    per_peer = min(p.nvlinks for p in profs) // need
    for gpu in members:
        slot = 0
        for peer in members:
            if peer is gpu:
                continue
            for _ in range(per_peer):
                gpu.links[slot] = _gpu_link(peer)
                slot += 1


def _wire_pairs(gpus: list[Gpu], pairs: list[NvlinkPair]) -> None:
    used = [0] * len(gpus)
    for k, pair in enumerate(pairs):
        where = f"topology.nvlink.links[{k}]"
        a, b = pair.gpus
        _check_index(where, a, len(gpus))
        _check_index(where, b, len(gpus))
        if a == b:
            raise FakeNvmlError(f"{where}: expected two different GPUs, found {a} twice")
        for x in (a, b):
            if used[x] + pair.count > len(gpus[x].links):
                raise FakeNvmlError(
                    f"{where}: GPU {x} has {len(gpus[x].links)} NVLinks, {used[x]} already "
                    f"wired; {pair.count} more do not fit"
                )
        for _ in range(pair.count):
            gpus[a].links[used[a]] = _gpu_link(gpus[b])
            gpus[b].links[used[b]] = _gpu_link(gpus[a])
            used[a] += 1
            used[b] += 1


def _check_index(where: str, index: int, n: int) -> None:
    if not 0 <= index < n:
        raise FakeNvmlError(f"{where}: GPU {index} does not exist (indexes 0-{n - 1})")


def _gpu_link(peer: Gpu) -> Link:
    return Link(LINK_REMOTE_GPU, peer.index, peer.bus_id, peer.pci_device_id, True)


def _bus_id(addr: BusAddr) -> str:
    domain, bus, device, function = addr
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"
