"""The NVIDIA Container Toolkit's lab side (clusters/labs/toolkit.py) without a cluster: the CDI
spec edit, the generate command, and the configs `nvidia-ctk runtime configure` writes in
the node image, and a MIG driver root's spec (needs `make infra`: the node image and the
toolkit's binaries)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clusters import built, versions
from clusters.labs import kindconfig, toolkit
from fakenvml import mig
from fakenvml.node import NodeDir


def test_the_spec_gets_the_state_mount_once_and_keeps_the_drivers() -> None:
    lib = {"hostPath": "/run/fakenvml/driver/usr/lib/libnvidia-ml.so.1",
           "containerPath": "/usr/lib/libnvidia-ml.so.1", "options": ["ro"]}  # fmt: skip
    spec = {"cdiVersion": "0.5.0", "containerEdits": {"mounts": [lib]}}
    once = toolkit.with_state_mount(spec)
    twice = toolkit.with_state_mount(once)
    state = [
        m for m in twice["containerEdits"]["mounts"] if m["containerPath"] == "/var/lib/fakenvml"
    ]
    assert len(state) == 1 and state[0]["hostPath"] == "/var/lib/fakenvml"
    assert "rw" in state[0]["options"] and lib in twice["containerEdits"]["mounts"]


def test_the_spec_gets_the_procfs_hook_once_beside_nvidias_hooks() -> None:
    nvidias = {"hookName": "createContainer", "path": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
               "args": ["nvidia-cdi-hook", "update-ldcache"]}  # fmt: skip
    spec = {"cdiVersion": "0.5.0", "containerEdits": {"hooks": [nvidias]}}
    twice = toolkit.with_driver_procfs(toolkit.with_driver_procfs(spec))
    hooks = twice["containerEdits"]["hooks"]
    assert hooks[0] == nvidias and len(hooks) == 2
    assert hooks[1]["hookName"] == "createContainer"
    assert hooks[1]["args"][-2:] == [toolkit.PROCFS_HOOK_NAME, kindconfig.DRIVER_ROOT]


def test_the_procfs_hook_shows_the_drivers_entries_in_the_containers_proc(
    tmp_path: Path,
) -> None:
    """The hook as runc runs it (the container's state on stdin, before pivot_root, in the
    container's mount namespace: here one of its own with a procfs at the bundle's rootfs):
    the root's proc/driver and proc/devices over the rootfs' own; the host's stay as
    they are."""
    state, root = tmp_path / "state", tmp_path / "root"
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus: [{profile: H100-SXM5-80GB, count: 1, mig: all-1g.10gb}]\n")
    fakenvml = [sys.executable, "-m", "fakenvml"]
    subprocess.run([*fakenvml, "init", "--state-dir", str(state), str(inv)], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([*fakenvml, "install-driver", "--state-dir", str(state), str(root)],
                   check=True, capture_output=True)  # fmt: skip
    bundle = tmp_path / "bundle"
    (bundle / "rootfs/proc").mkdir(parents=True)
    # As containerd writes it: compact JSON, the rootfs relative to the bundle.
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.1.0",
                                                    "root": {"path": "rootfs"}}))  # fmt: skip
    hook = toolkit.with_driver_procfs({}, str(root))["containerEdits"]["hooks"][0]
    rootfs = bundle / "rootfs"
    host = Path("/proc/devices").read_text(), sorted(p.name for p in Path("/proc/driver").iterdir())
    proc = rootfs / "proc"
    container = (f'mount -t proc proc {proc} && "$@" && '
                 f"cat {proc}/driver/nvidia-caps/mig-minors {proc}/devices")  # fmt: skip
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", container, "sh",
         hook["path"], *hook["args"][1:]],
        input=json.dumps({"ociVersion": "1.1.0", "id": "c", "status": "creating", "pid": 1,
                          "bundle": str(bundle)}),
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "gpu0/gi" in out.stdout  # the driver's MIG capability minors
    assert "nvidia-caps" in out.stdout and "nvidia-uvm" in out.stdout  # the driver's majors
    # The host's procfs as it was.
    assert host == (Path("/proc/devices").read_text(),
                    sorted(p.name for p in Path("/proc/driver").iterdir()))  # fmt: skip


def test_the_procfs_hook_fails_in_one_line_without_a_bundle(tmp_path: Path) -> None:
    hook = toolkit.with_driver_procfs({}, str(tmp_path))["containerEdits"]["hooks"][0]
    out = subprocess.run([hook["path"], *hook["args"][1:]], input="{}", capture_output=True,
                         text=True, timeout=10)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr == "gpulab procfs hook: no bundle in the container's state\n"


def test_the_spec_is_generated_for_fakenvmls_driver_root_with_the_mounted_hook() -> None:
    args = toolkit.generate_args()
    ctk = args.index(f"{kindconfig.TOOLKIT_DIR}/nvidia-ctk")
    assert args[ctk + 1 : ctk + 3] == ["cdi", "generate"]
    # In a mount namespace of its own, the driver root's proc/driver over /proc/driver.
    assert args[:2] == ["unshare", "--mount"] and args[ctk - 1] == kindconfig.DRIVER_ROOT
    assert args[args.index("--driver-root") + 1] == kindconfig.DRIVER_ROOT
    assert f"--nvidia-cdi-hook-path={kindconfig.TOOLKIT_DIR}/nvidia-cdi-hook" in args


def test_runtime_configure_in_the_node_image_makes_nvidia_the_default_in_cdi_mode(
    tmp_path: Path,
) -> None:
    p = built.require((), versions.kube_version())
    if not p.toolkit:
        pytest.fail(f"no NVIDIA Container Toolkit recorded in {built.manifest_path()}; make infra")
    toolkit.prepare(tmp_path, p.node_images[versions.kube_version()], p.toolkit)
    main = tomllib.loads((tmp_path / "config.toml").read_text())
    assert main["imports"] == ["/etc/containerd/conf.d/*.toml"]
    cri = tomllib.loads((tmp_path / "99-nvidia.toml").read_text())["plugins"][
        "io.containerd.grpc.v1.cri"
    ]
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    nvidia = cri["containerd"]["runtimes"]["nvidia"]["options"]
    assert nvidia["BinaryName"] == f"{kindconfig.TOOLKIT_DIR}/nvidia-container-runtime"
    # The node image's own settings survive in the drop-in (it restates the CRI section).
    assert cri["enable_cdi"] is True and "/pause:" in cri["sandbox_image"]
    runtime = tomllib.loads((tmp_path / "runtime.toml").read_text())
    assert runtime["nvidia-container-runtime"]["mode"] == "cdi"


def test_a_mig_driver_roots_spec_names_every_slice_by_index_and_uuid(tmp_path: Path) -> None:
    """The real nvidia-ctk over a fake driver root with MIG on (it reads the slices'
    capability minors from the root's proc/driver, mounted over /proc/driver for it)."""
    p = built.require((), versions.kube_version())
    state, root = tmp_path / "state", tmp_path / "root"
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus: [{profile: H100-SXM5-80GB, count: 2, mig: all-1g.10gb}]\n")
    fakenvml = [sys.executable, "-m", "fakenvml"]
    subprocess.run([*fakenvml, "init", "--state-dir", str(state), str(inv)], check=True)
    subprocess.run([*fakenvml, "install-driver", "--state-dir", str(state), str(root)],
                   check=True, capture_output=True)  # fmt: skip
    (root / "var/lib").mkdir(parents=True)
    (root / "var/lib/fakenvml").symlink_to(state)  # where the library looks, as on nodes
    spec = tmp_path / "spec.json"  # where labs have it written, to read it back
    args = toolkit.generate_args(str(root), str(root), f"{p.toolkit}/nvidia-ctk", str(spec))
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)
    names = {d["name"] for d in json.loads(spec.read_text())["devices"]}
    slices = mig.devices(NodeDir(state))
    assert len(slices) == 14
    # <GPU index>:<MIG device index>, as NVIDIA's index strategy names them, and MIG UUIDs.
    assert names == {f"{d.gpu}:{d.index}" for d in slices} | {d.uuid for d in slices} | {"all"}
