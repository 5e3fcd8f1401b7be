"""nvidia-smi-like views of a node, read only through the official nvidia-ml-py bindings.

Going through pynvml (never the state file) makes `fakenvml smi` a consumer like any other:
what it shows is what NVIDIA's plugin or a user's script would see, faults included.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml as nv  # binds to a library only at nvmlInit, which session() does after preload()

from fakenvml import library, statefile
from fakenvml.errors import FakeNvmlError
from fakenvml.node import STATE_DIR_ENV

LOST = "GPU is lost"
TOPOLOGY_LIMIT = 64  # -q prints a GPU x GPU relation only up to this many GPUs
_ARCH = {6: "Turing", 7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
_COMPUTE_MODE = {0: "Default", 1: "E. Thread", 2: "Prohibited", 3: "E. Process"}
_LEVEL = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_COLUMNS = [
    "GPU", "Name", "Persist-M", "Bus-Id", "Fan", "Temp", "Perf", "Pwr:Usage/Cap",
    "Memory-Usage", "GPU-Util", "Uncorr. ECC", "Compute M.", "MIG M.",
]  # fmt: skip


class _Lost(Exception):
    """A getter answered NVML_ERROR_GPU_IS_LOST: the rest of that GPU is unreadable."""


Handle = Any  # pynvml's c_nvmlDevice_t pointer


@dataclass
class Table:
    header: str
    columns: list[str]
    rows: list[list[str]]


@contextmanager
def session(state_dir: Path) -> Iterator[None]:
    """nvmlInit against `state_dir` through the fake library; nvmlShutdown on exit."""
    # Checked here so a missing state is one clear line, not a library log plus ours.
    if not (state_dir / statefile.STATE_FILE).is_file():
        raise FakeNvmlError(f"no state in {state_dir}: run `fakenvml init` first")
    os.environ[STATE_DIR_ENV] = str(state_dir)
    library.preload()
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise FakeNvmlError(f"nvmlInit failed for {state_dir}: {e}") from None
    try:
        yield
    finally:
        nv.nvmlShutdown()


def table(state_dir: Path, only: str | None = None) -> Table:
    with session(state_dir):
        rows = [_row(i, h) for i, h in _handles(only)]
        return Table(_header(), list(_COLUMNS), rows)


def listing(state_dir: Path, only: str | None = None) -> list[str]:
    """`nvidia-smi -L`: one line per GPU."""
    with session(state_dir):
        out = []
        for i, h in _handles(only):
            try:
                if h is None:
                    raise _Lost
                name = _read(nv.nvmlDeviceGetName, h)
                out.append(f"GPU {i}: {name} (UUID: {_read(nv.nvmlDeviceGetUUID, h)})")
            except _Lost:
                out.append(f"GPU {i}: [{LOST}]")
        return out


def query(state_dir: Path, only: str | None = None) -> list[str]:
    """`nvidia-smi -q`: details per GPU."""
    with session(state_dir):
        count = nv.nvmlDeviceGetCount()
        out = [
            "==============FAKENVML SMI LOG==============",
            "",
            _kv("Driver Version", nv.nvmlSystemGetDriverVersion(), 0),
            _kv("CUDA Version", _cuda_version(), 0),
            _kv("Attached GPUs", count, 0),
        ]
        handles = _handles(only)
        peers = _link_map() if count <= TOPOLOGY_LIMIT else None
        for i, h in handles:
            out.append("")
            try:
                out += _details(i, h, peers)
            except _Lost:
                out += [f"GPU {i}", _kv("State", LOST)]
        return out


def format_plain(t: Table) -> str:
    """Aligned columns with no colour: what tests and pipes read."""
    widths = [max(len(r[c]) for r in [t.columns, *t.rows]) for c in range(len(t.columns))]
    lines = [t.header, ""]
    for r in [t.columns, *t.rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def print_rich(t: Table) -> None:
    """The table for a terminal, lost GPUs in red; plain text when the terminal is too narrow."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console()
    plain = format_plain(t)
    if console.width < max(len(line) for line in plain.splitlines()) + 2 * len(t.columns):
        print(plain)  # a squeezed rich table folds every cell; wrapped lines read better
        return
    rt = RichTable(box=box.SIMPLE_HEAD, pad_edge=False)
    for c in t.columns:
        rt.add_column(c, justify="right" if c == "GPU" else "left", no_wrap=True)
    for r in t.rows:
        rt.add_row(*r, style="bold red" if LOST in r else None)
    console.print(t.header, highlight=False)
    console.print(rt)


# --------------------------------------------------------------------------- internals


def _read(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or "N/A" when not supported, "ERR!" on other errors; _Lost when lost."""
    try:
        value = fn(*args)
    except nv.NVMLError as e:
        if e.value == nv.NVML_ERROR_GPU_IS_LOST:
            raise _Lost from None
        return "N/A" if e.value == nv.NVML_ERROR_NOT_SUPPORTED else "ERR!"
    return value.decode() if isinstance(value, bytes) else value


def _bus_id(pci: Any) -> str:
    """busId of an nvmlPciInfo_t (pynvml hands it back as str or bytes by version)."""
    bus = pci.busId
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def _fmt(value: Any, pattern: str, scale: float = 1) -> str:
    """pattern % value/scale, passing "N/A" / "ERR!" through."""
    if isinstance(value, str):
        return value
    return pattern % (value / scale if scale != 1 else value)


def _header() -> str:
    driver = nv.nvmlSystemGetDriverVersion()
    nvml = nv.nvmlSystemGetNVMLVersion()
    return (
        f"FAKENVML-SMI  Driver Version: {driver}  NVML Version: {nvml}  "
        f"CUDA Version: {_cuda_version()}"
    )


def _cuda_version() -> str:
    v = nv.nvmlSystemGetCudaDriverVersion()
    return f"{v // 1000}.{v % 1000 // 10}"


def _handles(only: str | None) -> list[tuple[int, Handle | None]]:
    """(index, handle) for every GPU or the one `only` names; a lost GPU has no handle."""
    count = nv.nvmlDeviceGetCount()
    indexes = range(count) if only is None else [_resolve(only, count)]
    out = []
    for i in indexes:
        try:
            out.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
        except nv.NVMLError as e:
            if e.value != nv.NVML_ERROR_GPU_IS_LOST:
                raise
            out.append((i, None))
    return out


def _resolve(key: str, count: int) -> int:
    """`-i` like nvidia-smi: an index, a UUID, a serial or a PCI bus id."""
    key = key.strip()
    if key.isdigit() and int(key) < count:
        return int(key)
    lookups = [nv.nvmlDeviceGetHandleByUUID, nv.nvmlDeviceGetHandleBySerial]
    if ":" in key:
        lookups = [nv.nvmlDeviceGetHandleByPciBusId]
    for lookup in lookups:
        try:
            return int(nv.nvmlDeviceGetIndex(lookup(key.encode())))
        except nv.NVMLError as e:
            if e.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise FakeNvmlError(f"GPU {key!r} is lost; select it by index") from None
    raise FakeNvmlError(
        f"GPU {key!r} not found (indexes 0-{count - 1}, or a UUID / serial / PCI bus id)"
    )


def _row(i: int, h: Handle | None) -> list[str]:
    lost = [str(i), LOST] + ["ERR!"] * (len(_COLUMNS) - 2)
    if h is None:
        return lost
    try:
        name = _read(nv.nvmlDeviceGetName, h)
        pci = _read(nv.nvmlDeviceGetPciInfo, h)
        mem = _read(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)
        util = _read(nv.nvmlDeviceGetUtilizationRates, h)
        mig = _read(nv.nvmlDeviceGetMigMode, h)
        mode = _read(nv.nvmlDeviceGetComputeMode, h)
        persist = _read(nv.nvmlDeviceGetPersistenceMode, h)
        return [
            str(i),
            name,
            persist if isinstance(persist, str) else ("On" if persist else "Off"),
            pci if isinstance(pci, str) else _bus_id(pci),
            _fmt(_read(nv.nvmlDeviceGetFanSpeed, h), "%d%%"),
            _fmt(_read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU), "%dC"),
            _fmt(_read(nv.nvmlDeviceGetPerformanceState, h), "P%d"),
            _fmt(_read(nv.nvmlDeviceGetPowerUsage, h), "%dW", 1000)
            + " / "
            + _fmt(_read(nv.nvmlDeviceGetEnforcedPowerLimit, h), "%dW", 1000),
            mem if isinstance(mem, str) else f"{mem.used >> 20}MiB / {mem.total >> 20}MiB",
            util if isinstance(util, str) else f"{util.gpu}%",
            _fmt(_read(nv.nvmlDeviceGetTotalEccErrors, h, *_UNCORRECTED_VOLATILE), "%d"),
            mode if isinstance(mode, str) else _COMPUTE_MODE.get(mode, str(mode)),
            mig if isinstance(mig, str) else ("Enabled" if mig[0] else "Disabled"),
        ]
    except _Lost:
        return lost


_UNCORRECTED_VOLATILE = (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)


def _kv(key: str, value: object, depth: int = 1) -> str:
    indent = "    " * depth
    return f"{indent}{key}".ljust(42) + f": {value}"


def _details(i: int, h: Handle | None, peers: _Links | None) -> list[str]:
    if h is None:
        raise _Lost
    r = _read
    pci = r(nv.nvmlDeviceGetPciInfo, h)
    if isinstance(pci, str):
        raise _Lost
    mem = r(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)
    bar1 = r(nv.nvmlDeviceGetBAR1MemoryInfo, h)
    ecc = r(nv.nvmlDeviceGetEccMode, h)
    cc = r(nv.nvmlDeviceGetCudaComputeCapability, h)
    arch = r(nv.nvmlDeviceGetArchitecture, h)
    out = [
        f"GPU {_bus_id(pci)}",
        _kv("Index", i),
        _kv("Product Name", r(nv.nvmlDeviceGetName, h)),
        _kv("Product Architecture", _ARCH.get(arch, arch) if isinstance(arch, int) else arch),
        _kv("CUDA Compute Capability", cc if isinstance(cc, str) else f"{cc[0]}.{cc[1]}"),
        _kv("Persistence Mode", _on(r(nv.nvmlDeviceGetPersistenceMode, h))),
        _kv("MIG Mode", _on(_first(r(nv.nvmlDeviceGetMigMode, h)))),
        _kv("Serial Number", r(nv.nvmlDeviceGetSerial, h)),
        _kv("GPU UUID", r(nv.nvmlDeviceGetUUID, h)),
        _kv("Minor Number", r(nv.nvmlDeviceGetMinorNumber, h)),
        _kv("VBIOS Version", r(nv.nvmlDeviceGetVbiosVersion, h)),
        _kv("Board ID", _fmt(r(nv.nvmlDeviceGetBoardId, h), "0x%x")),
        _kv("Board Part Number", r(nv.nvmlDeviceGetBoardPartNumber, h)),
        _kv("Inforom Image Version", r(nv.nvmlDeviceGetInforomImageVersion, h)),
        _kv("CUDA Cores", r(nv.nvmlDeviceGetNumGpuCores, h)),
        "    PCI",
        _kv("Bus Id", _bus_id(pci), 2),
        _kv("Domain", f"0x{pci.domain:04X}", 2),
        _kv("Bus", f"0x{pci.bus:02X}", 2),
        _kv("Device", f"0x{pci.device:02X}", 2),
        _kv("Device Id", f"0x{pci.pciDeviceId:08X}", 2),
        _kv("Sub System Id", f"0x{pci.pciSubSystemId:08X}", 2),
        _kv("PCIe Generation Max", r(nv.nvmlDeviceGetMaxPcieLinkGeneration, h), 2),
        _kv("PCIe Generation Current", r(nv.nvmlDeviceGetCurrPcieLinkGeneration, h), 2),
        _kv("Link Width Max", _fmt(r(nv.nvmlDeviceGetMaxPcieLinkWidth, h), "%dx"), 2),
        _kv("Link Width Current", _fmt(r(nv.nvmlDeviceGetCurrPcieLinkWidth, h), "%dx"), 2),
        _kv("NUMA Node", r(nv.nvmlDeviceGetNumaNodeId, h)),
        _kv("CPU Affinity", _cpus(r(nv.nvmlDeviceGetCpuAffinity, h, 64))),
        _kv("Fan Speed", _fmt(r(nv.nvmlDeviceGetFanSpeed, h), "%d %%")),
        _kv("Performance State", _fmt(r(nv.nvmlDeviceGetPerformanceState, h), "P%d")),
        "    FB Memory Usage",
        *_memory(mem, reserved=True),
        "    BAR1 Memory Usage",
        *_memory(bar1, reserved=False),
        _kv("Compute Mode", _COMPUTE_MODE.get(r(nv.nvmlDeviceGetComputeMode, h), "N/A")),
        _kv("Utilization", _util(r(nv.nvmlDeviceGetUtilizationRates, h))),
        _kv("ECC Mode", _on(_first(ecc))),
        *_ecc(h),
        *_power(h),
        *_temperature(h),
        *_clocks(h),
        *_nvlinks(h),
    ]
    if peers is not None:
        out += _topology(i, h, peers)
    return out


def _on(v: object) -> str:
    return v if isinstance(v, str) else ("Enabled" if v else "Disabled")


def _first(v: Any) -> Any:
    return v if isinstance(v, str) else v[0]


def _util(u: Any) -> str:
    return u if isinstance(u, str) else f"gpu {u.gpu} %, memory {u.memory} %"


def _memory(m: Any, reserved: bool) -> list[str]:
    if isinstance(m, str):
        return [_kv("Total", m, 2)]
    names = ["bar1Total", "bar1Used", "bar1Free"] if not reserved else ["total", "used", "free"]
    total, used, free = (getattr(m, n) for n in names)
    out = [_kv("Total", f"{total >> 20} MiB", 2)]
    if reserved:
        out.append(_kv("Reserved", f"{m.reserved >> 20} MiB", 2))
    return [*out, _kv("Used", f"{used >> 20} MiB", 2), _kv("Free", f"{free >> 20} MiB", 2)]


def _cpus(mask: Any) -> str:
    """CPU affinity words as ranges: 0-31,64-95."""
    if isinstance(mask, str):
        return mask
    cpus = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if word >> b & 1]
    ranges: list[list[int]] = []
    for c in cpus:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges) or "none"


_ECC_COUNTERS = [
    (f"{label} {bits}", kind, counter)
    for label, counter in (("Volatile", nv.NVML_VOLATILE_ECC), ("Aggregate", nv.NVML_AGGREGATE_ECC))
    for bits, kind in (
        ("Single Bit", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("Double Bit", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    )
]
_RETIREMENT = [
    ("Single Bit ECC", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    ("Double Bit ECC", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
]
_THRESHOLDS = [
    ("GPU Shutdown Temp", nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ("GPU Slowdown Temp", nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("GPU Max Operating Temp", nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ("Memory Max Operating Temp", nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
]
_CLOCKS = [
    ("Graphics", nv.NVML_CLOCK_GRAPHICS),
    ("SM", nv.NVML_CLOCK_SM),
    ("Memory", nv.NVML_CLOCK_MEM),
    ("Video", nv.NVML_CLOCK_VIDEO),
]
_WATTS = "%.2f W"


def _get(pattern: str, fn: Callable[..., Any], *args: Any, scale: float = 1) -> str:
    return _fmt(_read(fn, *args), pattern, scale)


def _ecc(h: Handle) -> list[str]:
    out = ["    ECC Errors"]
    for name, kind, counter in _ECC_COUNTERS:
        out.append(_kv(name, _get("%d", nv.nvmlDeviceGetTotalEccErrors, h, kind, counter), 2))
    out.append("    Retired Pages")
    for name, cause in _RETIREMENT:
        pages = _read(nv.nvmlDeviceGetRetiredPages, h, cause)
        out.append(_kv(name, pages if isinstance(pages, str) else len(pages), 2))
    pending = _read(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    out.append(_kv("Pending Page Blacklist", _yes(pending), 2))
    rows = _read(nv.nvmlDeviceGetRemappedRows, h)
    if isinstance(rows, str):
        return [*out, _kv("Remapped Rows", rows)]
    return [
        *out,
        "    Remapped Rows",
        _kv("Correctable Error", rows[0], 2),
        _kv("Uncorrectable Error", rows[1], 2),
        _kv("Pending", _yes(rows[2]), 2),
        _kv("Remapping Failure Occurred", _yes(rows[3]), 2),
    ]


def _yes(v: object) -> str:
    return v if isinstance(v, str) else ("Yes" if v else "No")


def _power(h: Handle) -> list[str]:
    limits = _read(nv.nvmlDeviceGetPowerManagementLimitConstraints, h)
    lo, hi = (limits, limits) if isinstance(limits, str) else limits
    return [
        "    Power Readings",
        _kv("Power Draw", _get(_WATTS, nv.nvmlDeviceGetPowerUsage, h, scale=1000), 2),
        _kv(
            "Current Power Limit",
            _get(_WATTS, nv.nvmlDeviceGetPowerManagementLimit, h, scale=1000),
            2,
        ),
        _kv(
            "Default Power Limit",
            _get(_WATTS, nv.nvmlDeviceGetPowerManagementDefaultLimit, h, scale=1000),
            2,
        ),
        _kv("Min Power Limit", _fmt(lo, _WATTS, 1000), 2),
        _kv("Max Power Limit", _fmt(hi, _WATTS, 1000), 2),
        _kv("Total Energy", _get("%d mJ", nv.nvmlDeviceGetTotalEnergyConsumption, h), 2),
    ]


def _temperature(h: Handle) -> list[str]:
    now = _get("%d C", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    out = ["    Temperature", _kv("GPU Current Temp", now, 2)]
    for name, threshold in _THRESHOLDS:
        out.append(_kv(name, _get("%d C", nv.nvmlDeviceGetTemperatureThreshold, h, threshold), 2))
    return out


def _clocks(h: Handle) -> list[str]:
    out = ["    Clocks"]
    out += [_kv(n, _get("%d MHz", nv.nvmlDeviceGetClockInfo, h, k), 2) for n, k in _CLOCKS]
    out.append("    Max Clocks")
    out += [_kv(n, _get("%d MHz", nv.nvmlDeviceGetMaxClockInfo, h, k), 2) for n, k in _CLOCKS]
    return out


def _active_links(h: Handle) -> list[tuple[int, str]]:
    """(link, remote bus id) of each active NVLink; empty when the GPU has none."""
    links = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        state = _read(nv.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):
            break  # past the GPU's last link (or no NVLink at all)
        if state == nv.NVML_FEATURE_ENABLED:
            remote = _read(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            links.append((link, remote if isinstance(remote, str) else _bus_id(remote)))
    return links


def _nvlinks(h: Handle) -> list[str]:
    version = _read(nv.nvmlDeviceGetNvLinkVersion, h, 0)
    if isinstance(version, str):
        return [_kv("NVLink", "N/A")]
    states = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        state = _read(nv.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):
            break
        states.append(state)
    remotes = dict(_active_links(h))
    out = [_kv("NVLink", f"{len(states)} links, nvmlNvlinkVersion {version}")]
    for link, state in enumerate(states):
        where = f"-> {remotes[link]}" if link in remotes else ""
        out.append(_kv(f"Link {link}", f"{'Active' if state else 'Inactive'} {where}".strip(), 2))
    return out


@dataclass
class _Links:
    bus_of: dict[int, str]  # GPU index -> bus id
    remotes: dict[int, list[str]]  # GPU index -> remote bus id of each active link


def _link_map() -> _Links:
    links = _Links({}, {})
    for i, h in _handles(None):
        if h is None:
            continue
        try:
            pci = _read(nv.nvmlDeviceGetPciInfo, h)
            if isinstance(pci, str):
                continue
            links.bus_of[i] = _bus_id(pci)
            links.remotes[i] = [bus for _, bus in _active_links(h)]
        except _Lost:
            continue
    return links


def _topology(i: int, h: Handle, peers: _Links) -> list[str]:
    """Like a row of `nvidia-smi topo -m`: NV<n> where NVLink joins two GPUs, else PCIe."""
    gpu_buses = set(peers.bus_of.values())
    mine = peers.remotes.get(i, [])
    out = ["    Topology"]
    for j, bus in peers.bus_of.items():
        if j == i:
            continue
        theirs = set(peers.remotes.get(j, [])) - gpu_buses  # NVSwitches j reaches
        shared = sum(1 for r in mine if r == bus or r in theirs)
        if shared:
            relation = f"NV{shared}"
        else:
            try:
                other = nv.nvmlDeviceGetHandleByIndex(j)
                level = _read(nv.nvmlDeviceGetTopologyCommonAncestor, h, other)
            except (nv.NVMLError, _Lost):
                level = "N/A"
            relation = _LEVEL.get(level, str(level)) if isinstance(level, int) else level
        out.append(_kv(f"GPU {j}", relation, 2))
    return out
