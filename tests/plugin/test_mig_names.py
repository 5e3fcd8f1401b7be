"""MIG profile names and strategies in our plugin, held to what a real H100 reported.

The capture (tests/fakenvml/data/h100) holds the driver's own profile names ("MIG 1g.10gb")
beside each profile's slice count and memory: NVIDIA's naming rule, which our plugin
implements, must give the driver's name for every one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakenvml import inventory
from fakenvml.profiles import PROFILES
from plugin import mig
from plugin.config import Config
from plugin.devices import Gpu
from plugin.main import gpu_devices
from plugin.state import ANY, ResourceState

CAPTURE = Path(__file__).resolve().parents[1] / "fakenvml" / "data" / "h100" / "h100-walk.json"


def _capture() -> dict:
    return json.loads(CAPTURE.read_text())


def test_names_from_the_rule_equal_the_h100_drivers_names() -> None:
    walk = _capture()
    total = walk["nvmlDeviceGetMemoryInfo"]["value"]["total"]
    seen = []
    for profile in range(16):
        answer = walk[f"nvmlDeviceGetGpuInstanceProfileInfo({profile})"]
        if answer["rc"] != "SUCCESS":
            continue
        info = answer["value"]
        g = info["sliceCount"]
        suffix = mig._attribute_suffix(profile)
        name = mig.profile_name(g, g, mig.memory_gb(total, info["memorySizeMB"]), suffix)
        assert f"MIG {name}" == info["name"], profile
        seen.append(name)
    assert {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} == set(
        seen
    )


@pytest.mark.parametrize("key", [k for k, p in PROFILES.items() if p.mig_mib])
def test_every_mig_board_profile_is_named_as_the_rule_names_it(key: str) -> None:
    """The fake's MIG tables (names and sizes as the drivers report them) agree with the rule
    both plugins name resources by: mig-3g.71gb on an H200, not 3g.70gb."""
    gpu = inventory.from_dict({"gpus": [{"profile": key}]}, "n").gpus[0]
    for p in gpu.mig_profiles:
        suffix = mig._attribute_suffix(p.profile)
        got = mig.profile_name(p.slice_count, p.slice_count,
                               mig.memory_gb(gpu.memory_total, p.memory_mib), suffix)  # fmt: skip
        assert f"MIG {got}" == p.name


def test_a_compute_instance_smaller_than_its_gpu_instance_names_both() -> None:
    assert mig.profile_name(3, 1, 40) == "1c.3g.40gb"
    assert mig.profile_name(3, 3, 40) == "3g.40gb"


def _gpu(i: int) -> Gpu:
    return Gpu(
        i, f"GPU-{i:08x}-0000-0000-0000-000000000000", i, f"0000:{i + 1:02x}:00.0", 0, "H100"
    )


def _slice(parent: Gpu, index: int, gi: int, profile: str = "1g.10gb") -> mig.MigDevice:
    return mig.MigDevice(parent, index, f"MIG-{parent.index}{gi:07x}-0000-0000-0000-000000000000",
                         gi, 0, profile)  # fmt: skip


def test_mig_device_ids_follow_the_id_strategy() -> None:
    g = _gpu(3)
    s = _slice(g, 1, 9)
    assert [d.id for d in gpu_devices([s], Config())] == [s.uuid]
    assert [d.id for d in gpu_devices([s], Config(device_id_strategy="index"))] == ["3:1"]
    assert [d.id for d in gpu_devices([s], Config(replicas=2))] == [f"{s.uuid}::0", f"{s.uuid}::1"]


def test_a_slice_fault_marks_only_that_slice_and_a_whole_gpu_fault_marks_all() -> None:
    g0, g1 = _gpu(0), _gpu(1)
    slices = [_slice(g0, 0, 7), _slice(g0, 1, 8), _slice(g1, 0, 7)]
    state = ResourceState("nvidia.com/mig-1g.10gb", gpu_devices(slices, Config()))
    assert state.set_gpu_health(0, False, "Xid 79", gi=8, ci=0) == [slices[1].uuid]
    assert state.set_gpu_health(0, False, "Xid 79", gi=ANY, ci=ANY) == [slices[0].uuid]
    assert state.healthy(slices[2].uuid)


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_strategies_need_nvml_only_for_mig_enabled_gpus(strategy: str) -> None:
    # No GPUs at all: nothing to ask NVML; the default resource is served empty under
    # single (as NVIDIA's does) and absent under mixed.
    plan = mig.plan(strategy, [], "nvidia.com/gpu")
    assert plan == ({"nvidia.com/gpu": []} if strategy == "single" else {})
