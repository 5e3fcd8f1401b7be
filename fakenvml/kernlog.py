"""The node's kernel log: every Xid the fake driver raises, as NVIDIA's driver prints it.

The real driver prints each Xid to the kernel log, and that line, not NVML, is what most
fleet health monitors read (node-problem-detector's kernel monitor among them):

    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.

(the format of NVIDIA's "Xid Errors" document, docs.nvidia.com/deploy/xid-errors). Every
kind node shares the host's kernel ring, so a line written there would appear on every
node; the fake driver writes each node's lines to `kern.log` in that node's state
directory instead, as rsyslog writes /var/log/kern.log on a real node, in rsyslog's
traditional file format (the one node-problem-detector's kernel-monitor-filelog.json
parses):

    Dec  3 04:41:07 seed-worker kernel: [58123.123456] NVRM: Xid (PCI:0000:3b:00): 79, ...

NodeDir writes the lines with the journal records they come from (fakenvml/node.py), so
an Xid injected any way (the CLI, the Python API, `--node` through the fakenvml pod, an
experiment) is in its node's log once. The log outlives `init`, as a kernel log outlives
a reboot.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from fakenvml.errors import FakeNvmlError
from fakenvml.journal import Kind, Record

KERNEL_LOG_FILE = "kern.log"
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

# What follows the process in the driver's line, for the Xids whose text is fixed (NVIDIA's
# Xid catalogue); other Xids' text names engines and addresses the fake does not have, so
# their line ends at the process.
TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 0, subpartition 0.",
    79: "GPU has fallen off the bus.",
}  # fmt: skip

# The record kinds the driver prints an Xid for, the code in the record's data: an Xid,
# and a GPU falling off the bus (Xid 79). An ECC double-bit error's Xid 48 is a record of
# its own (fakenvml/faults.py), so it is printed once.
XID_KINDS = frozenset({Kind.XID, Kind.FALLEN_OFF_BUS})


def pci(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as the driver prints it: "0000:3b:00"."""
    domain, bus, rest = bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


def line(host: str, bus_id: str, code: int, realtime_ns: int, monotonic_ns: int) -> str:
    """One Xid as rsyslog writes the driver's message to kern.log (local time, no year)."""
    t = time.localtime(realtime_ns // 1_000_000_000)
    stamp = f"{MONTHS[t.tm_mon - 1]} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    secs, ns = divmod(monotonic_ns, 1_000_000_000)
    text = f"Xid (PCI:{pci(bus_id)}): {code}, pid='<unknown>', name=<unknown>"
    if code in TEXT:
        text += f", {TEXT[code]}"
    return f"{stamp} {host} kernel: [{secs:5d}.{ns // 1000:06d}] NVRM: {text}\n"


def lines(host: str, bus_ids: Sequence[str], records: Iterable[Record]) -> str:
    """The kernel log's lines for `records` (those of XID_KINDS; the rest print nothing)."""
    return "".join(line(host, bus_ids[r.gpu], r.data, r.realtime_ns, r.monotonic_ns)
                   for r in records if r.kind in XID_KINDS)  # fmt: skip


def append(state_dir: Path, text: str) -> None:
    """One write with O_APPEND: lines from injectors running at once never interleave."""
    if not text:
        return
    path = Path(state_dir) / KERNEL_LOG_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise FakeNvmlError(f"the fault is recorded, but {path} cannot be written: "
                            f"{e.strerror}") from None  # fmt: skip


def ensure(state_dir: Path) -> None:
    """An empty log where there is none (a real node always has one: a monitor that
    starts before the first Xid must find the file to follow)."""
    path = Path(state_dir) / KERNEL_LOG_FILE
    try:
        path.touch(mode=0o644)  # never truncates
    except OSError as e:
        raise FakeNvmlError(f"cannot create {path}: {e.strerror}") from None
