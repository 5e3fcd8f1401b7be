"""The NVIDIA Container Toolkit's lab side (clusters/toolkit.py) without a cluster: the CDI
spec edit, the generate command, and the configs `nvidia-ctk runtime configure` writes in
the node image (needs `make infra`: the node image and the toolkit's binaries)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from clusters import infra, kindconfig, toolkit, versions


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


def test_the_spec_is_generated_for_fakenvmls_driver_root_with_the_mounted_hook() -> None:
    args = toolkit.generate_args()
    assert args[:3] == [f"{kindconfig.TOOLKIT_DIR}/nvidia-ctk", "cdi", "generate"]
    assert args[args.index("--driver-root") + 1] == kindconfig.DRIVER_ROOT
    assert f"--nvidia-cdi-hook-path={kindconfig.TOOLKIT_DIR}/nvidia-cdi-hook" in args


def test_runtime_configure_in_the_node_image_makes_nvidia_the_default_in_cdi_mode(
    tmp_path: Path,
) -> None:
    p = infra.require((), versions.kube_version())
    if not p.toolkit:
        pytest.fail(f"no NVIDIA Container Toolkit recorded in {infra.manifest_path()}; make infra")
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
