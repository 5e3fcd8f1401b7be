"""NVIDIA's gpu-feature-discovery (the release the suites pin, newest first) over fakenvml,
held to the labels GFD wrote on the real H100 the fidelity capture comes from."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fakenvml import driver, inventory
from fakenvml.node import NodeDir
from standin import nvidia

CAPTURE = Path(__file__).resolve().parents[1] / "fakenvml" / "data" / "h100"
H100_VM = Path(__file__).resolve().parents[2] / "fakenvml" / "inventories" / "h100-vm.yaml"


def labels(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line.strip())


def run_gfd(tmp_path: Path, node: NodeDir, env: dict[str, str] | None = None) -> dict[str, str]:
    root, out = tmp_path / "driver-root", tmp_path / "gfd-labels"
    driver.install(root, node.node())
    try:
        argv, full = nvidia.gfd_command(nvidia.versions()[0], node.path, root, out, env)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return labels(out.read_text())


def test_labels_equal_those_gfd_wrote_on_the_real_h100(tmp_path: Path) -> None:
    node = NodeDir(tmp_path / "state")
    node.init(inventory.load(H100_VM))
    want = labels((CAPTURE / "h100-gfd.txt").read_text())
    got = run_gfd(tmp_path, node)
    assert got == want


def test_a_node_of_eight_a100s_is_labelled_as_such(tmp_path: Path) -> None:
    node = NodeDir(tmp_path / "state")
    node.init(inventory.from_dict({"gpus": [{"profile": "A100-SXM4-80GB", "count": 8}]}, "n"))
    got = run_gfd(tmp_path, node)
    assert got["nvidia.com/gpu.count"] == "8"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert got["nvidia.com/gpu.family"] == "ampere"
    assert got["nvidia.com/gpu.mode"] == "compute"  # from the fake PCI class in sysfs
    assert got["nvidia.com/mig.capable"] == "true"


def test_a_workstation_board_with_display_outputs_is_in_graphics_mode(tmp_path: Path) -> None:
    node = NodeDir(tmp_path / "state")
    node.init(inventory.from_dict({"gpus": [{"profile": "RTX-A6000", "count": 2}]}, "n"))
    got = run_gfd(tmp_path, node)
    assert got["nvidia.com/gpu.mode"] == "graphics"
    assert got["nvidia.com/mig.capable"] == "false"


@pytest.mark.parametrize("strategy", ["mixed", "single"])
def test_mig_labels_name_each_profile_with_its_count_and_size(tmp_path: Path,
                                                              strategy: str) -> None:  # fmt: skip
    """GFD's MIG labels as it writes them on real boards: the strategy, and per MIG profile
    (mixed: nvidia.com/mig-<profile>.*; single: nvidia.com/gpu.* describe the MIG device)
    the count, memory, multiprocessors and slices of the fake's layout."""
    from fakenvml import mig

    node = NodeDir(tmp_path / "state")
    node.init(inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]}, "n"))
    mig.configure(node, "all", "all-1g.10gb" if strategy == "single" else "3g.40gb,2g.20gb")
    got = run_gfd(tmp_path, node, {"MIG_STRATEGY": strategy})
    assert got["nvidia.com/mig.strategy"] == strategy
    devices = mig.devices(node)
    profiles = {d.profile for d in devices}
    if strategy == "single":
        assert profiles == {"1g.10gb"}
        assert got["nvidia.com/gpu.count"] == str(len(devices)) == "14"
        assert got["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
        assert got["nvidia.com/gpu.memory"] == str(devices[0].memory_mib)
        assert got["nvidia.com/gpu.multiprocessors"] == str(devices[0].multiprocessors)
        return
    for profile in profiles:
        mine = [d for d in devices if d.profile == profile]
        prefix = f"nvidia.com/mig-{profile}"
        assert got[f"{prefix}.count"] == str(len(mine)) == "2"
        assert got[f"{prefix}.memory"] == str(mine[0].memory_mib)
        assert got[f"{prefix}.multiprocessors"] == str(mine[0].multiprocessors)
        assert got[f"{prefix}.slices.gi"] == profile[0]
        assert got[f"{prefix}.slices.ci"] == profile[0]


def test_an_nvswitch_hopper_node_is_labelled_with_its_fabric_clique(tmp_path: Path) -> None:
    """GFD labels the clique NVML's fabric info gives (nvmlDeviceGetGpuFabricInfoV): the
    node's cluster UUID and its baseboard's clique; the H100 in a VM above gets none."""
    node = NodeDir(tmp_path / "state")
    node.init(inventory.from_dict({"gpus": [{"profile": "H100-SXM5-80GB", "count": 8}],
                                   "topology": {"nvlink": {"nvswitch": True}}}, "n"))  # fmt: skip
    cluster, clique = run_gfd(tmp_path, node)["nvidia.com/gpu.clique"].rsplit(".", 1)
    assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", cluster), cluster
    assert cluster != "00000000-0000-0000-0000-000000000000" and clique == "1"
