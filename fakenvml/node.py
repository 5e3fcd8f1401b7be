"""A node's state directory: the Python API behind `fakenvml init|inject|recover|events`.

    d = NodeDir("/var/lib/gpulab/seed/worker")
    d.init(node)                 # write state.bin + an empty journal.bin
    rec = d.inject_xid("0", 79)  # GPU by index, UUID or PCI bus id
    d.recover(rec.gpu)
    d.set_sensors("3", ["temperature=70..90/30s", "power=350W"])  # (fakenvml/telemetry.py)
    d.add_process("0", pid=4242, used=2 << 30)
    d.fail("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu="2", count=3)  # (fakenvml/knobs.py)
    d.fail("nvmlDeviceGetUUID", "UNKNOWN", after=100)  # the node's first 100 calls pass
    d.delay("nvmlDeviceGetUUID", 2000)

Every method validates first and writes last, so bad input changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from fakenvml import faults, journal, kernlog, knobs, statefile, telemetry
from fakenvml.errors import FakeNvmlError
from fakenvml.journal import Kind, Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # the model's dataclasses load with the first state read, not at import
    from fakenvml.model import Gpu, Node

DEFAULT_STATE_DIR = "/var/lib/fakenvml"
STATE_DIR_ENV = "FAKENVML_STATE_DIR"  # the C library reads the same variable


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV, DEFAULT_STATE_DIR))


class NodeDir:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_state_dir()
        self._cache: dict[str, tuple[tuple[int, int, int], object]] = {}

    def _cached(self, what: str, parse):  # type: ignore[no-untyped-def]
        """parse(path), again only when state.bin changed (init renames a new file into
        place): an inject resolves, stamps and describes from one read, and a 1024-GPU
        state (4.8 MB) is not parsed three times per fault."""
        try:
            st = (self.path / statefile.STATE_FILE).stat()
        except OSError:
            return parse(self.path)  # its one-line error
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(what)
        if hit is None or hit[0] != key:
            hit = self._cache[what] = (key, parse(self.path))
        return hit[1]

    def _read(self) -> tuple[Node, int]:
        return self._cached("node", statefile.read)  # type: ignore[no-any-return]

    def identities(self) -> statefile.Identities:
        """The node's name, boot id and GPU names, without building the model (fast)."""
        return self._cached("ids", statefile.identities)  # type: ignore[no-any-return]

    def init(self, node: Node) -> int:
        """Write a fresh state and journal; returns the new boot id."""
        import secrets  # here: the commands that only append (inject, set) start faster

        boot_id = secrets.randbits(63) or 1
        state = statefile.pack(node, boot_id)  # validates before anything is written
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # The files are all written out before any replaces anything, so a failure
            # (permissions, a full disk) leaves the directory as it was. gen and journal
            # first: a library that reads the new state must find its journal.
            with statefile.staged(self.path / journal.GEN_FILE, journal.create_gen(boot_id)) as g, \
                 statefile.staged(self.path / knobs.COUNTERS_FILE,
                                  knobs.create_counters(boot_id)) as k, \
                 statefile.staged(self.path / journal.JOURNAL_FILE, journal.create(boot_id)) as j, \
                 statefile.staged(self.path / statefile.STATE_FILE, state) as s:  # fmt: skip
                g.commit()
                k.commit()
                j.commit()
                s.commit()
            kernlog.ensure(self.path)
        except OSError as e:
            raise FakeNvmlError(f"cannot write state to {self.path}: {e.strerror}") from None
        if any(g.mig_layout for g in node.gpus):
            from fakenvml import mig  # here: it loads the library (the MIG rules are its)

            # Checked by inventory already: cannot be refused.
            self.write_entries(mig.inventory_entries(node))
        return boot_id

    def exists(self) -> bool:
        """A state has been written here (`init`)."""
        return (self.path / statefile.STATE_FILE).is_file()

    def node(self) -> Node:
        return statefile.read(self.path)[0]

    def resolve(self, gpu: str | int) -> Gpu:
        """A GPU by index, UUID or PCI bus id, or a FakeNvmlError naming what exists."""
        return self._read()[0].gpus[self.index_of(gpu)]

    def index_of(self, gpu: str | int) -> int:
        """resolve(gpu).index, from the identities alone (what `inject` does)."""
        ids = self.identities()
        key = str(gpu).strip()
        if key.isdigit() and int(key) < len(ids.gpus):
            return int(key)
        for g in ids.gpus:
            if key in (g.uuid, g.serial) or key.upper() in (g.bus_id, g.bus_id[4:]):
                return g.index
        raise FakeNvmlError(
            f"GPU {key!r} not in inventory of node {ids.node} "
            f"(indexes 0-{len(ids.gpus) - 1}, or a UUID / PCI bus id)"
        )

    def inject(self, fault: str, gpu: str | int, **args: object) -> list[Record]:
        """The fault named `fault` (fakenvml/faults.py: xid, ecc, lost, fallen-off-bus,
        recover) with its arguments as keywords, in one append; its own record first, then
        what the driver adds (ecc --double: its Xid 48; the recovery action asked for)."""
        f = faults.named(fault)
        given = faults.arguments(f, args)
        recs = self._write(f.entries(self.index_of(gpu), **given))
        # The driver's kernel log lines for its Xids (fakenvml/kernlog.py).
        ids = self.identities()
        kernlog.append(self.path, kernlog.lines(ids.node, [g.bus_id for g in ids.gpus], recs))
        return recs

    # The named faults, as callers had them before the table.
    def inject_xid(
        self,
        gpu: str | int,
        code: int,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
    ) -> Record:
        """Xid `code` (fakenvml/faults.py: the recovery action its code asks for follows)."""
        args = {"gpu_instance": gpu_instance, "compute_instance": compute_instance}
        return self.inject("xid", gpu, code=code, **args)[0]

    def inject_ecc(self, gpu: str | int, double: bool, count: int = 1, xid: bool = True) -> Record:
        """ECC error events, as `fakenvml inject ecc --double|--single`; returns the ECC
        record (fakenvml/faults.py: a double-bit error's Xid 48 and GPU reset follow)."""
        return self.inject("ecc", gpu, double=double, count=count, xid=xid)[0]

    def lose(self, gpu: str | int) -> Record:
        return self.inject("lost", gpu)[0]

    def fall_off_bus(self, gpu: str | int) -> Record:
        """Xid 79 to waiters, then the GPU answers GPU_IS_LOST like a lost one."""
        return self.inject("fallen-off-bus", gpu)[0]

    def recover(self, gpu: str | int) -> Record:
        """Clear the GPU's faults: reachable again, recovery action NONE (an event)."""
        return self.inject(faults.RECOVER, gpu)[0]

    def faulted(self, start: int = 0, recovered_too: bool = False) -> set[int]:
        """Indexes of the GPUs with a fault after their last recover (the journal from
        record `start`; `recovered_too`: also those recovered since): see `faulted`."""
        return faulted(self.events(start), recovered_too)

    # ------------------------------------------------------------------- telemetry

    def _targets(self, gpu: str | int) -> list[Gpu]:
        return self._read()[0].gpus if str(gpu).strip().lower() == "all" else [self.resolve(gpu)]

    def _write(self, entries: list[journal.Entry]) -> list[Record]:
        return journal.append_many(self.path, self.identities().boot_id, entries)

    def write_entries(self, entries: list[journal.Entry]) -> list[Record]:
        """Records of any kind, in one append (fakenvml/mig.py's layout changes)."""
        return self._write(entries)

    def set_sensors(self, gpu: str | int, assignments: list[str]) -> list[Record]:
        """Sensor values (`temperature=88`, `power=70..90W/30s`, `util=idle`; grammar in
        fakenvml/telemetry.py) for one GPU or `all`, validated for every GPU before one
        record is written."""
        entries = [
            s.entry(g.index) for g in self._targets(gpu) for s in telemetry.parse(assignments, g)
        ]
        return self._write(entries)

    def add_process(
        self,
        gpu: str | int,
        pid: int,
        used: int,
        kind: str = "compute",
        sm_util: int | None = None,
        mem_util: int | None = None,
    ) -> Record:
        """A process on the GPU: listed by the running-process queries, its memory in
        `used` (as real NVML counts it), sampled by nvmlDeviceGetProcessUtilization at
        `sm_util` / `mem_util` percent (neither: an even share of the GPU's utilisation).
        The same pid again replaces it."""
        target = self.resolve(gpu)
        if not 0 < pid < 2**32:
            raise FakeNvmlError(f"--pid {pid}: expected a process id >= 1")
        room = target.memory_total - target.memory_reserved - target.memory_used
        if not 0 <= used <= room:
            raise FakeNvmlError(
                f"--used {used}: expected 0 to {room} bytes (GPU {target.index}'s free memory)"
            )
        procs = self.processes().get(target.index, {})
        if pid not in procs and len(procs) >= telemetry.MAX_PROCESSES:
            raise FakeNvmlError(f"GPU {target.index} has {telemetry.MAX_PROCESSES} processes")
        kinds = telemetry.process_kinds(kind)
        util = telemetry.process_util(sm_util, mem_util)
        return self._write([(Kind.PROCESS_ADD, target.index, used, pid, kinds, util)])[0]

    def remove_process(self, gpu: str | int, pid: int) -> Record:
        target = self.resolve(gpu)
        if pid not in self.processes().get(target.index, {}):
            raise FakeNvmlError(f"no process {pid} on GPU {target.index}")
        return self._write([(Kind.PROCESS_REMOVE, target.index, 0, pid, 0, 0)])[0]

    def processes(self) -> dict[int, dict[int, int]]:
        """GPU index -> {pid: used bytes}, replayed from the journal as the library does."""
        out: dict[int, dict[int, int]] = {}
        for r in self.events():
            if r.kind == Kind.PROCESS_ADD:
                out.setdefault(r.gpu, {})[r.gpu_instance] = r.data
            elif r.kind == Kind.PROCESS_REMOVE:
                out.get(r.gpu, {}).pop(r.gpu_instance, None)
        return out

    # ------------------------------------------------------------------- knobs

    def _knob_gpu(self, gpu: str | int | None) -> int | None:
        return None if gpu is None else self.resolve(gpu).index

    def fail(
        self,
        function: str,
        error: str,
        gpu: str | int | None = None,
        count: int = 0,
        **when: float | None,
    ) -> Record:
        """`function` answers `error` (on `gpu`, or on every call) until cleared, or for
        `count` calls; `after=N`: the node's first N matching calls pass; `probability=P`:
        each fails with P, drawn from `seed` (the same seed fails the same calls). Calls
        are counted per node: every process that loaded the library adds to one count."""
        return self.fail_records(function, error, gpu, count, **when)[-1]  # type: ignore[arg-type]

    def fail_records(
        self,
        function: str,
        error: str,
        gpu: str | int | None = None,
        count: int = 0,
        after: int = 0,
        probability: float | None = None,
        seed: int | None = None,
    ) -> list[Record]:
        """fail(), returning its records: FAIL, after its FAIL_WHEN when counted."""
        where = self._knob_gpu(gpu)
        # Every argument is checked before a slot is taken.
        entries = knobs.fail(function, error, where, count, after, probability, seed)
        if len(entries) == 2:  # counted: in the node's knobs.bin
            kind, on, calls, drawn, _, limit = entries[0]
            slot = knobs.claim_slot(self.path, self.identities().boot_id)
            entries[0] = (kind, on, calls, drawn, slot, limit)
        return self._write(entries)

    def delay(self, function: str, ms: int, gpu: str | int | None = None) -> Record:
        """`function` sleeps `ms` before answering (0: no more delay)."""
        return self._write([knobs.delay(function, ms, self._knob_gpu(gpu))])[0]

    def clear_knobs(
        self, fail: bool = True, delay: bool = True, function: str | None = None
    ) -> Record:
        what = (knobs.CLEAR_FAIL if fail else 0) | (knobs.CLEAR_DELAY if delay else 0)
        return self._write([knobs.clear(what, function)])[0]

    def events(self, start: int = 0) -> Iterator[Record]:
        try:
            yield from journal.read(self.path, start)
        except FileNotFoundError:
            raise FakeNvmlError(f"no journal in {self.path}: run `fakenvml init` first") from None


def faulted(records: Iterable[Record], recovered_too: bool = False) -> set[int]:
    """The one rule for which GPUs are faulted, for the lab's heal and the CLI alike: a GPU
    with a fault record (Xid, ECC, lost, a recovery action other than NONE) after its last
    recover; `recovered_too` keeps those recovered since, for a heal that must know a
    plugin saw a fault even when the GPU is fine again. A recovery action of 0 (NONE) is
    what `recover` leaves, not a fault."""
    out: set[int] = set()
    for r in records:
        if not r.kind.is_fault:  # telemetry, knobs, MIG layout changes
            continue
        if r.kind == Kind.RECOVER:
            if not recovered_too:
                out.discard(r.gpu)
        elif r.kind != Kind.RECOVERY_ACTION or r.data != 0:
            out.add(r.gpu)
    return out
