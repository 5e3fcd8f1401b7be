"""GPU profiles hold what real boards report; these pin the facts the lab relies on."""

from __future__ import annotations

import pytest

from fakenvml import profiles, statefile
from fakenvml.errors import FakeNvmlError
from fakenvml.model import Node
from fakenvml.profiles import PROFILES

REQUIRED = ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200", "B200", "L40S", "T4"]


def test_every_required_profile_exists() -> None:
    assert set(REQUIRED) <= set(PROFILES)


@pytest.mark.parametrize(
    ("key", "name", "memory_mib", "pci_device_id"),
    [
        ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE),
        ("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, 0x20B210DE),
        ("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 81559, 0x233010DE),
        ("H200", "NVIDIA H200", 143771, 0x233510DE),
        ("B200", "NVIDIA B200", 183359, 0x290110DE),
        ("L40S", "NVIDIA L40S", 46068, 0x26B910DE),
        ("T4", "Tesla T4", 15360, 0x1EB810DE),
        ("A10G", "NVIDIA A10G", 23028, 0x223710DE),
    ],
)
def test_identity_matches_what_nvidia_smi_reports(
    key: str, name: str, memory_mib: int, pci_device_id: int
) -> None:
    p = PROFILES[key]
    assert (p.name, p.memory_mib, p.pci_device_id) == (name, memory_mib, pci_device_id)


def test_pci_ids_carry_the_nvidia_vendor_id() -> None:
    for p in PROFILES.values():
        assert p.pci_device_id & 0xFFFF == 0x10DE, p.key
        assert p.pci_subsystem_id & 0xFFFF == 0x10DE, p.key


@pytest.mark.parametrize(
    ("cc", "arch"),
    [((7, 5), profiles.ARCH_TURING), ((8, 0), profiles.ARCH_AMPERE),
     ((8, 6), profiles.ARCH_AMPERE), ((8, 9), profiles.ARCH_ADA),
     ((9, 0), profiles.ARCH_HOPPER), ((10, 0), profiles.ARCH_BLACKWELL)],
)  # fmt: skip
def test_architecture_agrees_with_compute_capability(cc: tuple[int, int], arch: int) -> None:
    matching = [p for p in PROFILES.values() if p.cc == cc]
    assert matching and all(p.arch == arch for p in matching)


@pytest.mark.parametrize(
    ("key", "links", "generation"),
    [("A100-SXM4-80GB", 12, 3), ("H100-SXM5-80GB", 18, 4), ("H200", 18, 4), ("B200", 18, 5),
     ("L40S", 0, 0), ("T4", 0, 0), ("A10G", 0, 0)],
)  # fmt: skip
def test_nvlink_count_and_generation(key: str, links: int, generation: int) -> None:
    assert (PROFILES[key].nvlinks, PROFILES[key].nvlink_gen) == (links, generation)


def test_nvlink_version_is_reported_as_the_nvml_enum() -> None:
    # nvmlDeviceGetNvLinkVersion answers nvmlNvlinkVersion_t: 3.0 -> 4, 4.0 -> 6, 5.0 -> 7.
    versions = {k: PROFILES[k].make_gpu(0, "u", "s", (0, 1, 0, 0)).nvlink_version for k in PROFILES}
    assert versions["A100-SXM4-80GB"] == 4
    assert versions["H100-SXM5-80GB"] == 6
    assert versions["B200"] == 7
    assert versions["T4"] == 0


def test_sxm_and_passively_cooled_boards_have_no_fans() -> None:
    for key in ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200", "B200", "L40S", "T4"]:
        assert PROFILES[key].fans == 0, key
    assert PROFILES["RTX-A6000"].fans == 1


def test_power_limits_are_ordered() -> None:
    for p in PROFILES.values():
        default, low, high = p.power_w
        assert low <= default <= high, p.key
        assert 0 < p.idle_power_w < default, p.key


def test_current_clocks_never_exceed_the_maximum() -> None:
    for p in PROFILES.values():
        assert all(c <= m for c, m in zip(p.clocks, p.max_clocks, strict=True)), p.key


def test_temperature_thresholds_are_ordered() -> None:
    for p in PROFILES.values():
        idle, slowdown, shutdown, gpu_max, _ = p.temps
        assert idle < gpu_max <= slowdown < shutdown, p.key


def test_sxm_profiles_sit_on_nvswitch_baseboards() -> None:
    assert PROFILES["A100-SXM4-80GB"].nvswitches_per_board == 6
    assert PROFILES["H100-SXM5-80GB"].nvswitches_per_board == 4
    assert PROFILES["B200"].nvswitches_per_board == 2
    assert not PROFILES["L40S"].sxm and not PROFILES["T4"].sxm


def test_lookup_ignores_case() -> None:
    assert profiles.get("h100-sxm5-80gb") is PROFILES["H100-SXM5-80GB"]


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(FakeNvmlError, match=r"unknown profile 'H900' \(known: A100-SXM4-40GB, "):
        profiles.get("H900")


def test_every_profile_fits_the_state_format() -> None:
    gpus = [p.make_gpu(i, f"GPU-{i}", str(i), (0x100, i + 1, 0, 0)) for i, p in enumerate(_all())]
    node, _ = statefile.unpack(statefile.pack(Node("n", gpus), 1))
    assert [g.name for g in node.gpus] == [p.name for p in _all()]
    assert [g.memory_total for g in node.gpus] == [p.memory_mib << 20 for p in _all()]


def _all() -> list[profiles.Profile]:
    return list(PROFILES.values())
