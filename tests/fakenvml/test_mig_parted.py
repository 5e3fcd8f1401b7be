"""NVIDIA's nvidia-mig-parted (the GPU Operator's MIG manager's tool, built by `make infra`
from its module) partitioning fakenvml's H100s through NVML, in a node view of a driver
root (fakenvml/nodeview.py): the driver's modules in /proc/modules and the GPUs in PCI
sysfs, which it reads before it asks NVML anything. The layouts are its module's own
default configs (deployments/systemd/config-default.yaml), read back from the node's fake
state, not from what the tool says."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from clusters import built
from fakenvml import driver, inventory, mig, nodeview
from fakenvml.node import STATE_DIR_ENV, NodeDir

H100x2 = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 2}]}


@pytest.fixture(scope="module")
def tool() -> Path:
    d = built.Products.load().mig_parted
    if not d or not os.access(Path(d) / "nvidia-mig-parted", os.X_OK):
        pytest.fail(f"nvidia-mig-parted not built: {built.MAKE_INFRA}", pytrace=False)
    return Path(d)


@pytest.fixture
def node(tmp_path: Path) -> NodeDir:
    d = NodeDir(tmp_path / "state")
    d.init(inventory.from_dict(H100x2, "node-a"))
    driver.install(tmp_path / "root", d.node())
    return d


def run(node: NodeDir, *argv: str, view: bool = True) -> subprocess.CompletedProcess[str]:
    root = node.path.parent / "root"
    env = {**os.environ, STATE_DIR_ENV: str(node.path),
           "LD_LIBRARY_PATH": str(root / driver.LIB_DIR)}  # fmt: skip
    cmd = nodeview.command(root, argv) if view else list(argv)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_a_node_view_shows_the_driver_loaded_and_the_gpus_in_pci_sysfs(node: NodeDir) -> None:
    host = Path("/proc/modules").read_text() if Path("/proc/modules").exists() else None
    got = run(node, "sh", "-c", "cat /proc/modules; echo --; ls /sys/bus/pci/devices; "
              "echo --; cat /sys/module/nvidia/version /sys/module/nvidia/refcnt")  # fmt: skip
    assert got.returncode == 0, got.stderr
    modules, pci, module = got.stdout.split("--\n")
    assert {line.split()[0] for line in modules.splitlines()} >= {"nvidia", "nvidia_uvm"}
    assert pci.split() == [driver.pci_address(g) for g in node.node().gpus]
    assert module.split() == [node.node().driver_version, "2"]
    after = Path("/proc/modules").read_text() if Path("/proc/modules").exists() else None
    assert after == host  # the host's own view is untouched


def test_it_applies_the_operators_default_configs_through_nvml(tool: Path, node: NodeDir) -> None:
    configs = str(tool / "config-default.yaml")
    want = {
        "all-1g.10gb": Counter({"1g.10gb": 7}),
        "all-balanced": Counter({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    }
    for name, instances in want.items():
        got = run(node, str(tool / "nvidia-mig-parted"), "apply", "-f", configs, "-c", name)
        assert got.returncode == 0, got.stderr
        assert mig.instances(node) == [(True, instances)] * 2, name
        asserted = run(node, str(tool / "nvidia-mig-parted"), "assert", "-f", configs, "-c", name)
        assert asserted.returncode == 0, asserted.stderr
    exported = yaml.safe_load(run(node, str(tool / "nvidia-mig-parted"), "export").stdout)
    devices = exported["mig-configs"]["current"][0]["mig-devices"]
    assert Counter(devices) == want["all-balanced"]
    got = run(node, str(tool / "nvidia-mig-parted"), "apply", "-f", configs, "-c", "all-disabled")
    assert got.returncode == 0, got.stderr
    assert mig.instances(node) == [(False, Counter())] * 2


def test_a_profile_the_gpu_lacks_makes_no_instance_and_fails_its_assert(
    tool: Path, node: NodeDir, tmp_path: Path
) -> None:
    """An A100 40GB's 1g.5gb on an H100. mig-parted v0.13.1 parses a config's profiles
    against the node's GPUs (go-nvlib, through NVML); one no GPU has fails to parse, the
    config then flattens to nothing, and `apply` turns MIG mode on, makes no instance and
    exits 0 ("applied successfully"). Its `assert` is what says no."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {"a100-only": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]}}))  # fmt: skip
    parted = str(tool / "nvidia-mig-parted")
    got = run(node, parted, "apply", "-f", str(bad), "-c", "a100-only")
    assert got.returncode == 0, got.stderr
    assert mig.instances(node) == [(True, Counter())] * 2
    asserted = run(node, parted, "assert", "-f", str(bad), "-c", "a100-only")
    assert asserted.returncode != 0
    assert "selected configuration not currently applied" in asserted.stderr


def test_without_the_view_it_finds_no_driver_and_changes_nothing(tool: Path, node: NodeDir) -> None:
    configs = str(tool / "config-default.yaml")
    got = run(node, str(tool / "nvidia-mig-parted"), "apply", "-f", configs, "-c", "all-1g.10gb",
              view=False)  # fmt: skip
    assert got.returncode != 0
    assert "/proc/modules" in got.stderr or "not loaded" in got.stderr, got.stderr
    assert mig.instances(node) == [(False, Counter())] * 2


def test_a_root_without_the_drivers_files_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fakenvml import cli

    assert cli.main(["node-view", str(tmp_path), "--", "true"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install-driver" in err and "proc/modules" in err
