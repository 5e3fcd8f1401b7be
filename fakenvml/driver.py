"""Install the fake driver into a node's driver root, the way a driver container does.

    <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<driver version>   the library
    <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> .so.<version>, libnvidia-ml.so -> .so.1
    <root>/usr/lib/x86_64-linux-gnu/libcuda.so.<version> (and .so.1, .so): the CUDA stub
    <root>/dev/nvidia<minor> (c 195:<minor>) per GPU, nvidiactl (c 195:255),
    nvidia-modeset (c 195:254), nvidia-uvm and nvidia-uvm-tools
    <root>/proc/driver/nvidia-caps/mig-minors: the MIG capability minors, as the driver
    lists them (every GPU minor 0-31, GPU instance 0-14, compute instance 0-7)
    <root>/dev/nvidia-caps/nvidia-cap<minor>: config (1), monitor (2), and each GPU
    instance's and compute instance's access node of every MIG-capable GPU
    <root>/proc/driver/nvidia/capabilities/: the driver's per-capability procfs files
    (mig/config, mig/monitor, gpu<minor>/mig/gi<N>/access, gpu<minor>/mig/gi<N>/ci<M>/access),
    each `DeviceFileMinor`, `DeviceFileMode`, `DeviceFileModify` as the kernel module
    prints them, for every instance that could exist on each MIG-capable GPU
    <root>/proc/devices: the kernel's /proc/devices with the majors the driver registers
    (nvidia, nvidia-uvm, nvidia-caps, and from R550 nvidia-caps-imex-channels) added to its
    character devices
    <root>/proc/modules: the kernel's /proc/modules (where it has one) with the driver's
    modules loaded (nvidia, nvidia_modeset, nvidia_uvm, nvidia_drm); <root>/sys/module/
    <module>/: refcnt, initstate, and nvidia's version: what readers of "is the driver
    loaded" check (NVIDIA's mig-parted reads /proc/modules; the GPU Operator's validator
    and newer operators the same or /sys/module/nvidia)
    <root>/sys/bus/pci/devices/<address>/: vendor, device, class, subsystem ids, numa_node,
    resource per GPU: what go-nvlib's nvpci reads (GFD's nvidia.com/gpu.mode label)
    <root>/sys/devices/pci<domain>:<bus>/<root port>/<address>/: the same files where the
    kernel keeps them, under the GPU's PCIe root complex (see `pcie_paths`)
    <root>/usr/bin/<program>: NVIDIA's real driver programs, those given (`--bin PATH`,
    regular files): nvidia-smi, which a driver root has and NVIDIA's DRA driver refuses a
    root without (its init container runs `nvidia-smi --version` there, with the root's
    libnvidia-ml preloaded); nvidia-cuda-mps-control and nvidia-cuda-mps-server, which the
    toolkit's CDI spec then mounts into GPU containers (NVIDIA's MPS control daemon runs
    the control program; it needs no GPU until a CUDA client connects)
    <root>/sbin/modprobe: a static modprobe given (`--modprobe PATH`), and the running
    kernel's lib/modules/<release>/modules.dep listing the driver's modules: see `install`

NVIDIA's plugin looks for libnvidia-ml.so.1 under its container driver root (/driver-root)
before the normal search path; our plugin is pointed there with LD_LIBRARY_PATH.

Why the versioned files and the device nodes: whatever writes CDI specs (NVIDIA's plugin
with a cdi-* device list strategy, nvidia-ctk) reads the driver version from the
libraries' file suffix (libcuda's, for toolkit 1.17, which NVIDIA's plugin v0.17 uses) and
finds each GPU as a character device under the dev root; without them it writes no spec.
Labs bind-mount <root>/sys/bus/pci/devices over /sys/bus/pci/devices in the containers
that read PCI sysfs (gpu-feature-discovery); the host's sysfs is never written. That view
holds directories, not the kernel's links into /sys/devices, because a bind mount cannot
take a container's /sys/devices along; a reader of the link itself (NVIDIA's DRA driver: a
GPU's pcieRoot attribute) gets the kernel's layout from the sys/devices tree (gpulab's DRA
image overlays it on the kernel's sysfs).
NVIDIA's plugin reads mig-minors at /proc/driver/nvidia-caps (for every MIG device it
serves, or it refuses the device), nvidia-container-toolkit under the driver root; a pod
sees the root's proc/driver at /proc/driver when the lab bind-mounts it there. NVIDIA's DRA
driver reads a MIG device's two capability files at /proc/driver/nvidia/capabilities when
it prepares a claim, and the nvidia-caps major from /proc/devices, or from the file its
ALT_PROC_DEVICES_PATH names (the root's proc/devices here).
The nodes are only stat'ed (for type, major and minor) and re-created in containers; no
driver answers them, so opening one fails as on a machine whose driver is not loaded.
Making them needs CAP_MKNOD and a device cgroup that allows it (a privileged driver
container, or root on a host); where that is refused, `install` installs the libraries
alone and says so.

`node_dev` (`install-driver --dev DIR`): the same nodes in the node's own /dev too, as a
driver install leaves them. Stock deployments need them there: a device plugin whose
Allocate hands device specs names host paths (/dev/nvidia<minor>) that the runtime stats,
and NVIDIA's plugin and container toolkit look for /dev/nvidiactl. A kind node's /dev is
the node container's own tmpfs, never the host's. Where a real NVIDIA driver is loaded
(the kernel's /proc/driver/nvidia/version, which every container sees) the node's /dev is
left alone: those nodes are the real driver's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fakenvml import library
from fakenvml.errors import FakeNvmlError
from fakenvml.model import Gpu, Node
from fakenvml.paths import write_if_changed

LIB_DIR = Path("usr/lib/x86_64-linux-gnu")
BIN_DIR = Path("usr/bin")
MODPROBE = Path("sbin/modprobe")
DEV_DIR = Path("dev")
GPU_MAJOR = 195  # NVIDIA's registered character major: nvidia<minor>, nvidiactl is 255
CTL_MINOR = 255
MODESET_MINOR = 254  # /dev/nvidia-modeset, made where nvidia_modeset is loaded
# nvidia-uvm's and nvidia-caps' majors are dynamic on hardware (from /proc/devices); any
# unused ones will do.
UVM_MAJOR = 509
CAPS_MAJOR = 508
# The driver registers nvidia-caps-imex-channels too (NVIDIA's IMEX guide: "cat /proc/devices
# | grep nvidia-caps-imex-channels"; a dynamic major), since IMEX channels came with R550;
# NVIDIA's DRA driver's compute-domain plugin reads it at startup. No channel node is made:
# the administrator makes them (mknod), and a fake has no IMEX domain to give them meaning.
IMEX_MAJOR = 507
IMEX_CHANNELS = (550, 0)
CAPS_DIR = "nvidia-caps"
REAL_DRIVER = Path("/proc/driver/nvidia/version")
MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")
CAPABILITIES = Path("proc/driver/nvidia/capabilities")
PROC_DEVICES = Path("proc/devices")
PROC_MODULES = Path("proc/modules")
SYS_MODULE = Path("sys/module")
# The driver's kernel modules as /proc/modules lists them on a host running it: name, users
# and what uses it. Sizes are 0 and addresses 0x0 (what an unprivileged reader sees): no
# reader gpulab knows of looks at either. "(OE)": out of tree, unsigned, as NVIDIA's open
# modules taint a kernel.
DRIVER_MODULES = (
    ("nvidia_uvm", 0, ""),
    ("nvidia_drm", 0, ""),
    ("nvidia_modeset", 1, "nvidia_drm"),
    ("nvidia", 2, "nvidia_uvm,nvidia_modeset"),
)
# Capability files' DeviceFileMode: mig/config is root's alone (0400), the rest readable by
# all (0444), as a MIG host's procfs shows them; the driver may change the nodes (Modify 1).
CONFIG_MODE, ACCESS_MODE = 0o400, 0o444
# The GPU's character device is "nvidia-frontend" in /proc/devices before driver 550.40
# and "nvidia" since (nvidia-container-toolkit's proc/devices reader knows both names).
GPU_DEVICE_RENAMED = (550, 40)
# The driver's fixed table: minors for every capability that could exist, whether or not
# it does (NVIDIA's MIG user guide: "config 1" ... "gpu31/gi14/ci7/access 4322").
CAPS_GPUS, CAPS_GIS, CAPS_CIS = 32, 15, 8
PCI_DEVICES = Path("sys/bus/pci/devices")
PCI_TREE = Path("sys/devices")  # the kernel's device tree: root complexes, ports, devices
PCI_VENDOR = 0x10DE
# PCI classes: data-center boards are 3D controllers (GFD: gpu.mode=compute); boards with
# display outputs (Quadro/RTX workstation and GeForce brands) are VGA controllers.
PCI_CLASS_3D, PCI_CLASS_VGA = 0x030200, 0x030000
_DISPLAY_BRANDS = {1, 5, 6, 12, 13, 15, 16}  # NVML_BRAND_QUADRO, GEFORCE, TITAN, *_RTX
# Boards of the shipped profiles with display outputs (lspci: "VGA compatible controller").
_DISPLAY_PRODUCTS = {"NVIDIA RTX A6000"}


@dataclass
class Installed:
    library: Path
    device_nodes: list[Path] = field(default_factory=list)
    no_device_nodes: str = ""  # why none were made, when they were wanted
    node_dev_nodes: list[Path] = field(default_factory=list)  # made in the node's /dev
    no_node_dev_nodes: str = ""  # why none were made there, when asked


def _atomic_symlink(target: str, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _copy_library(dest_dir: Path, name: str, src: Path | None = None) -> Path:
    """The library (or src) as dest_dir/name, replaced atomically (a running plugin keeps
    its copy)."""
    dest = dest_dir / name
    fd, tmp = tempfile.mkstemp(prefix=".lib.", dir=dest_dir)
    os.close(fd)
    shutil.copyfile(src or library.path(), tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest


def _device_nodes(node: Node) -> Iterator[tuple[str, int, int]]:
    for g in node.gpus:
        minor = g.minor if g.minor >= 0 else g.index
        yield f"nvidia{minor}", GPU_MAJOR, minor
    yield "nvidiactl", GPU_MAJOR, CTL_MINOR
    yield "nvidia-modeset", GPU_MAJOR, MODESET_MINOR
    yield "nvidia-uvm", UVM_MAJOR, 0
    yield "nvidia-uvm-tools", UVM_MAJOR, 1


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """A GPU instance's access minor (ci None), or a compute instance's: mig-minors' rule."""
    base = 3 + (gpu_minor * CAPS_GIS + gi) * (1 + CAPS_CIS)
    return base if ci is None else base + 1 + ci


def _cap_nodes(node: Node) -> Iterator[tuple[str, int, int]]:
    """What nvidia-modprobe makes on a MIG host, for every instance that could exist: real
    drivers make them on demand, and a layout changed at run time must find its nodes."""
    minors = [g.minor if g.minor >= 0 else g.index for g in node.gpus if g.mig_profiles]
    if not minors:
        return
    for minor in (1, 2):  # config, monitor
        yield f"{CAPS_DIR}/nvidia-cap{minor}", CAPS_MAJOR, minor
    for m in (m for m in minors if m < CAPS_GPUS):
        for gi in range(CAPS_GIS):
            for ci in (None, *range(CAPS_CIS)):
                yield (
                    f"{CAPS_DIR}/nvidia-cap{cap_minor(m, gi, ci)}",
                    CAPS_MAJOR,
                    cap_minor(m, gi, ci),
                )


def make_device_nodes(dev: Path, node: Node) -> tuple[list[Path], str]:
    """(nodes made, why not): existing nodes with the right numbers are kept; the rest of
    /dev/nvidia* and /dev/nvidia-caps/* (GPUs the state no longer has) is removed."""
    wanted = {
        name: (major, minor) for name, major, minor in (*_device_nodes(node), *_cap_nodes(node))
    }
    made: list[Path] = []
    (dev / CAPS_DIR).mkdir(parents=True, exist_ok=True)
    for old in [*dev.glob("nvidia*"), *(dev / CAPS_DIR).glob("*")]:
        if str(old.relative_to(dev)) not in wanted and not old.is_dir():
            old.unlink(missing_ok=True)
    for name, (major, minor) in wanted.items():
        path = dev / name
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
                made.append(path)
                continue
            path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        except PermissionError as e:
            return made, f"mknod {path}: {e.strerror} (needs CAP_MKNOD: a privileged container)"
        os.chmod(path, 0o666)  # mknod's mode is masked by the umask
        made.append(path)
    return made, ""


def node_device_nodes(dev: Path, node: Node,
                      real_driver: Path = REAL_DRIVER) -> tuple[list[Path], str]:  # fmt: skip
    """The GPUs' device nodes in a node's own /dev (nodes made, why not)."""
    if real_driver.exists():
        return [], f"a real NVIDIA driver is loaded ({real_driver}): {dev} is left to it"
    if not dev.is_dir():
        return [], f"{dev} is not a directory (mount the node's /dev there)"
    return make_device_nodes(dev, node)


def mig_minors() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(CAPS_GPUS):
        for gi in range(CAPS_GIS):
            lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi)}")
            lines.extend(
                f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}" for ci in range(CAPS_CIS)
            )
    return "\n".join(lines) + "\n"


def write_mig_minors(root: Path) -> Path:
    """<root>/proc/driver/nvidia-caps/mig-minors, replaced only when it differs."""
    path, text = root / MIG_MINORS, mig_minors()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        fd, tmp = tempfile.mkstemp(prefix=".mig-minors.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
    return path


def capability_file(minor: int, mode: int = ACCESS_MODE) -> str:
    """A capability's procfs file, as the kernel module prints it (mode in decimal)."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def capability_files(node: Node) -> dict[str, str]:
    """Every capability file under proc/driver/nvidia/capabilities, by relative path: none
    without a MIG-capable GPU; else config, monitor and, as for the /dev/nvidia-caps
    nodes, the access file of every GPU and compute instance that could exist (a layout
    changed at run time finds its files)."""
    minors = [g.minor if g.minor >= 0 else g.index for g in node.gpus if g.mig_profiles]
    if not minors:
        return {}
    out = {"mig/config": capability_file(1, CONFIG_MODE), "mig/monitor": capability_file(2)}
    for m in (m for m in minors if m < CAPS_GPUS):
        for gi in range(CAPS_GIS):
            out[f"gpu{m}/mig/gi{gi}/access"] = capability_file(cap_minor(m, gi))
            for ci in range(CAPS_CIS):
                out[f"gpu{m}/mig/gi{gi}/ci{ci}/access"] = capability_file(cap_minor(m, gi, ci))
    return out


def write_capabilities(root: Path, node: Node) -> Path:
    """<root>/proc/driver/nvidia/capabilities as capability_files(node) says; files of GPUs
    the state no longer has are removed."""
    top = root / CAPABILITIES
    wanted = capability_files(node)
    dirs = {str(d) for k in wanted for d in Path(k).parents}
    if top.is_dir():
        for old in sorted(top.rglob("*"), reverse=True):  # files before their dirs
            rel = str(old.relative_to(top))
            if old.is_dir() and rel not in dirs:
                shutil.rmtree(old)
            elif old.is_file() and rel not in wanted:
                old.unlink()
    for rel, text in wanted.items():
        path = top / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_if_changed(path, text)
    return top


def proc_devices(node: Node, kernel: str) -> str:
    """`kernel` (a /proc/devices) with the majors the driver registers, in major order
    among the character devices."""
    version = tuple(int(p) for p in node.driver_version.split(".")[:2] if p.isdigit())
    gpu = "nvidia" if version >= GPU_DEVICE_RENAMED else "nvidia-frontend"
    ours = {GPU_MAJOR: gpu, UVM_MAJOR: "nvidia-uvm", CAPS_MAJOR: "nvidia-caps"}
    if version >= IMEX_CHANNELS:
        ours[IMEX_MAJOR] = "nvidia-caps-imex-channels"
    head, sep, block = kernel.partition("\nBlock devices:")
    chars: list[tuple[int, str]] = []
    for line in head.splitlines()[1:]:
        major, _, name = line.strip().partition(" ")
        if major.isdigit() and name and int(major) not in ours and not name.startswith("nvidia"):
            chars.append((int(major), name))
    chars = sorted(chars + list(ours.items()), key=lambda c: c[0])
    lines = ["Character devices:", *(f"{major:3d} {name}" for major, name in chars)]
    return "\n".join(lines) + "\n\nBlock devices:" + (block if sep else "\n")


def _with_driver(root: Path, rel: Path, kernel: Path, absent: str,
                 add: Callable[[str], str]) -> Path:  # fmt: skip
    """<root>/<rel>: this kernel's `kernel` file (`absent` where it has none) with what the
    driver adds to it."""
    try:
        text = kernel.read_text()
    except OSError:
        text = absent
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, add(text))
    return path


def write_proc_devices(root: Path, node: Node, kernel: Path = Path("/proc/devices")) -> Path:
    """<root>/proc/devices: this kernel's list with the driver's majors (what a process
    reads at /proc/devices on a host whose driver is loaded)."""
    return _with_driver(root, PROC_DEVICES, kernel, "Character devices:\n\nBlock devices:\n",
                        lambda text: proc_devices(node, text))  # fmt: skip


def proc_modules(kernel: str) -> str:
    """`kernel` (a /proc/modules, maybe empty) with the driver's modules loaded, first, as
    the most recently loaded modules are listed."""
    names = {m[0] for m in DRIVER_MODULES}
    ours = [f"{name} 0 {users} {deps + ',' if deps else '-'} Live 0x0000000000000000 (OE)"
            for name, users, deps in DRIVER_MODULES]  # fmt: skip
    rest = [line for line in kernel.splitlines() if line.split(" ", 1)[0] not in names]
    return "\n".join(ours + rest) + "\n"


def write_kernel_modules(root: Path, node: Node, kernel: Path = Path("/proc/modules")) -> Path:
    """<root>/proc/modules and <root>/sys/module/<module>/: the driver loaded, as a reader
    of either sees it on a host running it. A kernel built without module support has no
    /proc/modules (CONFIG_MODULES off); the driver's lines are then the whole file."""
    path = _with_driver(root, PROC_MODULES, kernel, "", proc_modules)
    for name, users, _ in DRIVER_MODULES:
        d = root / SYS_MODULE / name
        d.mkdir(parents=True, exist_ok=True)
        write_if_changed(d / "refcnt", f"{users}\n")
        write_if_changed(d / "initstate", "live\n")
    write_if_changed(root / SYS_MODULE / "nvidia" / "version", f"{node.driver_version}\n")
    return path


def modules_dep() -> str:
    """modules.dep of the driver's modules as its installer places them (the running
    kernel's kernel/drivers/video/), each after the modules it needs."""
    needs = {"nvidia_uvm": ["nvidia"], "nvidia_modeset": ["nvidia"],
             "nvidia_drm": ["nvidia_modeset", "nvidia"]}  # fmt: skip

    def ko(name: str) -> str:
        return f"kernel/drivers/video/{name.replace('_', '-')}.ko"

    return "".join(f"{ko(m)}:{''.join(' ' + ko(d) for d in needs.get(m, []))}\n"
                   for m, _, _ in reversed(DRIVER_MODULES))  # fmt: skip


def write_modules_dep(root: Path) -> Path:
    """<root>/lib/modules/<running kernel>/modules.dep, which modprobe reads (busybox's
    refuses to run without the directory). No module files: a module that is not loaded
    fails to load, as it would where the driver is not built for the kernel."""
    path = root / "lib" / "modules" / os.uname().release / "modules.dep"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(modules_dep())
    return path


def pci_address(gpu: Gpu) -> str:
    """The sysfs name: lower case, a 4-digit domain (NVML's busId has 8)."""
    return f"{gpu.pci_domain:04x}:{gpu.pci_bus:02x}:{gpu.pci_device:02x}.{gpu.pci_function:x}"


def _pci_files(gpu: Gpu) -> dict[str, str]:
    display = gpu.brand in _DISPLAY_BRANDS or gpu.name in _DISPLAY_PRODUCTS
    pci_class = PCI_CLASS_VGA if display else PCI_CLASS_3D
    # resource: one "start end flags" line per BAR; BAR0 16 MiB of registers, BAR1 the
    # frame-buffer aperture (nvmlDeviceGetBAR1MemoryInfo's total), at made-up addresses.
    base = 0x2000_0000_0000 + gpu.index * 0x40_0000_0000
    bar1 = max(gpu.bar1_total, 1 << 28)
    bars = [(0xFA00_0000 - gpu.index * 0x100_0000, 1 << 24, 0x40200), (base, bar1, 0x14220C)]
    lines = [f"0x{s:016x} 0x{s + n - 1:016x} 0x{f:016x}" for s, n, f in bars]
    lines += ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 11
    return {
        "vendor": f"0x{PCI_VENDOR:04x}",
        "device": f"0x{gpu.pci_device_id >> 16:04x}",
        "subsystem_vendor": f"0x{gpu.pci_subsystem_id & 0xFFFF:04x}",
        "subsystem_device": f"0x{gpu.pci_subsystem_id >> 16:04x}",
        "class": f"0x{pci_class:06x}",
        "numa_node": str(gpu.numa_node if gpu.numa_node >= 0 else -1),
        "resource": "\n".join(lines),
    }


def _pci_config(gpu: Gpu, pci_class: int) -> bytes:
    """The standard 256-byte header: ids, class, subsystem; status without a capability
    list, so a reader looking for NVIDIA's vGPU capability finds none (a bare-metal GPU)."""
    cfg = bytearray(256)
    struct.pack_into("<HH", cfg, 0, PCI_VENDOR, gpu.pci_device_id >> 16)
    cfg[0x09:0x0C] = pci_class.to_bytes(3, "little")  # prog-if, subclass, class
    struct.pack_into("<HH", cfg, 0x2C, gpu.pci_subsystem_id & 0xFFFF, gpu.pci_subsystem_id >> 16)
    return bytes(cfg)


def pcie_paths(gpus: list[Gpu]) -> dict[str, str]:
    """Each GPU's directory under /sys/devices, as the kernel lays the tree out from the
    fake's PCIe topology: a root complex per host bridge (`pci<domain>:<bus>`, the GPUs
    behind one bridge are NVML_TOPOLOGY_HOSTBRIDGE apart), in it a root port per upper
    switch (the topmost switch hangs off one root port), then the GPU. The root complex is
    named after the lowest bus behind it, and the switch levels are not drawn: nothing reads
    them from sysfs (NVML's topology answers carry them) and the fake's bus numbers (one
    GPU per bus from 01) leave no room for the bridges' own buses."""
    by_bridge: dict[int, list[Gpu]] = {}
    for gpu in gpus:
        by_bridge.setdefault(gpu.host_bridge, []).append(gpu)
    paths = {}
    for members in by_bridge.values():
        first = min(members, key=lambda g: (g.pci_domain, g.pci_bus))
        bus = f"{first.pci_domain:04x}:{first.pci_bus:02x}"
        uppers = sorted({g.pcie_upper_switch for g in members})
        for gpu in members:
            port = f"{bus}:{uppers.index(gpu.pcie_upper_switch) + 1:02x}.0"
            paths[pci_address(gpu)] = f"pci{bus}/{port}/{pci_address(gpu)}"
    return paths


def _write_pci_sysfs(root: Path, node: Node) -> None:
    """One directory per GPU in both views (PCI_DEVICES, PCI_TREE); what the state no
    longer has is removed."""
    devices, tree = root / PCI_DEVICES, root / PCI_TREE
    devices.mkdir(parents=True, exist_ok=True)
    wanted = {pci_address(g): g for g in node.gpus}
    for old in devices.iterdir():
        if old.name not in wanted and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
    paths = pcie_paths(node.gpus)
    leaves = {tree / p for p in paths.values()}
    on_the_way = {d for leaf in leaves for d in leaf.parents}
    for dirpath, dirnames, _ in os.walk(tree):
        for name in list(dirnames):
            d = Path(dirpath) / name
            if d in leaves or d not in on_the_way:
                dirnames.remove(name)  # a GPU's directory stays (rewritten below)
                if d not in leaves:  # ... anything else off the GPUs' paths goes
                    shutil.rmtree(d)
    for address, gpu in wanted.items():
        files = _pci_files(gpu)
        for d in (devices / address, tree / paths[address]):
            d.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (d / name).write_text(text + "\n")
            (d / "config").write_bytes(_pci_config(gpu, int(files["class"], 16)))


def install(root: Path, node: Node | None = None, programs: Sequence[Path] = (),
            node_dev: Path | None = None, modprobe: Path | None = None) -> Installed:  # fmt: skip
    """The library (and, given the node's state, its versioned name and device nodes) under
    `root`, and the driver `programs` in its usr/bin; given `node_dev`, the device nodes
    there too; given `modprobe` (a static one: nothing else in the root could run it), that
    as <root>/sbin/modprobe. NVIDIA's GPU Operator validator loads the driver's modules with
    `chroot <root> /sbin/modprobe nvidia` (nvidia-container-toolkit's nvmodules), which a
    driver container's root answers: chroot'd there, modprobe reads the root's
    proc/modules, and a loaded module is a success with nothing done."""
    dest_dir = root / LIB_DIR
    for flag, program in [*(("--bin", p) for p in programs), ("--modprobe", modprobe)]:
        if program is not None and not (program.is_file() and os.access(program, os.X_OK)):
            raise FakeNvmlError(f"{flag} {program}: no such executable")
    try:
        if modprobe is not None:
            (root / MODPROBE).parent.mkdir(parents=True, exist_ok=True)
            _copy_library(root / MODPROBE.parent, MODPROBE.name, modprobe)
            write_modules_dep(root)
        for program in programs:
            (root / BIN_DIR).mkdir(parents=True, exist_ok=True)
            _copy_library(root / BIN_DIR, program.name, program)  # a regular file
        dest_dir.mkdir(parents=True, exist_ok=True)
        if node is None:
            # No state yet: the library alone, as libnvidia-ml.so.1.
            lib = _copy_library(dest_dir, library.SONAME)
        else:
            version = node.driver_version
            lib = _copy_library(dest_dir, f"libnvidia-ml.so.{version}")
            _atomic_symlink(lib.name, dest_dir / library.SONAME)
            cuda = _copy_library(dest_dir, f"libcuda.so.{version}", library.cuda_path())
            _atomic_symlink(cuda.name, dest_dir / library.CUDA_SONAME)
            _atomic_symlink(library.CUDA_SONAME, dest_dir / "libcuda.so")
            for other in [*dest_dir.glob("libnvidia-ml.so.*.*"), *dest_dir.glob("libcuda.so.*.*")]:
                if other not in (lib, cuda):
                    other.unlink()  # another driver version's file: one version per root
        link = dest_dir / "libnvidia-ml.so"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(library.SONAME)
        out = Installed(lib)
        if node is not None:
            write_mig_minors(root)
            write_capabilities(root, node)
            write_proc_devices(root, node)
            write_kernel_modules(root, node)
            _write_pci_sysfs(root, node)
            out.device_nodes, out.no_device_nodes = make_device_nodes(root / DEV_DIR, node)
            if node_dev is not None:
                out.node_dev_nodes, out.no_node_dev_nodes = node_device_nodes(node_dev, node)
    except OSError as e:
        raise FakeNvmlError(f"cannot install the library under {root}: {e.strerror}") from None
    return out
