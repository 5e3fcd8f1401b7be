"""Plugin config and Xid policy: NVIDIA's env semantics, clear one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugin import config as cfg

REPO = Path(__file__).resolve().parents[2]


def policy(disable: str = "", enable: str = "") -> cfg.XidPolicy:
    env = {}
    if disable:
        env["DP_DISABLE_HEALTHCHECKS"] = disable
    if enable:
        env["DP_ENABLE_HEALTHCHECKS"] = enable
    return cfg.XidPolicy(cfg.Health(), env)


def test_application_xids_are_ignored_by_default() -> None:
    p = policy()
    assert not any(p.critical(x) for x in (13, 31, 43, 45, 68, 109))
    assert p.critical(79) and p.critical(48)


def test_disable_list_adds_to_the_ignored_xids() -> None:
    p = policy(disable="79, 48")
    assert not p.critical(79) and not p.critical(48) and not p.critical(13)
    assert p.critical(94)


@pytest.mark.parametrize("value", ["all", "xids", "XIDS,foo"])
def test_disable_all_turns_health_checks_off(value: str) -> None:
    p = policy(disable=value)
    assert not p.monitoring
    assert not p.critical(79)


def test_enable_overrides_disable_even_when_all_are_disabled() -> None:
    p = policy(disable="all", enable="79")
    assert p.monitoring and p.critical(79) and not p.critical(48)
    assert policy(enable="13").critical(13)  # re-enables a default-ignored Xid


def test_env_overrides_config_file_values() -> None:
    health = cfg.Health(disable="79")
    assert not cfg.XidPolicy(health, {}).critical(79)
    assert cfg.XidPolicy(health, {"DP_DISABLE_HEALTHCHECKS": ""}).critical(79)


def test_bad_xid_in_env_is_a_config_error() -> None:
    with pytest.raises(cfg.ConfigError, match="'abc' is not an Xid number"):
        policy(disable="13,abc")


def test_defaults() -> None:
    c = cfg.load(None)
    assert (c.resource, c.device_id_strategy, c.replicas, c.health.policy) == (
        "nvidia.com/gpu", "uuid", 1, "recover",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resource: [", "malformed YAML"),
        ("- a\n- b\n", "expected a mapping, found list"),
        ("replicas: 0\n", "replicas: Input should be greater than or equal to 1"),
        ("device_id_strategy: serial\n", "device_id_strategy: Input should be 'uuid' or 'index'"),
        ("resource: gpu\n", "not an extended resource name"),
        ("extra_resources: {example.com/rdma: 0}\n", "count must be 1-100000"),
        ("health: {policy: sometimes}\n", "health.policy"),
        ("colour: blue\n", "colour: Extra inputs are not permitted"),
    ],
)
def test_malformed_config_exits_2_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "plugin.main", "--config", str(path), "--device-plugin-path",
         str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpulab-plugin: error: ")
    assert message in lines[0]


def test_missing_device_plugin_dir_exits_2(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "plugin.main", "--device-plugin-path", str(tmp_path / "no")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "is not a directory" in res.stderr


def test_config_directory_picks_the_node_file_then_default(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("replicas: 2\n")
    (tmp_path / "seed-worker.yaml").write_text("extra_resources: {example.com/rdma: 10}\n")
    assert cfg.config_file(tmp_path, {"NODE_NAME": "seed-worker"}) == tmp_path / "seed-worker.yaml"
    assert cfg.config_file(tmp_path, {"NODE_NAME": "other"}) == tmp_path / "default.yaml"
    assert cfg.config_file(tmp_path / "default.yaml", {}) == tmp_path / "default.yaml"
    (tmp_path / "default.yaml").unlink()
    assert cfg.config_file(tmp_path, {"NODE_NAME": "other"}) is None


def test_the_plugin_imports_nothing_of_the_lab() -> None:
    """The plugin runs on real GPUs: its config has its own loader (see plugin/config.py),
    and nothing it imports reaches fakenvml, clusters or e2e."""
    code = (
        "import sys, plugin.main\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fakenvml', 'clusters', 'e2e'}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
