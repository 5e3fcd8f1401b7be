"""Run a program that asks the kernel about the driver with a fake driver root's answers,
in a private mount namespace:

    fakenvml node-view /run/fakenvml/driver -- nvidia-mig-parted apply -f c.yaml -c all-1g.10gb

It then sees, where the kernel keeps them, what `fakenvml install-driver` wrote into the
root (fakenvml/driver.py): `proc/modules` (the driver loaded), `proc/devices` (its
majors), `proc/driver` (MIG capabilities), `sys/bus/pci/devices` (the GPUs, as go-nvlib's
nvpci finds them) and `sys/module/<driver module>` beside the kernel's own modules.
NVIDIA's mig-parted needs the first and the PCI view: it reads /proc/modules before it
touches NVML, and it finds GPUs in PCI sysfs before it asks NVML for them by bus id (with
none there it changes nothing and still exits 0).

Nothing outside the new namespace changes: the host's /proc and /sys are not written. Needs
CAP_SYS_ADMIN (root, or a privileged container) and util-linux's `unshare` and `mount`.

Why /proc becomes a tmpfs: a kernel built without module support has no /proc/modules to
bind a file over, and runc refuses any mount inside /proc in a container's spec. So /proc
is a tmpfs whose entries link to a procfs mounted beneath it (`.real`), and the driver's
files link into the root. Its process directories are those that existed when the view was
made; `self` and `thread-self` always resolve.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fakenvml.driver import PCI_DEVICES, PROC_DEVICES, PROC_MODULES, SYS_MODULE
from fakenvml.errors import FakeNvmlError

# $1: the root; the rest: the program. Links rather than bind mounts inside the tmpfs:
# they cost nothing and a missing target is the root's to fix.
# A preloaded library (the sanitizers' runtimes, in gpulab's ASan tier) is kept for the
# program alone: the setup's own tools would start while /proc is still empty.
_SCRIPT = r"""
set -eu
root=$1; shift
preload=${LD_PRELOAD-}
unset LD_PRELOAD
mount -t tmpfs -o mode=0755 fakenvml-proc /proc
mkdir /proc/.real /proc/.sys-module
mount -t proc proc /proc/.real
for e in /proc/.real/* /proc/.real/.[!.]*; do
  n=${e##*/}
  [ -e "$e" ] || [ -L "$e" ] || continue
  ln -s ".real/$n" "/proc/$n"
done
for f in modules devices driver; do
  rm -f "/proc/$f"
  ln -s "$root/proc/$f" "/proc/$f"
done
mount --bind /sys/module /proc/.sys-module
mount -t tmpfs -o mode=0755 fakenvml-sys-module /sys/module
for e in /proc/.sys-module/*; do ln -s "$e" "/sys/module/${e##*/}"; done
for m in "$root/sys/module"/*; do
  rm -f "/sys/module/${m##*/}"
  ln -s "$m" "/sys/module/${m##*/}"
done
mount --bind "$root/sys/bus/pci/devices" /sys/bus/pci/devices
[ -z "$preload" ] || export LD_PRELOAD="$preload"
exec "$@"
"""


def command(root: Path, argv: Sequence[str]) -> list[str]:
    """The argv that runs `argv` in the view of `root` (a driver root `install-driver`
    wrote with a node's state)."""
    root = root.resolve()
    missing = [str(p) for p in (PROC_MODULES, PROC_DEVICES, SYS_MODULE, PCI_DEVICES)
               if not (root / p).exists()]  # fmt: skip
    if missing:
        raise FakeNvmlError(f"{root} has no {', '.join(missing)}: run `fakenvml "
                            f"install-driver {root}` on a node with a state first")  # fmt: skip
    if not argv:
        raise FakeNvmlError("node-view: no program given (fakenvml node-view ROOT -- PROGRAM)")
    if shutil.which("unshare") is None:
        raise FakeNvmlError("node-view needs util-linux's unshare, which is not on PATH")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SCRIPT,
            "node-view", str(root), *argv]  # fmt: skip


def run(root: Path, argv: Sequence[str]) -> int:
    """Run it and return its exit status; a view that cannot be made is an error."""
    cmd = command(root, argv)
    if os.geteuid() != 0:
        raise FakeNvmlError("node-view makes a mount namespace: run it as root")
    return subprocess.run(cmd, check=False).returncode
