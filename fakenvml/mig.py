"""MIG on a fakenvml node: MIG mode, GPU instances, compute instances, MIG devices.

The layout lives in the journal, like faults: `fakenvml mig ...`, this module's functions
and the library's own NVML create/destroy calls append records (journal.Kind.MIG_MODE ...
CI_DESTROY) that every process replays at its next NVML call.

The rules are the library's alone (src/mig_layout.c lists them): where an instance may go,
which id it gets, what a record the driver would refuse does (nothing). This module holds
each GPU's layout as the library's own struct (fnv_mig, read through fakenvml/layout.py)
and changes it only through the library's fakenvml_mig_change, which checks a change as
the NVML call would and fills in what it leaves open (the first placement that fits, the
lowest free id). So a plan is checked change by change before anything is written, a
refusal is a one-line error worded here from the library's reason (Why), and the layout
this module shows is the one every NVML client replays.

Placements, ids and names, as the driver has them: GPU instances are numbered by their
place in the 8-slice tree (all-1g.10gb on an H100 is GPU instances 7-13), compute instances
from 0; MIG device UUIDs are the library's too (fakenvml_mig_uuid).
"""

from __future__ import annotations

import ctypes
import enum
import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from fakenvml import library, statefile
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import Entry, Kind, Record
from fakenvml.layout import ANY, MIG_CI, MIG_CIS, MIG_GI, MIG_GIS, MIG_LAYOUT, RECORD
from fakenvml.model import Gpu, MigProfile, Node

# The compute-instance profiles (NVML_COMPUTE_INSTANCE_PROFILE_*) a GPU instance may offer,
# by their compute slices: how users name them.
CI_PROFILE_OF_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
_SLICES_OF_CI_PROFILE = {p: s for s, p in CI_PROFILE_OF_SLICES.items()}


class Why(enum.IntEnum):
    """Why the library refuses a MIG change: enum fnv_mig_why in src/state_format.h (its
    comments say what each means; _refusal words them)."""

    OK = 0
    UNSUPPORTED = 1
    DISABLED = 2
    NO_PROFILE = 3
    NOT_A_PLACEMENT = 4
    ALL_MADE = 5
    NO_SLICES = 6
    OVERLAP = 7
    ID_TAKEN = 8
    WRONG_ID = 9
    NO_ROOM = 10
    NO_GI = 11
    IN_USE = 12
    NO_CI_PROFILE = 13
    CI_TOO_BIG = 14
    CI_START = 15
    CI_OVERLAP = 16
    CI_NO_ROOM = 17
    NO_CI_ID = 18
    NO_CI = 19
    NOT_MIG = 20


_RECORD = RECORD.span()
_LAYOUT_HEAD, _GI_HEAD = MIG_LAYOUT.span("current", "pending"), MIG_GI.span("used", "pad")
_CI = MIG_CI.span()


@functools.cache
def _library() -> ctypes.CDLL:
    """The library under test (library.path()), its control-plane entries declared."""
    lib = library.preload()
    buf = ctypes.c_char_p
    lib.fakenvml_mig_change.argtypes = [buf, buf, buf, ctypes.POINTER(ctypes.c_uint32)]
    lib.fakenvml_mig_change.restype = ctypes.c_uint32
    lib.fakenvml_mig_uuid.argtypes = [buf, ctypes.c_uint32, ctypes.c_uint32, buf]
    lib.fakenvml_mig_uuid.restype = None
    return lib


def mig_uuid(parent_uuid: str, gi: int, ci: int) -> str:
    """A MIG device's UUID, as the library names it."""
    out = ctypes.create_string_buffer(96)
    _library().fakenvml_mig_uuid(parent_uuid.encode(), gi, ci, out)
    return out.value.decode()


def short(name: str) -> str:
    """`1g.10gb` from the driver's `MIG 1g.10gb`."""
    return name.removeprefix("MIG ")


@dataclass
class Ci:
    profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_*
    start: int
    slices: int


@dataclass
class Gi:
    prof: MigProfile
    start: int
    cis: dict[int, Ci] = field(default_factory=dict)


class GpuMig:
    """One GPU's MIG state: the library's layout of it, and what it reads as."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self._device: bytes | None = None  # its fnv_device record, packed on first change
        self._layout = ctypes.create_string_buffer(MIG_LAYOUT.size)  # MIG off, no instances
        self.current = self.pending = False
        self.gis: dict[int, Gi] = {}

    @property
    def capable(self) -> bool:
        return bool(self.gpu.mig_profiles)

    def profile(self, key: str | int) -> MigProfile:
        """A GPU-instance profile by name (`1g.10gb`, `MIG 1g.10gb`) or id (`19`)."""
        text = str(key).strip()
        for p in self.gpu.mig_profiles:
            if text in (p.name, short(p.name)) or (text.isdigit() and int(text) == p.id):
                return p
        names = ", ".join(short(p.name) for p in self.gpu.mig_profiles) or "none: no MIG"
        raise FakeNvmlError(f"GPU {self.gpu.index} has no MIG profile {text!r} ({names})")

    def change(self, rec: Record) -> tuple[Why, int, Record]:
        """The library's verdict on one MIG record, and the change made when it allows it:
        (Why.OK, 0, the record as made: ANY ids and placements filled in), or (why not,
        the instance in the way where there is one, the record) with nothing changed."""
        if not self.capable:
            return Why.UNSUPPORTED, 0, rec
        if self._device is None:
            self._device = statefile.pack_device(self.gpu)
        raw = ctypes.create_string_buffer(_RECORD.pack({**rec._asdict(), "crc": 0}), _RECORD.size)
        other = ctypes.c_uint32(0)
        lib = _library()
        why = Why(lib.fakenvml_mig_change(self._device, self._layout, raw, ctypes.byref(other)))
        if why != Why.OK:
            return why, other.value, rec
        self._read()
        made = _RECORD.unpack_from(raw.raw)
        return why, 0, rec._replace(**{k: made[k] for k in rec._fields if k != "kind"})

    def apply(self, rec: Record) -> None:
        """One record of the journal, as every library replays it (a refused one changes
        nothing)."""
        self.change(rec)

    def _read(self) -> None:
        raw = self._layout.raw
        head = _LAYOUT_HEAD.unpack_from(raw)
        self.current, self.pending = bool(head["current"]), bool(head["pending"])
        self.gis = {}
        for gid in range(MIG_GIS):
            at = MIG_LAYOUT.offsets["gi"] + gid * MIG_GI.size
            g = _GI_HEAD.unpack_from(raw, at)
            if not g["used"]:
                continue
            gi = self.gis[gid] = Gi(self.gpu.mig_profiles[g["prof"]], g["start"])
            for cid in range(MIG_CIS):
                c = _CI.unpack_from(raw, at + MIG_GI.offsets["ci"] + cid * MIG_CI.size)
                if c["used"]:
                    gi.cis[cid] = Ci(c["profile"], c["start"], c["slices"])

    def refusal(self, why: Why, other: int, rec: Record) -> str:
        """The library's reason `why` for refusing `rec`, in a line."""
        i, gid, start = self.gpu.index, rec.gpu_instance, rec.data
        if rec.kind == Kind.GI_CREATE:
            p = next((p for p in self.gpu.mig_profiles if p.id == rec.compute_instance), None)
            name, size = (short(p.name), p.placement_size) if p else (str(rec.compute_instance), 1)
            if why == Why.NOT_A_PLACEMENT and p:
                return f"{name} cannot start at slice {start} (placements {p.placement_starts})"
            if why == Why.ALL_MADE and p:
                return f"GPU {i} has its {p.instance_count} {name} already"
            words = {
                Why.NO_PROFILE: f"GPU {i} has no MIG profile id {rec.compute_instance}",
                Why.NO_SLICES: f"GPU {i} has too few compute slices left for {name}",
                Why.OVERLAP: f"slices {start}-{start + size - 1} overlap GPU instance {other}",
                Why.ID_TAKEN: f"GPU instance id {other} for slice {start} is taken",
                Why.NO_ROOM: f"no room for {name} on GPU {i}",
            }
        else:
            s, x = _SLICES_OF_CI_PROFILE.get(rec.data, 0), rec.data2
            words = {
                Why.CI_TOO_BIG: f"a {s}-slice compute instance does not fit a "
                f"{short(self.gis[gid].prof.name) if gid in self.gis else ''} instance",
                Why.CI_START: f"a {s}-slice compute instance cannot start at slice {x}",
                Why.CI_OVERLAP: f"compute slices {x}-{x + s - 1} overlap compute instance {other}",
                Why.CI_NO_ROOM: f"no room for a {s}-slice compute instance in GPU instance {gid}",
                Why.NO_CI_ID: "no compute instance id left",
                Why.NO_CI_PROFILE: f"no compute-instance profile {rec.data}",
                Why.NO_CI: f"GPU {i} has no compute instance {gid}/{rec.compute_instance}",
            }
        words |= {
            Why.UNSUPPORTED: f"GPU {i} ({self.gpu.name}) does not support MIG",
            Why.DISABLED: f"MIG is not enabled on GPU {i} "
            f"(`fakenvml mig enable {i}`, then `fakenvml reset {i}`)",
            Why.NO_GI: f"GPU {i} has no GPU instance {gid}",
            Why.IN_USE: f"GPU instance {gid} on GPU {i} has compute instances",
        }
        return words.get(why, f"GPU {i}: {rec.kind.spelling} refused ({why.name.lower()})")


@dataclass(frozen=True)
class MigDevice:
    """A MIG device as NVML shows it (GetMigDeviceHandleByIndex's order)."""

    gpu: int
    index: int
    parent_uuid: str
    gi: int
    ci: int
    profile: str  # `1g.10gb`, or `1c.3g.40gb` for a smaller compute instance
    memory_mib: int
    multiprocessors: int
    uuid: str


class StateDir(Protocol):
    """What MIG needs of a node's state directory (fakenvml.node.NodeDir): its GPUs, its
    journal and a way to append. A protocol, not an import: node.py lays out an
    inventory's MIG at init through this module, which so stays below it."""

    def node(self) -> Node: ...
    def events(self, start: int = 0) -> Iterator[Record]: ...
    def index_of(self, gpu: str | int) -> int: ...
    def write_entries(self, entries: list[Entry]) -> list[Record]: ...


def layout(node_dir: StateDir) -> list[GpuMig]:
    """Every GPU's MIG state now, replayed from the node's journal."""
    gpus = [GpuMig(g) for g in node_dir.node().gpus]
    for _ in _replay(node_dir, gpus):
        pass
    return gpus


def history(node_dir: StateDir) -> Iterator[tuple[Record, list[GpuMig]]]:
    """Every GPU's MIG state after each MIG record of the node's journal, in its order:
    when each instance was made and destroyed, by the record's clock. One list, changed in
    place: read it before the next."""
    gpus = [GpuMig(g) for g in node_dir.node().gpus]
    for rec in _replay(node_dir, gpus):
        yield rec, gpus


def _replay(node_dir: StateDir, gpus: list[GpuMig]) -> Iterator[Record]:
    for rec in node_dir.events():
        if Kind.MIG_MODE <= rec.kind <= Kind.CI_DESTROY and rec.gpu < len(gpus):
            gpus[rec.gpu].apply(rec)
            yield rec


def instances(node_dir: StateDir) -> list[tuple[bool, Counter[str]]]:
    """Each GPU's MIG mode and its GPU instances by short profile name ("1g.10gb"): a
    layout as MIG tools name it, to compare with what one was asked to make."""
    return [(m.current, Counter(short(gi.prof.name) for gi in m.gis.values()))
            for m in layout(node_dir)]  # fmt: skip


def devices(node_dir: StateDir) -> list[MigDevice]:
    """The node's MIG devices, GPU by GPU, each GPU's by GPU instance then compute
    instance id."""
    return devices_of(layout(node_dir))


def devices_of(gpus: list[GpuMig]) -> list[MigDevice]:
    """The MIG devices of a layout (layout(), or a step of history())."""
    out = []
    for m in gpus:
        if not m.current:
            continue
        k = 0
        for gid in sorted(m.gis):
            g = m.gis[gid]
            for cid in sorted(g.cis):
                c = g.cis[cid]
                name = short(g.prof.name)
                if c.slices != g.prof.slice_count:
                    name = f"{c.slices}c.{name}"
                sms = g.prof.multiprocessors * c.slices // g.prof.slice_count
                uuid = mig_uuid(m.gpu.uuid, gid, cid)
                out.append(MigDevice(m.gpu.index, k, m.gpu.uuid, gid, cid, name,
                                     g.prof.memory_mib, sms, uuid))  # fmt: skip
                k += 1
    return out


# --------------------------------------------------------------------- changes


class Plan:
    """Changes checked by the library against a replayed layout as they are planned, then
    written as one append: either all of them or (on the first refusal) none."""

    def __init__(self, node_dir: StateDir | None, gpus: list[GpuMig] | None = None) -> None:
        self.node_dir = node_dir
        self.gpus = layout(node_dir) if node_dir is not None else gpus or []
        self.entries: list[Entry] = []

    def gpu(self, key: str | int) -> GpuMig:
        index = int(key) if self.node_dir is None else self.node_dir.index_of(key)
        m = self.gpus[index]
        if not m.capable:
            raise FakeNvmlError(f"GPU {m.gpu.index} ({m.gpu.name}) does not support MIG")
        return m

    def targets(self, key: str | int) -> list[GpuMig]:
        if str(key).strip().lower() == "all":
            capable = [m for m in self.gpus if m.capable]
            if not capable:
                raise FakeNvmlError("no GPU of this node supports MIG")
            return capable
        return [self.gpu(key)]

    def _change(self, m: GpuMig, kind: Kind, arg0: int = 0, arg1: int = 0, data: int = 0,
                data2: int = 0) -> Record:  # fmt: skip
        """The change as the library makes it (ANY filled in), planned; or the library's
        reason, and nothing planned."""
        want = Record(0, 0, 0, kind, m.gpu.index, data, arg0, arg1, data2)
        why, other, made = m.change(want)
        if why != Why.OK:
            raise FakeNvmlError(m.refusal(why, other, want))
        self.entries.append((kind, made.gpu, made.data, made.gpu_instance,
                             made.compute_instance, made.data2))  # fmt: skip
        return made

    def mode(self, m: GpuMig, enabled: bool) -> None:
        self._change(m, Kind.MIG_MODE, data=int(enabled))

    def reset(self, m: GpuMig) -> None:
        self._change(m, Kind.GPU_RESET)

    def create_gi(self, m: GpuMig, profile: str | int, start: int | None = None) -> int:
        p = m.profile(profile)
        made = self._change(m, Kind.GI_CREATE, ANY, p.id, _slice(start))
        return made.gpu_instance

    def create_ci(self, m: GpuMig, gid: int, slices: int | None = None,
                  start: int | None = None) -> int:  # fmt: skip
        g = m.gis.get(gid)
        if g is None:
            raise FakeNvmlError(f"GPU {m.gpu.index} has no GPU instance {gid}")
        slices = g.prof.slice_count if slices is None else slices
        if slices not in CI_PROFILE_OF_SLICES:
            raise FakeNvmlError(f"a compute instance has 1, 2, 3, 4 or 7 slices, not {slices}")
        made = self._change(
            m, Kind.CI_CREATE, gid, ANY, CI_PROFILE_OF_SLICES[slices], _slice(start)
        )
        return made.compute_instance

    def destroy_ci(self, m: GpuMig, gid: int, cid: int) -> None:
        self._change(m, Kind.CI_DESTROY, gid, cid)

    def destroy_gi(self, m: GpuMig, gid: int) -> None:
        g = m.gis.get(gid)
        for cid in sorted(g.cis if g else ()):  # as `nvidia-smi mig -dci` then `-dgi`
            self.destroy_ci(m, gid, cid)
        self._change(m, Kind.GI_DESTROY, gid)

    def configure(self, m: GpuMig, config: str) -> None:
        """A mig-parted-style named config (all-1g.10gb), or GPU-instance profiles
        separated by commas (3g.40gb,2g.20gb), each with one compute instance spanning it:
        MIG mode, a reset, then the instances."""
        if "," in config or not config.startswith("all-"):
            wanted: list[str] | None = [p.strip() for p in config.split(",") if p.strip()]
        else:
            wanted = named_config(m, config)
        self.mode(m, wanted is not None)
        self.reset(m)
        for profile in wanted or []:
            self.create_ci(m, self.create_gi(m, profile))

    def write(self) -> list[Record]:
        assert self.node_dir is not None
        return self.node_dir.write_entries(self.entries) if self.entries else []


def _slice(start: int | None) -> int:
    """A placement start as a record holds it: ANY for none given."""
    if start is None:
        return ANY
    if not 0 <= start < 32:
        raise FakeNvmlError(f"slice {start}: expected 0 to 31")
    return start


def _basic(m: GpuMig, slices: int) -> MigProfile | None:
    """The plain profile of that many compute slices: the most instances, fewest memory
    slices, no media extensions (`1g.10gb`, not `1g.20gb` or `1g.10gb+me`)."""
    cands = [p for p in m.gpu.mig_profiles if p.slice_count == slices and "+" not in p.name]
    return min(cands, key=lambda p: (p.placement_size, -p.instance_count), default=None)


def named_config(m: GpuMig, config: str) -> list[str] | None:
    """The GPU-instance profiles of a named config (None: MIG disabled), as NVIDIA's
    mig-parted default configs name them: all-disabled, all-enabled (no instances),
    all-<profile> (as many as fit: all-1g.10gb), all-balanced (two 1g, one 2g, one 3g)."""
    if config == "all-disabled":
        return None
    if config == "all-enabled":
        return []
    if config == "all-balanced":
        picks = [_basic(m, 1), _basic(m, 1), _basic(m, 2), _basic(m, 3)]
        if None in picks:
            raise FakeNvmlError(f"GPU {m.gpu.index} has no balanced MIG layout")
        return [short(p.name) for p in picks if p]
    if config.startswith("all-"):
        p = m.profile(config[4:])
        # As many as the GPU takes, each where it first fits (probed on a scratch layout).
        probe = Plan(None, [GpuMig(m.gpu)])
        probe.mode(probe.gpus[0], True)
        probe.reset(probe.gpus[0])
        out = []
        with_room = Record(0, 0, 0, Kind.GI_CREATE, m.gpu.index, ANY, ANY, p.id, 0)
        while probe.gpus[0].change(with_room)[0] == Why.OK:
            out.append(short(p.name))
        return out
    names = "all-disabled, all-enabled, all-balanced, " + ", ".join(
        f"all-{short(p.name)}" for p in m.gpu.mig_profiles
    )
    raise FakeNvmlError(f"unknown MIG config {config!r} (known: {names})")


def configure(node_dir: StateDir, gpus: str | int, config: str) -> list[Record]:
    """Apply a named config or a profile list to one GPU or `all`, in one append."""
    plan = Plan(node_dir)
    for m in plan.targets(gpus):
        plan.configure(m, config)
    return plan.write()


def check(gpu: Gpu, config: str) -> None:
    """FakeNvmlError (one line) unless `config` can be laid out on this GPU."""
    m = GpuMig(gpu)
    if not m.capable:
        raise FakeNvmlError(f"GPU {gpu.index} ({gpu.name}) does not support MIG")
    Plan(None, [m]).configure(m, config)


def inventory_entries(node: Node) -> list[Entry]:
    """The journal records that lay out the inventory's `mig:` layouts
    (model.Gpu.mig_layout, which the state file does not keep) on a node just initialised."""
    plan = Plan(None, [GpuMig(g) for g in node.gpus])
    for m, gpu in zip(plan.gpus, node.gpus, strict=True):
        if gpu.mig_layout:
            plan.configure(m, gpu.mig_layout)
    return plan.entries
