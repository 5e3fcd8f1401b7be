"""The fault journal: an append-only file of fixed 64-byte records (src/state_format.h,
through fakenvml/layout.py).

Every injected fault is one record with a sequence number and two clocks. The C library
replays it for fault state (lost, ECC counters) and delivers it to event sets; waiting
processes are woken by inotify on this file, so delivery has no polling interval.
Telemetry (`fakenvml set`, `process`) and NVML failure knobs (`fail`, `delay`) are records
too: every process that loaded the library folds them in at its next call, as it does
faults, so they need no second channel (fakenvml/telemetry.py, fakenvml/knobs.py).

Writers serialise on flock(2) and append a whole record with one write(2); a record's
CRC lets readers tell a complete record from garbage. Then they store the journal's record
count in journal.gen, a 64-byte file every library maps read-only: a call compares that
one word with what it last read, so a process sees a fault at its very next NVML call
without a system call per call (src/state_format.h, fnv_gen).
"""

from __future__ import annotations

import collections
import enum
import fcntl
import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from fakenvml import layout
from fakenvml.errors import FakeNvmlError

JOURNAL_FILE, GEN_FILE = layout.JOURNAL_FILE, layout.GEN_FILE
HEADER = layout.JOURNAL_HEADER.span().struct  # magic, version, record size, boot id
GEN = layout.GEN.span().struct  # magic, boot id, committed records
GEN_COMMITTED = layout.GEN.offsets["committed"]
RECORD = layout.RECORD.span().struct  # data2 took 8 of 12 reserved bytes: old records read 0
ALL_GPUS = layout.ALL_GPUS  # fail / delay / clear: every GPU, and calls that name none
NO_INSTANCE = layout.NO_INSTANCE  # nvmlEventData_t gpuInstanceId/computeInstanceId outside MIG


class Kind(enum.IntEnum):
    """The record kinds: the numbers are the journal format (FNV_<NAME> in
    src/state_format.h), and `spelling` is the one name every command, file and report
    uses for a kind (`fakenvml events`, recordings, reports). The faults users inject, with
    their arguments, are fakenvml/faults.py's table, which names the kinds each appends."""

    XID = 1
    ECC_SINGLE = 2  # single-bit (corrected) ECC errors; data: how many
    ECC_DOUBLE = 3  # double-bit (uncorrected) ECC errors; data: how many
    LOST = 4
    FALLEN_OFF_BUS = 5
    RECOVER = 6  # clears lost and the recovery action
    RECOVERY_ACTION = 7  # data: the nvmlDeviceGpuRecoveryAction_t now asked for
    # Not faults: what `fakenvml set|process|fail|delay` write (meanings in state_format.h).
    SET = 8
    PROCESS_ADD = 9
    PROCESS_REMOVE = 10
    FAIL = 11
    DELAY = 12
    CLEAR = 13
    # MIG layout changes (fakenvml/mig.py, src/mig.c; src/mig_layout.c replays them).
    MIG_MODE = 14
    GPU_RESET = 15
    GI_CREATE = 16
    GI_DESTROY = 17
    CI_CREATE = 18
    CI_DESTROY = 19
    # When the FAIL right after it fails a call (fakenvml/knobs.py; meaning in state_format.h).
    FAIL_WHEN = 20

    @property
    def spelling(self) -> str:
        """xid, ecc-single, ecc-double, lost, fallen-off-bus, recover, recovery-action,
        set, process-add, process-remove, fail, delay, clear, mig-mode, gpu-reset,
        gi-create, gi-destroy, ci-create, ci-destroy, fail-when."""
        return self.name.lower().replace("_", "-")

    @property
    def is_fault(self) -> bool:
        """A fault or its recovery: what health (and `faulted()`) is about. Every kind but
        the settings (SET to FAIL_WHEN: telemetry, knobs, MIG layout), so that a fault's
        kind added after them (fakenvml/faults.py) is one without an edit here."""
        return not Kind.SET <= self <= Kind.FAIL_WHEN

    @classmethod
    def named(cls, text: str) -> Kind:
        """A kind by its spelling, or by one a file that already shipped used for it."""
        for kind in cls:
            if kind.is_fault and kind.spelling == text:
                return kind
        if text in SHIPPED_ALIASES:
            return SHIPPED_ALIASES[text]
        faults = ", ".join(k.spelling for k in cls if k.is_fault)
        raise ValueError(f"{text!r}: expected a fault kind ({faults})")


# Spellings that files written before the table still hold, read as the kind they meant:
# recording.json (`gpulab experiment report DIR` re-renders old runs) said ecc_sbe/ecc_dbe.
SHIPPED_ALIASES = {"ecc_sbe": Kind.ECC_SINGLE, "ecc_dbe": Kind.ECC_DOUBLE}


# What users type to inject is fakenvml/faults.py's (ECC is one fault there, `ecc`, its
# `double` argument picking the kind).
def ecc_kind(double: bool) -> Kind:
    return Kind.ECC_DOUBLE if double else Kind.ECC_SINGLE


# A named tuple from collections, not a dataclass or typing.NamedTuple: those imports
# (inspect, typing) were a fifth of every `fakenvml inject`'s start-up.
_RecordFields = collections.namedtuple(
    "_RecordFields",
    "seq realtime_ns monotonic_ns kind gpu data gpu_instance compute_instance data2",
    defaults=(0, NO_INSTANCE, NO_INSTANCE, 0),
)


class Record(_RecordFields):
    """One journal record: seq, realtime_ns, monotonic_ns, kind (Kind), gpu, data (Xid code,
    or ECC error count), gpu_instance (arg0 of the kinds after RECOVERY_ACTION),
    compute_instance (arg1), data2; all ints."""

    __slots__ = ()
    seq: int
    realtime_ns: int
    monotonic_ns: int
    kind: Kind
    gpu: int
    data: int
    gpu_instance: int
    compute_instance: int
    data2: int

    def pack(self) -> bytes:
        head = RECORD.pack(
            self.seq,
            self.realtime_ns,
            self.monotonic_ns,
            self.kind,
            self.gpu,
            self.data,
            self.gpu_instance,
            self.compute_instance,
            self.data2,
            0,
        )[: RECORD.size - 4]
        return head + struct.pack("<I", zlib.crc32(head))


def create(boot_id: int) -> bytes:
    """Header bytes of an empty journal for the state with `boot_id`."""
    return HEADER.pack(layout.JOURNAL_MAGIC, layout.JOURNAL_VERSION, RECORD.size, boot_id)


def create_gen(boot_id: int) -> bytes:
    """journal.gen of an empty journal for the state with `boot_id`."""
    return GEN.pack(layout.GEN_MAGIC, boot_id, 0)


def _store_committed(state_dir: Path, committed: int) -> None:
    """Tell mapped readers the journal now holds `committed` records (journal lock held).
    No journal.gen (a state from before it): readers check the journal's size instead."""
    try:
        fd = os.open(Path(state_dir) / GEN_FILE, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, struct.pack("<Q", committed), GEN_COMMITTED)
    finally:
        os.close(fd)


def _check_header(raw: bytes, path: Path) -> int:
    if len(raw) < HEADER.size:
        raise FakeNvmlError(f"{path} is truncated; re-run `fakenvml init`")
    magic, version, rsize, boot_id = HEADER.unpack_from(raw)
    if (magic, version, rsize) != (layout.JOURNAL_MAGIC, layout.JOURNAL_VERSION, RECORD.size):
        raise FakeNvmlError(f"{path} is not a fakenvml journal; re-run `fakenvml init`")
    return boot_id


def append(
    state_dir: Path,
    boot_id: int,
    kind: Kind,
    gpu: int,
    data: int = 0,
    gpu_instance: int = NO_INSTANCE,
    compute_instance: int = NO_INSTANCE,
) -> Record:
    """Append one record under an exclusive lock; its seq is one past the last record."""
    return append_many(state_dir, boot_id, [(kind, gpu, data, gpu_instance, compute_instance, 0)])[
        0
    ]


# kind, gpu, data, gpu_instance (arg0), compute_instance (arg1), data2
Entry = tuple[Kind, int, int, int, int, int]


def append_many(state_dir: Path, boot_id: int, entries: list[Entry]) -> list[Record]:
    """Append records with one write(2) under one lock, with one timestamp: a multi-value
    `fakenvml set` is one change, and its waves share their phase."""
    path = Path(state_dir) / JOURNAL_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
    except OSError as e:
        raise FakeNvmlError(f"cannot open {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if _check_header(os.pread(fd, HEADER.size, 0), path) != boot_id:
            raise FakeNvmlError(f"{path} belongs to another init of this node; re-run init")
        seq = (size - HEADER.size) // RECORD.size + 1
        if (size - HEADER.size) % RECORD.size:
            raise FakeNvmlError(f"{path} ends in a partial record; re-run `fakenvml init`")
        rt, mono = time.time_ns(), time.monotonic_ns()
        recs = [Record(seq + i, rt, mono, *e) for i, e in enumerate(entries)]
        os.write(fd, b"".join(r.pack() for r in recs))
        _store_committed(state_dir, recs[-1].seq)
        return recs
    finally:
        os.close(fd)


def read(state_dir: Path, start: int = 0) -> Iterator[Record]:
    """Records with index >= start (0-based), stopping at the first incomplete one."""
    path = Path(state_dir) / JOURNAL_FILE
    with open(path, "rb") as f:
        _check_header(f.read(HEADER.size), path)
        f.seek(HEADER.size + start * RECORD.size)
        while len(raw := f.read(RECORD.size)) == RECORD.size:
            if zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
                return
            seq, rt, mono, kind, gpu, data, gi, ci, data2, _crc = RECORD.unpack(raw)
            if kind in KINDS:  # else a newer fakenvml's kind: not ours to interpret
                yield Record(seq, rt, mono, Kind(kind), gpu, data, gi, ci, data2)


KINDS = frozenset(Kind)
