"""NVIDIA's real nvidia-smi (Debian's 535 and 550 packages, fetched by ci/nvidia-smi.sh)
against the fake, and the private export table it needs (fakenvml/src/export_table.c).
Every test that runs nvidia-smi runs with both.

nvidia-smi runs as a child process that loads the library under test by name through
LD_LIBRARY_PATH, with the state directory in FAKENVML_STATE_DIR, as on a node.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from clusters import versions
from fakenvml import library, mig, paths
from fakenvml.model import Gpu
from fakenvml.node import NodeDir

from .conftest import PACKAGES, smi_binary

NODE = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}, {"profile": "L40S"}]}
EXIT_GPU_LOST = 15  # nvidia-smi's exit status for NVML_ERROR_GPU_IS_LOST (its value)
EXIT_VERSION_MISMATCH = 255
SMI_GUID = bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")  # 6c3efec4-8fc9-4e6c-a327-...
TABLE_SLOTS = 244

Smi = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def driver(package: str) -> str:
    """The driver release the nvidia-smi under test belongs to, which the fake reports."""
    return package.rsplit("-", 1)[0]


@pytest.fixture
def spec(driver: str) -> Callable[..., dict]:
    """spec(gpus=..., topology=...): a node's inventory with the driver of the nvidia-smi
    under test (NODE's GPUs unless given)."""

    def make(**keys: object) -> dict:
        return {**NODE, "driver_version": driver, **keys}

    return make


@pytest.fixture
def node(make_state: Callable[..., NodeDir], spec: Callable[..., dict]) -> NodeDir:
    return make_state(spec())


@pytest.fixture
def smi(nvidia_smi: Path, node: NodeDir) -> Smi:
    """smi(*args, library_dir=...) runs nvidia-smi on the state make_state made last
    (`node`, unless the test made another)."""

    def run(*args: str, library_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)  # make_state set STATE_DIR_ENV
        env["LD_LIBRARY_PATH"] = str(library_dir or library.path().parent)
        return subprocess.run(
            [str(nvidia_smi), *args], env=env, capture_output=True, text=True, timeout=60
        )

    return run


def gpus(node: NodeDir) -> list[Gpu]:
    return node.node().gpus


def legacy_bus_id(gpu: Gpu) -> str:
    return f"{gpu.pci_domain:04X}:{gpu.pci_bus:02X}:{gpu.pci_device:02X}.{gpu.pci_function:X}"


# --------------------------------------------------------------------------- nvidia-smi


def test_list_shows_every_gpu_with_its_uuid(smi: Smi, node: NodeDir) -> None:
    res = smi("-L")
    assert res.returncode == 0, res.stdout + res.stderr
    expected = [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in gpus(node)]
    assert res.stdout.splitlines() == expected


def test_query_gpu_matches_the_inventory(smi: Smi, node: NodeDir) -> None:
    res = smi("--query-gpu=name,uuid,memory.total,pci.bus_id", "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stdout + res.stderr
    expected = [
        f"{g.name}, {g.uuid}, {g.memory_total >> 20}, {g.bus_id}".upper() for g in gpus(node)
    ]
    assert [line.upper() for line in res.stdout.splitlines()] == expected
    assert {g.name for g in gpus(node)} == {"NVIDIA H100 80GB HBM3", "NVIDIA L40S"}


def test_query_shows_versions_product_names_and_host_pcie_generation(
    smi: Smi, node: NodeDir, driver: str
) -> None:
    res = smi("-q")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [" ".join(line.split()) for line in res.stdout.splitlines()]
    assert f"Driver Version : {driver}" in lines
    assert f"Attached GPUs : {len(gpus(node))}" in lines
    names = [line.split(" : ", 1)[1] for line in lines if line.startswith("Product Name : ")]
    assert names == [g.name for g in gpus(node)]
    # "Host Max" comes from export-table slot 230; an unknown slot would print N/A.
    host_max = [line.split(" : ")[1] for line in lines if line.startswith("Host Max : ")]
    assert host_max == [str(g.pcie_gen) for g in gpus(node)]


def test_default_table_shows_gpus_and_no_processes(smi: Smi, node: NodeDir, driver: str) -> None:
    res = smi()
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"NVIDIA-SMI {driver}" in res.stdout and f"Driver Version: {driver}" in res.stdout
    for g in gpus(node):
        assert g.bus_id in res.stdout
    # The processes table is filled from export-table slots 213-215 (empty lists).
    assert "No running processes found" in res.stdout


def test_processes_added_show_in_the_table_and_in_query(smi: Smi, node: NodeDir) -> None:
    """`fakenvml process add` reaches nvidia-smi through export-table slots 213 (compute)
    and 215 (graphics): the table shows a pid this host runs, with its name, type and
    memory; -q lists every pid, one this host does not run too (nameless, as a container's
    nvidia-smi shows other namespaces' processes)."""
    me, fake = os.getpid(), int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    node.add_process(1, me, 3 << 30, kind="both")
    node.add_process(1, fake, 512 << 20)
    res = smi("-i", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if f" {me} " in line]
    assert len(rows) == 1 and rows[0][1:6] == ["1", "N/A", "N/A", str(me), "C+G"], rows
    assert rows[0][-2] == "3072MiB" and f" {fake} " not in res.stdout
    res = smi("-q", "-i", "1", "-d", "PIDS")
    entries = res.stdout.split("Process ID")[1:]
    by_pid = {int(e.split(":")[1].split()[0]): e for e in entries}
    assert set(by_pid) == {me, fake}
    assert "Type                          : C+G" in by_pid[me]
    assert "Used GPU Memory               : 512 MiB" in by_pid[fake]


def test_nvidia_smi_mig_lists_and_changes_the_layout(smi: Smi, node: NodeDir) -> None:
    """The real `nvidia-smi mig` over the NVML MIG API: -lgi lists the layout, -L the MIG
    devices by UUID, and -dci/-dgi/-cgi -C change it for every other process (the library
    journals NVML's creates and destroys)."""
    mig.configure(node, 1, "3g.40gb,2g.20gb,1g.10gb")
    res = smi("mig", "-lgi", "-i", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if "MIG " in line]
    assert sorted((r[3], r[5], r[6]) for r in rows) == sorted(
        [("1g.10gb", "13", "6:1"), ("2g.20gb", "5", "4:2"), ("3g.40gb", "1", "0:4")])  # fmt: skip
    listed = smi("-L").stdout
    assert all(f"(UUID: {d.uuid})" in listed for d in mig.devices(node))
    for args in (("-dci", "-gi", "13"), ("-dgi", "-gi", "13")):
        assert smi("mig", *args, "-i", "1").returncode == 0
    assert [d.gi for d in mig.devices(node)] == [1, 5]
    res = smi("mig", "-cgi", "1g.10gb", "-C", "-i", "1")
    assert "Successfully created GPU instance ID 13" in res.stdout, res.stdout + res.stderr
    assert [(d.gi, d.profile) for d in mig.devices(node)] == [
        (1, "3g.40gb"), (5, "2g.20gb"), (13, "1g.10gb")]  # fmt: skip
    res = smi("mig", "-cgi", "3g.40gb", "-i", "1")  # no room left
    assert res.returncode != 0 and "Insufficient Resources" in res.stdout + res.stderr


def test_id_option_takes_a_bus_id(smi: Smi, node: NodeDir) -> None:
    # A colon sends -i through export-table slots 12 (parse) and 75 (each GPU's location).
    last = gpus(node)[2]
    short = f"{last.pci_domain:x}:{last.pci_bus:x}:{last.pci_device:x}.0"
    for given in (last.bus_id, legacy_bus_id(last), short):
        res = smi("-i", given, "--query-gpu=index,uuid", "--format=csv,noheader")
        assert (res.returncode, res.stdout) == (0, f"2, {last.uuid}\n"), given
    res = smi("-i", "0100:ff:1f.0", "-q")
    assert res.returncode != 0 and "No devices were found" in res.stdout
    res = smi("-i", "zz:1", "-q")
    assert res.returncode != 0 and "Invalid PCI bus id format" in res.stdout


def test_a_lost_gpu_is_reported_by_its_bus_id(smi: Smi, node: NodeDir) -> None:
    node.lose(1)
    first, lost, last = gpus(node)
    bus = legacy_bus_id(lost)  # the name comes from export-table slot 81
    res = smi("-L")
    assert res.returncode == EXIT_GPU_LOST
    assert [line for line in res.stdout.splitlines() if line] == [
        f"GPU 0: {first.name} (UUID: {first.uuid})",
        f"Unable to determine the device handle for gpu {bus}: GPU is lost.  "
        "Reboot the system to recover this GPU",
        f"GPU 2: {last.name} (UUID: {last.uuid})",
    ]
    res = smi()  # the table gives up at the lost GPU, in the wording real drivers show
    assert res.returncode == EXIT_GPU_LOST
    assert res.stdout.startswith(
        f"Unable to determine the device handle for GPU{bus}: GPU is lost."
    )
    node.recover(1)
    assert smi("-L").returncode == 0


def test_a_double_bit_ecc_error_shows_as_the_volatile_uncorrected_count(
    smi: Smi, node: NodeDir
) -> None:
    node.inject_ecc(2, True, 3)
    res = smi(
        "--query-gpu=index,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total",
        "--format=csv,noheader",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == ["0, 0, 0", "1, 0, 0", "2, 3, 0"]
    table = smi("-i", "2").stdout
    row = next(line for line in table.splitlines() if gpus(node)[2].bus_id in line)
    assert row.rstrip("|").split("|")[-1].strip() == "3"  # "Volatile Uncorr. ECC"


def test_another_driver_version_is_shown_not_refused(
    smi: Smi, make_state: Callable[..., NodeDir], spec: Callable[..., dict], driver: str
) -> None:
    # nvidia-smi (535 and 550) compares no versions itself: against a library that says 580
    # it runs and prints both (a real 580 library would not serve its export table; below).
    make_state({**spec(), "driver_version": "580.95.05"})
    res = smi()
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"NVIDIA-SMI {driver}" in res.stdout and "Driver Version: 580.95.05" in res.stdout


def test_a_library_without_its_export_table_is_refused(smi: Smi, tmp_path: Path) -> None:
    # An NVML that does not serve nvidia-smi's export table (another release's, or the fake
    # before it had one): the same library with that one symbol's name changed.
    data = library.path().read_bytes()
    name = b"nvmlInternalGetExportTable"
    assert name in data
    patched = tmp_path / library.SONAME
    patched.write_bytes(data.replace(name, name[:-1] + b"X"))
    res = smi("-L", library_dir=tmp_path)
    assert res.returncode == EXIT_VERSION_MISMATCH
    assert res.stdout.startswith("Mismatch in versions between nvidia-smi and NVML.")
    assert smi("-L").returncode == 0  # the unpatched library is served


# ------------------------------------------------- topo -m, dmon, pmon, nvlink -s, -q -x

# Every PCIe level and both kinds of NVLink path: on NUMA node 0, GPUs 0-1 share a switch
# (PIX), 2 is on the next switch under the same upper switch (PXB), 4 under the next upper
# switch of the same host bridge (PHB), 8 behind the next host bridge (NODE); GPU 9 is on
# NUMA node 1 (SYS). GPUs 0-1 are joined by 12 NVLinks, 2 and 9 by 4 (8 of 2's inactive).
TOPOLOGY = {
    "gpus": [{"profile": "A100-SXM4-80GB", "count": 3}, {"profile": "L40S", "count": 6},
             {"profile": "A100-SXM4-80GB"}],
    "topology": {
        "nvlink": {"links": [{"gpus": [0, 1], "count": 12}, {"gpus": [2, 9], "count": 4}]},
        "pcie": {"gpus_per_switch": 2, "switches_per_upper": 2, "uppers_per_bridge": 2},
        "numa": {"gpus": [0] * 9 + [1], "cpus_per_node": 16},
    },
}  # fmt: skip
A100_LINK = "25 GB/s"  # profiles.py: A100's nvlink_mbps, as nvidia-smi nvlink -s prints it


@pytest.fixture
def wired(make_state: Callable[..., NodeDir], spec: Callable[..., dict], node: NodeDir) -> NodeDir:
    """TOPOLOGY's node, which smi then runs on (made after `node`)."""
    return make_state(spec(**TOPOLOGY))


def path(a: Gpu, b: Gpu) -> str:
    """What `topo -m` prints for a pair, from the inventory: NV<n> for n NVLinks, else the
    PCIe level their switch, upper switch, host bridge and NUMA node ids make."""
    if a is b:
        return "X"
    if links := sum(link.active and link.remote_index == b.index for link in a.links):
        return f"NV{links}"
    for level, same in (("PIX", a.pcie_switch == b.pcie_switch),
                        ("PXB", a.pcie_upper_switch == b.pcie_upper_switch),
                        ("PHB", a.host_bridge == b.host_bridge),
                        ("NODE", a.numa_node == b.numa_node)):  # fmt: skip
        if same:
            return level
    return "SYS"


def test_topo_matrix_shows_the_inventory_s_nvlinks_pcie_tree_and_affinity(
    smi: Smi, wired: NodeDir
) -> None:
    res = smi("topo", "-m")
    assert res.returncode == 0, res.stdout + res.stderr
    gpus_ = gpus(wired)
    rows = {}
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.split("\t")]
        if cells[0].startswith("GPU") and cells[0][3:].isdigit():
            rows[int(cells[0][3:])] = cells[1:]
    assert sorted(rows) == [g.index for g in gpus_]
    for a in gpus_:
        cells = rows[a.index]
        assert cells[: len(gpus_)] == [path(a, b) for b in gpus_], a.index
        # CPU and NUMA affinity; GPU NUMA ID (535: N/A, 550: nvmlDeviceGetNumaNodeId) is not
        # checked: the fake answers the attached CPU node there (docs/fakenvml.md).
        cpu, numa = [c for c in cells[len(gpus_) :] if c][:2]
        assert (cpu, numa) == (f"{a.cpu_first}-{a.cpu_first + a.cpu_count - 1}", str(a.numa_node))
    seen = {cell for cells in rows.values() for cell in cells[: len(gpus_)]}
    assert {"PIX", "PXB", "PHB", "NODE", "SYS", "NV12", "NV4"} <= seen
    assert "NV# = Connection traversing a bonded set of # NVLinks" in " ".join(res.stdout.split())


def test_topo_matrix_of_an_nvswitch_board_is_nv18_everywhere(
    smi: Smi, make_state: Callable[..., NodeDir], spec: Callable[..., dict]
) -> None:
    gpus_ = [{"profile": "H100-SXM5-80GB", "count": 4}]
    make_state(spec(gpus=gpus_, topology={"nvlink": {"nvswitch": True}}))
    res = smi("topo", "-m")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t")[1:5] for line in res.stdout.splitlines() if line.startswith("GPU")]
    assert [[c.strip() for c in r] for r in rows] == [
        ["X" if i == j else "NV18" for j in range(4)] for i in range(4)
    ]


def table(out: str) -> list[dict[str, str]]:
    """dmon's and pmon's rows by their header's column names."""
    lines = out.splitlines()
    names = lines[0].lstrip("#").split()
    return [dict(zip(names, line.split(), strict=False)) for line in lines if line[:1] != "#"]


def test_dmon_shows_each_gpu_s_telemetry(smi: Smi, node: NodeDir) -> None:
    node.set_sensors(1, ["power=350W", "temperature=71", "mem-temperature=77", "util=63",
                         "mem-util=21", "sm-clock=1200", "mem-clock=1593"])  # fmt: skip
    res = smi("dmon", "-c", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = table(res.stdout)
    assert [int(r["gpu"]) for r in rows] == [g.index for g in gpus(node)]
    picked = ("pwr", "gtemp", "mtemp", "sm", "mem", "mclk", "pclk")
    assert [rows[1][k] for k in picked] == ["350", "71", "77", "63", "21", "1593", "1200"]
    for g in (gpus(node)[0], gpus(node)[2]):  # idle: the profile's readings
        row = rows[g.index]
        assert row["pwr"] == str(g.power_usage_mw // 1000) and row["gtemp"] == str(g.temp_gpu)
        assert (row["mclk"], row["pclk"]) == (str(g.clocks[2]), str(g.clocks[1]))
    assert rows[2]["mtemp"] == "-"  # L40S: no memory temperature sensor


def test_pmon_lists_the_processes_on_each_gpu(smi: Smi, node: NodeDir) -> None:
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            node.add_process(1, sleeper.pid, 1 << 30, kind="both")
            node.add_process(2, sleeper.pid, 1 << 20, kind="graphics")
            res = smi("pmon", "-c", "1")
        finally:
            sleeper.kill()
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {int(r["gpu"]): r for r in table(res.stdout)}
    assert sorted(rows) == [g.index for g in gpus(node)]
    assert (rows[0]["pid"], rows[0]["type"]) == ("-", "-")
    assert (rows[1]["pid"], rows[1]["type"], rows[1]["command"]) == (
        str(sleeper.pid),
        "C+G",
        "sleep",
    )
    assert (rows[2]["pid"], rows[2]["type"]) == (str(sleeper.pid), "G")


def test_nvlink_status_shows_active_links_at_the_boards_speed(smi: Smi, wired: NodeDir) -> None:
    res = smi("nvlink", "-s")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout.split("GPU ")[1:]
    shown = {int(part.split(":")[0]): part for part in out}
    assert sorted(shown) == [0, 1, 2, 9]  # the L40S cards have no NVLink: not listed
    for index, part in shown.items():
        g = gpus(wired)[index]
        assert part.splitlines()[0] == f"{index}: {g.name} (UUID: {g.uuid})"
        links = [line.split(": ", 1)[1] for line in part.splitlines()[1:]]
        assert links == [A100_LINK if link.active else "<inactive>" for link in g.links]
    assert shown[2].count(A100_LINK) == 4 and shown[0].count(A100_LINK) == 12


def test_query_xml_is_well_formed_and_carries_the_inventory(
    smi: Smi, node: NodeDir, driver: str
) -> None:
    mig.configure(node, 1, "3g.40gb,1g.10gb")
    me = os.getpid()
    node.add_process(0, me, 2 << 30)
    res = smi("-q", "-x")
    assert res.returncode == 0, res.stdout + res.stderr
    root = ET.fromstring(res.stdout)  # nvidia-smi's own XML, DOCTYPE and all
    assert root.tag == "nvidia_smi_log"
    assert (root.findtext("driver_version"), root.findtext("attached_gpus")) == (driver, "3")
    xml_gpus = root.findall("gpu")
    assert [x.get("id") for x in xml_gpus] == [g.bus_id for g in gpus(node)]
    for x, g in zip(xml_gpus, gpus(node), strict=True):
        assert x.findtext("product_name") == g.name
        assert x.findtext("uuid") == g.uuid and x.findtext("serial") == g.serial
        assert x.findtext("minor_number") == str(g.minor)
        assert x.findtext("pci/pci_bus_id") == g.bus_id
        assert x.findtext("fb_memory_usage/total") == f"{g.memory_total >> 20} MiB"
        assert x.findtext("pci/pci_gpu_link_info/pcie_gen/max_host_link_gen") == str(g.pcie_gen)
    # Export-table slots 242 and 243, as the H100 capture's -q reads (550 asks no slot for
    # the sparse mode and prints "Uninitialized").
    assert [x.findtext("addressing_mode") for x in xml_gpus] == ["None"] * 3
    if driver.startswith("535."):
        sparse = [x.findtext("sparse_operation_mode") for x in xml_gpus]
        assert sparse == ["Disabled", "Disabled", "N/A"]  # Hopper; the L40S is Ada
    modes = [x.findtext("mig_mode/current_mig") for x in xml_gpus]
    assert modes == ["Disabled", "Enabled", "N/A"]  # L40S: no MIG
    devices = xml_gpus[1].findall("mig_devices/mig_device")
    shown = [(d.findtext("gpu_instance_id"), d.findtext("fb_memory_usage/total")) for d in devices]
    assert shown == [(str(d.gi), f"{d.memory_mib} MiB") for d in mig.devices(node)]
    procs = xml_gpus[0].findall("processes/process_info")
    assert [(p.findtext("pid"), p.findtext("used_memory")) for p in procs] == [
        (str(me), "2048 MiB")
    ]


# --------------------------------------------------------------------------- the table


class _Guid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * 16)]


def _table(lib: ctypes.CDLL, guid: bytes = SMI_GUID) -> tuple[int, ctypes.c_void_p]:
    g = _Guid((ctypes.c_uint8 * 16)(*guid))
    table = ctypes.c_void_p()
    ret = lib.nvmlInternalGetExportTable(ctypes.byref(table), ctypes.byref(g))
    return ret, table


def _slot(table: ctypes.c_void_p, index: int, *argtypes: type) -> Callable[..., int]:
    address = ctypes.c_void_p.from_address(table.value + 8 * index).value  # type: ignore[operator]
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(address)


def test_the_table_has_a_size_then_244_slots(nvml: object, fake_library: ctypes.CDLL) -> None:
    ret, table = _table(fake_library)
    assert ret == 0 and table.value
    assert ctypes.c_uint64.from_address(table.value).value == 8 * TABLE_SLOTS
    slots = (ctypes.c_void_p * (TABLE_SLOTS - 1)).from_address(table.value + 8)
    assert all(slots)  # no NULL slot: callers that do not check still get an answer


def test_another_guid_is_not_supported(nvml: object, fake_library: ctypes.CDLL) -> None:
    ret, table = _table(fake_library, bytes(16))
    assert ret == 3 and not table.value  # NVML_ERROR_NOT_SUPPORTED, nothing written
    assert fake_library.nvmlInternalGetExportTable(None, None) == 2  # INVALID_ARGUMENT


def test_slot_81_names_a_gpu_by_its_bus_id(
    nvml: object, fake_library: ctypes.CDLL, state: NodeDir
) -> None:
    _, table = _table(fake_library)
    name = _slot(table, 81, ctypes.c_uint, ctypes.c_char_p, ctypes.c_uint)
    buf = ctypes.create_string_buffer(34)
    for g in gpus(state):
        assert name(g.index, buf, 34) == 0
        assert buf.value.decode() == legacy_bus_id(g)
    state.lose(3)
    assert name(3, buf, 34) == 0  # a lost GPU still has a bus id for the message
    assert name(len(gpus(state)), buf, 34) == 2
    assert name(0, buf, 5) == 7  # INSUFFICIENT_SIZE


def _device(index: int) -> int:
    """A device handle as the address pynvml holds."""
    return ctypes.cast(pynvml.nvmlDeviceGetHandleByIndex(index), ctypes.c_void_p).value or 0


def test_process_list_slots_answer_the_gpu_s_processes(
    nvml: object, fake_library: ctypes.CDLL, state: NodeDir
) -> None:
    """213 compute, 214 MPS (none here), 215 graphics; entries of 0x1020 bytes: pid at 0,
    used bytes at 8, GPU/compute instance ids at 16/20 (~0: no MIG), the name at 32."""
    _, table = _table(fake_library)
    device = _device(0)
    lists = {
        i: _slot(table, i, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p)
        for i in (213, 214, 215)
    }
    for listing in lists.values():
        count = ctypes.c_uint(500)
        assert listing(device, ctypes.byref(count), None) == 0 and count.value == 0
        assert listing(None, ctypes.byref(count), None) == 2
    state.add_process(0, 4321, 5 << 20, kind="graphics")
    got = {}
    for i, listing in lists.items():
        buf, count = ctypes.create_string_buffer(0x1020 * 4), ctypes.c_uint(4)
        assert listing(device, ctypes.byref(count), buf) == 0
        got[i] = [struct.unpack_from("<I4xQII", buf.raw, k * 0x1020) for k in range(count.value)]
    assert got == {213: [], 214: [], 215: [(4321, 5 << 20, 0xFFFFFFFF, 0xFFFFFFFF)]}


def test_slot_230_is_the_host_max_pcie_generation(
    nvml: object, fake_library: ctypes.CDLL, state: NodeDir
) -> None:
    _, table = _table(fake_library)
    host_max = _slot(table, 230, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint))
    gen = ctypes.c_uint(0)
    assert host_max(_device(0), ctypes.byref(gen)) == 0
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert gen.value == gpus(state)[0].pcie_gen == pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)


def test_slot_23_is_topo_s_path_between_two_bus_ids(
    nvml: object, fake_library: ctypes.CDLL, state: NodeDir
) -> None:
    """(bus id, bus id, unsigned *path): 0-4 PIX, PXB, PHB, NODE, SYS; 4 + n NVn."""
    _, table = _table(fake_library)
    topo = _slot(table, 23, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint))
    first, second = (g.bus_id.encode() for g in gpus(state)[:2])
    out = ctypes.c_uint(99)
    assert topo(first, second, ctypes.byref(out)) == 0 and out.value == 4 + 18  # NVSwitch
    assert topo(b"0100:ff:1f.0", second, ctypes.byref(out)) == 2  # no such GPU
    state.lose(1)
    assert topo(first, second, ctypes.byref(out)) == 15  # GPU_IS_LOST


def test_slot_72_flags_every_gpu_for_dmon_and_pmon(
    nvml: object, fake_library: ctypes.CDLL, state: NodeDir
) -> None:
    _, table = _table(fake_library)
    flag = _slot(table, 72, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint))
    device, out = _device(0), ctypes.c_uint(0)
    assert flag(device, ctypes.byref(out)) == 0 and out.value == 1
    state.lose(0)
    assert flag(device, ctypes.byref(out)) == 15


def test_other_slots_answer_not_supported_and_write_nothing(
    nvml: object, fake_library: ctypes.CDLL
) -> None:
    _, table = _table(fake_library)
    device = _device(0)
    buf = (ctypes.c_uint8 * 256)(*([0xAB] * 256))
    special = {12, 23, 26, 72, 75, 81, 192, 213, 214, 215, 230, 242, 243}
    for index in sorted(set(range(1, TABLE_SLOTS)) - special):
        call = _slot(table, index, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
        assert call(device, ctypes.addressof(buf), 1) == 3, index
    assert bytes(buf) == b"\xab" * 256
    log = _slot(table, 26, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p)
    assert log(b"nvidia-smi %s: %s\n", b"stdout", b"a line") == 0


# ------------------------------------------------- the driver root's nvidia-smi (DRA driver)

DRIVER_ROOT_SMI = versions.get("NVIDIA_SMI_DRIVER_ROOT_VERSION")  # 550.163.01-2


def test_a_driver_root_passes_the_dra_drivers_check_with_the_newer_nvidia_smi(
    tmp_path: Path, make_state: Callable[..., NodeDir]
) -> None:
    """What NVIDIA's DRA driver's init container runs before the driver starts (its
    kubelet-plugin-prestart.sh): `env -i LD_PRELOAD=<root>/.../libnvidia-ml.so.1
    <root>/usr/bin/nvidia-smi --version`, with no FAKENVML_STATE_DIR: the library finds
    the state in the root's var/lib/fakenvml, where the labs mount it."""
    binary = paths.cache_dir() / "nvidia-smi" / DRIVER_ROOT_SMI / "nvidia-smi"
    assert os.access(binary, os.X_OK), f"{binary}: run `make install` (ci/nvidia-smi.sh)"
    root = tmp_path / "driver"
    node = make_state({"driver_version": "580.159.04", "gpus": [{"profile": "H100-SXM5-80GB"}]})
    (root / "var/lib").mkdir(parents=True)
    (root / "var/lib/fakenvml").symlink_to(node.path)
    from fakenvml import driver

    driver.install(root, node.node(), [binary])
    smi = root / "usr/bin/nvidia-smi"
    assert smi.is_file() and not smi.is_symlink()  # the check finds regular files only
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    res = subprocess.run(dra_check(lib, smi), capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "DRIVER version      : 580.159.04" in res.stdout
    # 535, the version the tests above run, has no --version: the reason for the pin.
    old = subprocess.run(dra_check(lib, nvidia_smi_535()), capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert old.returncode != 0 and "--version is not recognized" in old.stdout


def dra_check(lib: Path, smi: Path) -> list[str]:
    """The prestart script's command. Under the sanitizer run the ASan runtime must come
    first among the preloads (and its options along), so those pass through `env -i`."""
    preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), str(lib)]))
    keep = [f"{k}={os.environ[k]}" for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS") if k in os.environ]
    return ["env", "-i", f"LD_PRELOAD={preload}", *keep, str(smi), "--version"]


def nvidia_smi_535() -> Path:
    return smi_binary(PACKAGES["535"])


def test_compute_policy_timeslice_is_accepted(smi: Smi) -> None:
    """Export-table slot 192: NVIDIA's DRA driver runs this for a claim's TimeSlicing
    config, and prepares nothing when it fails (docs/dra-driver.md)."""
    res = smi("compute-policy", "-i", "0", "--set-timeslice", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Successfully set timeslice policy with value Short for GPU 0" in res.stdout


def test_compute_mode_set_by_nvidia_smi_is_read_by_every_process(smi: Smi, node: NodeDir) -> None:
    """`nvidia-smi -c` (NVIDIA's MPS control daemon sets EXCLUSIVE_PROCESS so, DEFAULT
    when it stops) goes through nvmlDeviceSetComputeMode: a journal record the next
    nvidia-smi, another process, reads, on that GPU only."""
    uuid, n = gpus(node)[1].uuid, len(gpus(node))
    res = smi("-i", uuid, "-c", "EXCLUSIVE_PROCESS")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Set compute mode to EXCLUSIVE_PROCESS for GPU {gpus(node)[1].bus_id}" in res.stdout
    modes = smi("--query-gpu=compute_mode", "--format=csv,noheader").stdout.split()
    assert modes == ["Default", "Exclusive_Process", *["Default"] * (n - 2)]
    assert smi("-i", "1", "-c", "DEFAULT").returncode == 0
    modes = smi("--query-gpu=compute_mode", "--format=csv,noheader").stdout.split()
    assert modes == ["Default"] * n
