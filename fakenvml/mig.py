"""MIG on a fakenvml node: MIG mode, GPU instances, compute instances, MIG devices.

The layout lives in the journal, like faults: `fakenvml mig ...`, this module's functions
and the library's own NVML create/destroy calls append records (journal.Kind.MIG_MODE ...
CI_DESTROY) that every process replays at its next NVML call. This module replays them
with the library's rules (src/mig.c) to validate a change before writing it, so a refused
change is a one-line error that writes nothing; the library checks each record again.

Rules (the driver's, as far as public sources show them):
- Enabling or disabling MIG is pending until a GPU reset (`fakenvml reset`); a reset
  destroys every instance. Instances can be made only while MIG is enabled.
- A GPU instance takes its profile's memory slices from one of its placements (out of 8)
  and its compute slices (out of 7); it may not overlap another. Its id follows from its
  placement, as the driver numbers the 8-slice tree: 0 the whole GPU, 1-2 halves, 3-6
  quarters, 7-14 eighths (all-1g.10gb on an H100 is GPU instances 7-13).
- A compute instance takes 1, 2, 3, 4 or 7 of its GPU instance's compute slices at a
  multiple of that size; ids are the lowest free, from 0.
- MIG device UUIDs are MIG-<CRC-32s of "<parent UUID>/<gi>/<ci>/<k>", k = 0..3>, the same
  in C (fnv_mig_uuid) and here.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from fakenvml import journal
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import Kind, Record
from fakenvml.model import Gpu, MigProfile, Node
from fakenvml.node import NodeDir

CI_SLICES = (1, 2, 3, 4, 7, 8, 6, 1)  # by NVML_COMPUTE_INSTANCE_PROFILE_* (0x0 .. 0x7)
CI_PROFILE_OF_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # the ones a GPU instance offers
GIS, CIS = 15, 8


def tree_id(size: int, start: int) -> int:
    return {8: 0, 4: 1 + start // 4, 2: 3 + start // 2, 1: 7 + start}.get(size, -1)


def mig_uuid(parent_uuid: str, gi: int, ci: int) -> str:
    h = "".join(f"{zlib.crc32(f'{parent_uuid}/{gi}/{ci}/{k}'.encode()):08x}" for k in range(4))
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def short(name: str) -> str:
    """`1g.10gb` from the driver's `MIG 1g.10gb`."""
    return name.removeprefix("MIG ")


@dataclass
class Ci:
    profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_*
    start: int

    @property
    def slices(self) -> int:
        return CI_SLICES[self.profile]


@dataclass
class Gi:
    prof: MigProfile
    start: int
    cis: dict[int, Ci] = field(default_factory=dict)


@dataclass
class GpuMig:
    """One GPU's MIG state, replayed."""

    gpu: Gpu
    current: bool = False
    pending: bool = False
    gis: dict[int, Gi] = field(default_factory=dict)

    @property
    def capable(self) -> bool:
        return bool(self.gpu.mig_profiles)

    @property
    def max_slices(self) -> int:
        return max((p.slice_count for p in self.gpu.mig_profiles), default=0)

    def profile(self, key: str | int) -> MigProfile:
        """A GPU-instance profile by name (`1g.10gb`, `MIG 1g.10gb`) or id (`19`)."""
        text = str(key).strip()
        for p in self.gpu.mig_profiles:
            if text in (p.name, short(p.name)) or (text.isdigit() and int(text) == p.id):
                return p
        names = ", ".join(short(p.name) for p in self.gpu.mig_profiles) or "none: no MIG"
        raise FakeNvmlError(f"GPU {self.gpu.index} has no MIG profile {text!r} ({names})")

    def gi_fits(self, p: MigProfile, start: int) -> str:
        """Why a GPU instance of `p` cannot start at `start` now ("" if it can)."""
        if start not in p.placement_starts:
            return (
                f"{short(p.name)} cannot start at slice {start} (placements {p.placement_starts})"
            )
        used = [g for g in self.gis.values()]
        if sum(g.prof.id == p.id for g in used) >= p.instance_count:
            return f"GPU {self.gpu.index} has its {p.instance_count} {short(p.name)} already"
        if sum(g.prof.slice_count for g in used) + p.slice_count > self.max_slices:
            return f"GPU {self.gpu.index} has too few compute slices left for {short(p.name)}"
        for gid, g in self.gis.items():
            if g.start < start + p.placement_size and start < g.start + g.prof.placement_size:
                return f"slices {start}-{start + p.placement_size - 1} overlap GPU instance {gid}"
        gid = tree_id(p.placement_size, start)
        if not 0 <= gid < GIS or gid in self.gis:
            return f"GPU instance id {gid} for slice {start} is taken"
        return ""

    def first_fit(self, p: MigProfile) -> int | None:
        return next((s for s in p.placement_starts if not self.gi_fits(p, s)), None)

    def ci_fits(self, g: Gi, profile: int, start: int) -> str:
        s = CI_SLICES[profile]
        if s > g.prof.slice_count or profile not in CI_PROFILE_OF_SLICES.values():
            return f"a {s}-slice compute instance does not fit a {short(g.prof.name)} instance"
        if start % s or start + s > g.prof.slice_count:
            return f"a {s}-slice compute instance cannot start at slice {start}"
        for cid, c in g.cis.items():
            if c.start < start + s and start < c.start + c.slices:
                return f"compute slices {start}-{start + s - 1} overlap compute instance {cid}"
        if len(g.cis) >= CIS:
            return "no compute instance id left"
        return ""

    def ci_first_fit(self, g: Gi, profile: int) -> int | None:
        s = CI_SLICES[profile]
        return next(
            (x for x in range(0, g.prof.slice_count - s + 1, s) if not self.ci_fits(g, profile, x)),
            None,
        )

    def apply(self, rec: Record) -> None:
        """One record, as src/mig.c's fnv_mig_apply: what the driver would refuse is
        ignored."""
        if not self.capable:
            return
        if rec.kind == Kind.MIG_MODE:
            self.pending = bool(rec.data)
        elif rec.kind == Kind.GPU_RESET:
            self.current, self.gis = self.pending, {}
        elif rec.kind == Kind.GI_CREATE:
            p = next((p for p in self.gpu.mig_profiles if p.id == rec.compute_instance), None)
            fits = self.current and p is not None and not self.gi_fits(p, rec.data)
            if fits and p and tree_id(p.placement_size, rec.data) == rec.gpu_instance:
                self.gis[rec.gpu_instance] = Gi(p, rec.data)
        elif rec.kind == Kind.GI_DESTROY:
            g = self.gis.get(rec.gpu_instance)
            if g is not None and not g.cis:
                del self.gis[rec.gpu_instance]
        elif rec.kind == Kind.CI_CREATE:
            g = self.gis.get(rec.gpu_instance)
            cid, prof = rec.compute_instance, rec.data
            free = g is not None and cid < CIS and cid not in g.cis and prof < len(CI_SLICES)
            if free and g and not self.ci_fits(g, prof, rec.data2):
                g.cis[cid] = Ci(prof, rec.data2)
        elif rec.kind == Kind.CI_DESTROY:
            g = self.gis.get(rec.gpu_instance)
            if g is not None:
                g.cis.pop(rec.compute_instance, None)


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


def layout(node_dir: NodeDir) -> list[GpuMig]:
    """Every GPU's MIG state now, replayed from the node's journal."""
    gpus = [GpuMig(g) for g in node_dir.node().gpus]
    for rec in node_dir.events():
        if Kind.MIG_MODE <= rec.kind <= Kind.CI_DESTROY and rec.gpu < len(gpus):
            gpus[rec.gpu].apply(rec)
    return gpus


def devices(node_dir: NodeDir) -> list[MigDevice]:
    """The node's MIG devices, GPU by GPU, each GPU's by GPU instance then compute
    instance id."""
    out = []
    for m in layout(node_dir):
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

Entry = journal.Entry


def _entry(kind: Kind, gpu: int, arg0: int = 0, arg1: int = 0, data: int = 0,
           data2: int = 0) -> Entry:  # fmt: skip
    return (kind, gpu, data, arg0, arg1, data2)


class Plan:
    """Changes checked against a replayed layout as they are planned, then written as one
    append: either all of them or (on the first refusal) none."""

    def __init__(self, node_dir: NodeDir | None, gpus: list[GpuMig] | None = None) -> None:
        self.node_dir = node_dir
        self.gpus = layout(node_dir) if node_dir is not None else gpus or []
        self.entries: list[Entry] = []

    def gpu(self, key: str | int) -> GpuMig:
        if self.node_dir is None:
            m = self.gpus[int(key)]
        else:
            m = self.gpus[self.node_dir.resolve(key).index]
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

    def _add(self, m: GpuMig, kind: Kind, arg0: int = 0, arg1: int = 0, data: int = 0,
             data2: int = 0) -> None:  # fmt: skip
        e = _entry(kind, m.gpu.index, arg0, arg1, data, data2)
        self.entries.append(e)
        m.apply(Record(0, 0, 0, kind, m.gpu.index, data, arg0, arg1, data2))

    def mode(self, m: GpuMig, enabled: bool) -> None:
        self._add(m, Kind.MIG_MODE, data=int(enabled))

    def reset(self, m: GpuMig) -> None:
        self._add(m, Kind.GPU_RESET)

    def create_gi(self, m: GpuMig, profile: str | int, start: int | None = None) -> int:
        if not m.current:
            i = m.gpu.index
            how = f"`fakenvml mig enable {i}`, then `fakenvml reset {i}`"
            raise FakeNvmlError(f"MIG is not enabled on GPU {i} ({how})")
        p = m.profile(profile)
        if start is None:
            start = m.first_fit(p)
            if start is None:
                raise FakeNvmlError(f"no room for {short(p.name)} on GPU {m.gpu.index}")
        elif why := m.gi_fits(p, start):
            raise FakeNvmlError(why)
        gid = tree_id(p.placement_size, start)
        self._add(m, Kind.GI_CREATE, gid, p.id, start)
        return gid

    def create_ci(self, m: GpuMig, gid: int, slices: int | None = None,
                  start: int | None = None) -> int:  # fmt: skip
        g = m.gis.get(gid)
        if g is None:
            raise FakeNvmlError(f"GPU {m.gpu.index} has no GPU instance {gid}")
        slices = g.prof.slice_count if slices is None else slices
        if slices not in CI_PROFILE_OF_SLICES:
            raise FakeNvmlError(f"a compute instance has 1, 2, 3, 4 or 7 slices, not {slices}")
        profile = CI_PROFILE_OF_SLICES[slices]
        if start is None:
            start = m.ci_first_fit(g, profile)
            if start is None:
                raise FakeNvmlError(f"no room for a {slices}-slice compute instance in "
                                    f"GPU instance {gid}")  # fmt: skip
        elif why := m.ci_fits(g, profile, start):
            raise FakeNvmlError(why)
        cid = next(c for c in range(CIS) if c not in g.cis)
        self._add(m, Kind.CI_CREATE, gid, cid, profile, start)
        return cid

    def destroy_ci(self, m: GpuMig, gid: int, cid: int) -> None:
        g = m.gis.get(gid)
        if g is None or cid not in g.cis:
            raise FakeNvmlError(f"GPU {m.gpu.index} has no compute instance {gid}/{cid}")
        self._add(m, Kind.CI_DESTROY, gid, cid)

    def destroy_gi(self, m: GpuMig, gid: int) -> None:
        g = m.gis.get(gid)
        if g is None:
            raise FakeNvmlError(f"GPU {m.gpu.index} has no GPU instance {gid}")
        for cid in sorted(g.cis):  # as `nvidia-smi mig -dci` then `-dgi`
            self.destroy_ci(m, gid, cid)
        self._add(m, Kind.GI_DESTROY, gid)

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
        # As many as the GPU takes, each at its first fit (probed on a scratch copy).
        probe = GpuMig(m.gpu, current=True)
        out = []
        while (start := probe.first_fit(p)) is not None:
            probe.gis[tree_id(p.placement_size, start)] = Gi(p, start)
            out.append(short(p.name))
        return out
    names = "all-disabled, all-enabled, all-balanced, " + ", ".join(
        f"all-{short(p.name)}" for p in m.gpu.mig_profiles
    )
    raise FakeNvmlError(f"unknown MIG config {config!r} (known: {names})")


def configure(node_dir: NodeDir, gpus: str | int, config: str) -> list[Record]:
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


def apply_inventory(node_dir: NodeDir, node: Node) -> list[Record]:
    """The inventory's `mig:` layouts (model.Gpu.mig_layout, which the state file does not
    keep), just after `init` wrote `node`."""
    plan = Plan(node_dir)
    for m, gpu in zip(plan.gpus, node.gpus, strict=True):
        if gpu.mig_layout:
            plan.configure(m, gpu.mig_layout)
    return plan.write()
