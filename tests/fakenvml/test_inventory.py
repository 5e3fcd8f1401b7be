"""Inventories: YAML in, a validated model.Node out, with realistic defaults."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fakenvml import inventory, platforms, statefile
from fakenvml.errors import FakeNvmlError
from fakenvml.model import LINK_REMOTE_GPU, LINK_REMOTE_SWITCH, MAX_DEVICES, Gpu, Node

EXAMPLES = sorted((Path(inventory.__file__).parent / "inventories").glob("*.yaml"))
NO_HOST = Path("/nonexistent-sysfs")  # tests that are not about host domains ignore the host


def build(spec: dict[str, Any], name: str = "node-a", sysfs: Path = NO_HOST) -> Node:
    return inventory.from_dict(spec, name, sysfs=sysfs)


def gpus(profile: str, count: int = 1, **topology: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpus": [{"profile": profile, "count": count}]}
    if topology:
        spec["topology"] = topology
    return spec


def refused(spec: object, match: str) -> str:
    with pytest.raises(FakeNvmlError, match=match) as e:
        inventory.from_dict(spec, "node-a", sysfs=NO_HOST)
    message = str(e.value)
    assert "\n" not in message
    return message


def peers(gpu: Gpu) -> Counter[int]:
    return Counter(link.remote_index for link in gpu.links if link.active)


# --------------------------------------------------------------------------- identity


def test_profile_times_count_expands_in_index_order() -> None:
    node = build({"gpus": [{"profile": "T4", "count": 2}, {"profile": "L40S", "count": 3}]})
    assert [g.index for g in node.gpus] == [0, 1, 2, 3, 4]
    assert [g.name for g in node.gpus] == ["Tesla T4"] * 2 + ["NVIDIA L40S"] * 3


def test_uuids_are_stable_across_runs_and_differ_between_nodes() -> None:
    first, again = build(gpus("H100-SXM5-80GB", 8)), build(gpus("H100-SXM5-80GB", 8))
    other = build(gpus("H100-SXM5-80GB", 8), name="node-b")
    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}


def test_uuids_have_the_nvml_shape() -> None:
    shape = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert all(shape.fullmatch(g.uuid) for g in build(gpus("T4", 16)).gpus)


def test_serials_are_13_digits_and_unique_within_a_node() -> None:
    serials = [g.serial for g in build(gpus("H100-SXM5-80GB", 1024)).gpus]
    assert all(re.fullmatch(r"\d{13}", s) for s in serials)
    assert len(set(serials)) == 1024


def test_explicit_identity_overrides_the_defaults() -> None:
    node = build(
        {
            "gpus": [
                {
                    "profile": "L40S",
                    "uuid": "GPU-5C1B3E55-0D6E-4B8A-9F2E-7A3C1D9E0B42",
                    "serial": 1323623029179,
                    "bus_id": "0000:81:00.0",
                    "memory": "40GiB",
                }
            ]
        }
    )
    g = node.gpus[0]
    assert g.uuid == "GPU-5c1b3e55-0d6e-4b8a-9f2e-7a3c1d9e0b42"
    assert g.serial == "1323623029179"
    assert g.bus_id == "00000000:81:00.0"
    assert g.memory_total == 40 << 30


@pytest.mark.parametrize(
    ("memory", "expected"),
    [(81559 << 20, 81559 << 20), ("81559MiB", 81559 << 20), ("80 GiB", 80 << 30),
     ("1TiB", 1 << 40)],
)  # fmt: skip
def test_memory_accepts_bytes_or_binary_units(memory: object, expected: int) -> None:
    node = build({"gpus": [{"profile": "H100-SXM5-80GB", "memory": memory}]})
    assert node.gpus[0].memory_total == expected


def test_profile_values_reach_the_gpu() -> None:
    g = build(gpus("H100-SXM5-80GB")).gpus[0]
    assert (g.cc_major, g.cc_minor, g.arch) == (9, 0, 9)
    assert (g.pci_device_id, g.pci_subsystem_id) == (0x233010DE, 0x16C110DE)
    assert (g.power_max_mw, g.power_min_mw, g.power_limit_mw) == (700_000, 200_000, 700_000)
    assert g.fan_count == 0 and g.bar1_total == 131072 << 20


# --------------------------------------------------------------------------- PCI addresses


def test_default_bus_ids_skip_pci_domains_the_host_has(tmp_path: Path) -> None:
    for entry in ["0000:00:00.0", "0100:00:01.0", "0101:3b:00.0"]:
        (tmp_path / entry).mkdir()
    node = build(gpus("T4", 2), sysfs=tmp_path)
    assert [g.bus_id for g in node.gpus] == ["00000102:01:00.0", "00000102:02:00.0"]


def test_default_bus_ids_name_no_device_of_this_host() -> None:
    node = inventory.from_dict(gpus("H100-SXM5-80GB", 1024), "node-a")
    host = {p.name.lower() for p in inventory.SYS_PCI_DEVICES.glob("*")}
    assert not {g.bus_id[4:].lower() for g in node.gpus} & host
    switches = {link.remote_bus_id[4:].lower() for g in node.gpus for link in g.links}
    assert not switches & host


def test_1024_gpus_get_unique_bus_ids_over_several_domains() -> None:
    node = build(gpus("H100-SXM5-80GB", 1024))
    assert len({g.bus_id for g in node.gpus}) == 1024
    assert len({g.pci_domain for g in node.gpus}) == 5  # 255 GPUs per domain
    assert all(g.pci_device == 0 and g.pci_function == 0 for g in node.gpus)


def test_default_bus_ids_step_around_explicit_ones() -> None:
    node = build({"gpus": [{"profile": "T4", "bus_id": "0100:02:00.0"}, {"profile": "T4"},
                           {"profile": "T4"}]})  # fmt: skip
    assert [g.bus_id for g in node.gpus] == [
        "00000100:02:00.0",
        "00000100:01:00.0",
        "00000100:03:00.0",
    ]


def test_a_node_holds_up_to_max_devices() -> None:
    assert len(build(gpus("T4", MAX_DEVICES)).gpus) == MAX_DEVICES
    refused({"gpus": [{"profile": "T4", "count": MAX_DEVICES}, {"profile": "T4"}]}, "1 to 4096")


# --------------------------------------------------------------------------- NVLink


def test_eight_sxm_gpus_default_to_an_nvswitch_baseboard() -> None:
    node = build(gpus("H100-SXM5-80GB", 8))
    gpu_buses = {g.bus_id for g in node.gpus}
    for g in node.gpus:
        assert len(g.links) == 18 and all(link.active for link in g.links)
        assert {link.remote_kind for link in g.links} == {LINK_REMOTE_SWITCH}
        assert {link.remote_device_id for link in g.links} == {0x22A310DE}
        assert not {link.remote_bus_id for link in g.links} & gpu_buses


def test_nvswitch_links_spread_over_the_boards_switches() -> None:
    g = build(gpus("H100-SXM5-80GB", 8, nvlink={"nvswitch": True})).gpus[0]
    per_switch = Counter(link.remote_bus_id for link in g.links)
    assert sorted(per_switch.values()) == [4, 4, 5, 5]  # 18 links over 4 NVSwitches


def test_each_baseboard_of_eight_has_its_own_switches() -> None:
    node = build(gpus("A100-SXM4-80GB", 16))
    boards = [{link.remote_bus_id for link in g.links} for g in node.gpus]
    assert all(len(b) == 6 for b in boards)  # DGX A100: six NVSwitches
    assert boards[0] == boards[7] and not boards[0] & boards[8]


def test_fewer_than_eight_sxm_gpus_are_wired_all_to_all() -> None:
    node = build(gpus("H100-SXM5-80GB", 4))
    for g in node.gpus:
        assert peers(g) == Counter({p: 6 for p in range(4) if p != g.index})  # 18 / 3
        assert all(link.remote_kind == LINK_REMOTE_GPU for link in g.links)


def test_nvlink_groups_fully_connect_each_group_only() -> None:
    node = build(gpus("A100-SXM4-80GB", 8, nvlink={"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}))
    assert peers(node.gpus[0]) == Counter({1: 4, 2: 4, 3: 4})
    assert peers(node.gpus[5]) == Counter({4: 4, 6: 4, 7: 4})
    link = node.gpus[0].links[0]
    assert (link.remote_bus_id, link.remote_device_id) == (node.gpus[1].bus_id, 0x20B210DE)


def test_gpus_left_out_of_groups_keep_inactive_links() -> None:
    node = build(gpus("A100-SXM4-80GB", 4, nvlink={"groups": [[0, 1]]}))
    assert len(node.gpus[3].links) == 12 and not any(link.active for link in node.gpus[3].links)


def test_explicit_links_pair_gpus() -> None:
    spec = gpus("RTX-A6000", 2, nvlink={"links": [{"gpus": [0, 1], "count": 4}]})
    node = build(spec)
    assert peers(node.gpus[0]) == Counter({1: 4}) and peers(node.gpus[1]) == Counter({0: 4})


def test_nvlink_false_keeps_the_links_but_connects_none() -> None:
    node = build(gpus("H100-SXM5-80GB", 8, nvlink=False))
    assert all(len(g.links) == 18 and not any(x.active for x in g.links) for g in node.gpus)


def test_pcie_cards_have_no_nvlink_by_default() -> None:
    assert all(g.links == [] for g in build(gpus("T4", 4)).gpus)
    assert not any(x.active for g in build(gpus("RTX-A6000", 2)).gpus for x in g.links)


# --------------------------------------------------------------------------- platform


def test_nodes_are_bare_metal_unless_the_inventory_says_otherwise() -> None:
    assert build(gpus("H100-SXM5-80GB", 8)).platform == platforms.BARE_METAL.code


def test_a_vm_passthrough_node_shows_no_nvlink_but_keeps_the_boards_link_count() -> None:
    node = build({"platform": "vm-passthrough", **gpus("H100-SXM5-80GB", 2)})
    assert node.platform == platforms.VM_PASSTHROUGH.code
    assert all(g.links == [] and g.nvlink_board == 18 for g in node.gpus)


def test_a_vm_whose_topology_wires_nvlink_keeps_it() -> None:
    wired = gpus("H100-SXM5-80GB", 2, nvlink={"groups": [[0, 1]]})
    node = build({"platform": "vm-passthrough", **wired})
    assert all(len(g.links) == 18 for g in node.gpus)


@pytest.mark.parametrize("name", ["h100-vm.yaml", "t4-2.yaml"])
def test_the_vm_inventories_are_passthrough(name: str) -> None:
    node = inventory.load(Path(inventory.__file__).parent / "inventories" / name)
    assert node.platform == platforms.VM_PASSTHROUGH.code


def test_unknown_platform_is_refused_with_the_known_list() -> None:
    known = r"\(known: bare-metal, vm-passthrough\)"
    refused({"platform": "cloud", **gpus("T4")}, rf"platform: unknown platform 'cloud' {known}")


# --------------------------------------------------------------------------- NUMA and PCIe


def test_gpus_split_evenly_across_two_numa_nodes_by_default() -> None:
    node = build(gpus("H100-SXM5-80GB", 8))
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [(g.cpu_first, g.cpu_count) for g in node.gpus[3:5]] == [(0, 32), (32, 32)]


def test_numa_placement_can_be_explicit() -> None:
    node = build(gpus("T4", 4, numa={"nodes": 2, "cpus_per_node": 8, "gpus": [1, 0, 1, 0]}))
    assert [g.numa_node for g in node.gpus] == [1, 0, 1, 0]
    assert node.gpus[0].cpu_first == 8


def test_zero_numa_nodes_means_no_numa() -> None:
    node = build(gpus("T4", 2, numa={"nodes": 0}))
    assert [g.numa_node for g in node.gpus] == [-1, -1]


def test_two_gpus_share_a_pcie_switch_by_default() -> None:
    node = build(gpus("H100-SXM5-80GB", 8))
    assert [g.pcie_switch for g in node.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [g.pcie_upper_switch for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_pcie_tree_never_spans_numa_nodes() -> None:
    node = build(gpus("T4", 6, pcie={"gpus_per_switch": 4}))
    by_switch: dict[int, set[int]] = {}
    for g in node.gpus:
        by_switch.setdefault(g.pcie_switch, set()).add(g.numa_node)
        assert g.host_bridge >= 0
    assert all(len(nodes) == 1 for nodes in by_switch.values())


def test_pcie_layout_is_configurable() -> None:
    spec = gpus("T4", 8, pcie={"gpus_per_switch": 1, "switches_per_upper": 2,
                               "uppers_per_bridge": 2}, numa={"nodes": 1})  # fmt: skip
    node = build(spec)
    assert [g.pcie_switch for g in node.gpus] == list(range(8))
    assert [g.pcie_upper_switch for g in node.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [g.host_bridge for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


# --------------------------------------------------------------------------- node-level


def test_driver_version_sets_nvml_and_cuda_versions() -> None:
    node = build({"driver_version": "550.54.15", "gpus": [{"profile": "T4"}]})
    assert (node.driver_version, node.nvml_version, node.cuda_driver_version) == (
        "550.54.15",
        "12.550.54.15",
        12040,
    )


def test_cuda_version_can_be_given() -> None:
    node = build({"driver_version": "590.1.2", "cuda_version": 13.1, "gpus": [{"profile": "T4"}]})
    assert node.cuda_driver_version == 13010 and node.nvml_version == "13.590.1.2"


def test_node_name_comes_from_argument_then_file_then_file_name(tmp_path: Path) -> None:
    path = tmp_path / "box-7.yaml"
    path.write_text("gpus: [{profile: T4}]\n")
    assert inventory.load(path).name == "box-7"
    path.write_text("node: named\ngpus: [{profile: T4}]\n")
    assert inventory.load(path).name == "named"
    assert inventory.load(path, "override").name == "override"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_inventories_load(path: Path) -> None:
    node = inventory.load(path)
    assert node.gpus and node.name


def test_node_survives_the_state_file_unchanged() -> None:
    node = build(gpus("A100-SXM4-80GB", 8, nvlink={"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}))
    again, boot = statefile.unpack(statefile.pack(node, 42))
    assert again == node and boot == 42


# --------------------------------------------------------------------------- refusals


def test_unknown_profile_is_refused_with_the_known_list() -> None:
    refused(gpus("H900"), r"gpus\[0\]\.profile: unknown profile 'H900' \(known: A100-SXM4-40GB")


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpus:\n  - profile: T4\n   count: 2\n")
    with pytest.raises(FakeNvmlError, match=r"bad\.yaml: not valid YAML at line 3, column \d+"):
        inventory.load(path)


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("gpus: [{profile: T4}]\ngpus: [{profile: L40S}]\n")
    with pytest.raises(FakeNvmlError, match=r"duplicate key 'gpus' \(line 2"):
        inventory.load(path)


def test_count_zero_is_refused() -> None:
    refused(gpus("T4", 0), r"gpus\[0\]\.count: expected a number >= 1, found 0")


def test_count_must_be_an_integer() -> None:
    refused(gpus("T4", "2"), r"gpus\[0\]\.count: expected an integer, found '2'")  # type: ignore[arg-type]


def test_empty_gpu_list_is_refused() -> None:
    refused({"gpus": []}, r"gpus: expected at least 1 item\(s\), found 0 item\(s\)")


def test_unknown_key_lists_the_expected_keys() -> None:
    refused(
        {"gpus": [{"profile": "T4", "cuont": 2}]},
        r"gpus\[0\]\.cuont: unknown key \(expected one of: profile, count, uuid, serial, bus_id, "
        r"memory, mig\)",
    )


def test_misspelt_top_level_key_is_reported_rather_than_the_missing_one() -> None:
    refused({"gpu": [{"profile": "T4"}]}, r"^gpu: unknown key \(expected one of: node, ")


def test_duplicate_uuids_are_refused() -> None:
    uuid = "GPU-12345678-1234-1234-1234-123456789abc"
    spec = {"gpus": [{"profile": "T4", "uuid": uuid}, {"profile": "T4", "uuid": uuid.upper()}]}
    refused(spec, f"GPU 0 and GPU 1 have the same uuid {uuid}")


def test_duplicate_bus_ids_are_refused() -> None:
    spec = {"gpus": [{"profile": "T4", "bus_id": "0000:3b:00.0"},
                     {"profile": "T4", "bus_id": "00000000:3B:00.0"}]}  # fmt: skip
    refused(spec, "GPU 0 and GPU 1 have the same PCI bus id 00000000:3B:00.0")


def test_a_generated_uuid_cannot_be_reused_explicitly() -> None:
    taken = inventory.default_uuid("node-a", 0)
    refused({"gpus": [{"profile": "T4"}, {"profile": "T4", "uuid": taken}]}, "same uuid")


def test_malformed_uuid_is_refused() -> None:
    refused({"gpus": [{"profile": "T4", "uuid": "abc"}]}, r"gpus\[0\]\.uuid: expected GPU- and")


def test_malformed_bus_id_is_refused() -> None:
    refused({"gpus": [{"profile": "T4", "bus_id": "3b:00"}]}, r"gpus\[0\]\.bus_id: expected a PCI")


def test_identity_on_an_entry_with_count_above_one_is_refused() -> None:
    spec = {"gpus": [{"profile": "T4", "count": 2, "serial": "1"}]}
    refused(spec, r"gpus\[0\]: serial name one GPU; this entry has count 2")


def test_memory_in_decimal_units_is_refused() -> None:
    refused({"gpus": [{"profile": "T4", "memory": "16GB"}]}, "size like 81559MiB or 80GiB")


def test_memory_below_the_reserved_amount_is_refused() -> None:
    refused({"gpus": [{"profile": "T4", "memory": "1MiB"}]}, "is not above the 393 MiB")


def test_nvlink_group_naming_a_missing_gpu_is_refused() -> None:
    spec = gpus("A100-SXM4-80GB", 8, nvlink={"groups": [[0, 1, 2, 3], [4, 5, 6, 8]]})
    refused(spec, r"topology\.nvlink\.groups\[1\]: GPU 8 does not exist \(indexes 0-7\)")


def test_overlapping_nvlink_groups_are_refused() -> None:
    spec = gpus("A100-SXM4-80GB", 4, nvlink={"groups": [[0, 1], [1, 2]]})
    refused(spec, r"groups\[1\]: GPU 1 is also in groups\[0\]")


def test_group_larger_than_the_link_count_is_refused() -> None:
    spec = gpus("H100-SXM5-80GB", 20, nvlink={"groups": [list(range(20))]})
    refused(spec, "20 GPUs need 19 NVLinks each to be fully connected; GPU 0 .* has 18")


def test_links_beyond_a_gpus_nvlink_count_are_refused() -> None:
    spec = gpus("RTX-A6000", 2, nvlink={"links": [{"gpus": [0, 1], "count": 5}]})
    refused(spec, r"links\[0\]: GPU 0 has 4 NVLinks, 0 already wired; 5 more do not fit")


def test_nvswitch_with_pcie_cards_is_refused() -> None:
    refused(gpus("L40S", 2, nvlink={"nvswitch": True}), "GPU 0 is a L40S, a PCIe card")


def test_two_nvlink_modes_at_once_are_refused() -> None:
    spec = gpus("H100-SXM5-80GB", 8, nvlink={"nvswitch": True, "groups": [[0, 1]]})
    refused(spec, "give one of nvswitch, groups or links, not nvswitch and groups")


def test_numa_list_of_the_wrong_length_is_refused() -> None:
    refused(gpus("T4", 3, numa={"gpus": [0, 1]}), "one NUMA node per GPU \\(3\\), found 2")


def test_numa_node_out_of_range_is_refused() -> None:
    refused(gpus("T4", 2, numa={"nodes": 2, "gpus": [0, 2]}), r"numa\.gpus\[1\]: .* 0-1, found 2")


def test_bad_node_name_is_refused() -> None:
    with pytest.raises(FakeNvmlError, match="node name 'no spaces please'"):
        inventory.from_dict(gpus("T4"), "no spaces please", sysfs=NO_HOST)


def test_unknown_driver_branch_needs_a_cuda_version() -> None:
    refused({"driver_version": "999.1", "gpus": [{"profile": "T4"}]}, "add cuda_version")


def test_a_document_that_is_not_a_mapping_is_refused() -> None:
    refused([{"profile": "T4"}], "expected a mapping with `gpus:`, found a list")
    refused(None, "found an empty document")


def test_missing_inventory_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FakeNvmlError, match=r"no inventory file .*nope\.yaml"):
        inventory.load(tmp_path / "nope.yaml")


def test_a_mig_layout_is_made_at_init_and_one_that_cannot_be_is_refused(tmp_path: Path) -> None:
    from fakenvml import mig
    from fakenvml.node import NodeDir

    d = NodeDir(tmp_path / "n")
    d.init(inventory.from_dict({"gpus": [
        {"profile": "H100-SXM5-80GB", "count": 2, "mig": "all-1g.10gb"},
        {"profile": "H100-SXM5-80GB", "mig": "3g.40gb,2g.20gb"},
        {"profile": "T4"},
    ]}, "n"))  # fmt: skip
    got = [(x.gpu, x.profile) for x in mig.devices(d)]
    assert got == [(0, "1g.10gb")] * 7 + [(1, "1g.10gb")] * 7 + [(2, "3g.40gb"), (2, "2g.20gb")]
    refused({"gpus": [{"profile": "T4", "mig": "all-1g.10gb"}]}, "does not support MIG")
    refused({"gpus": [{"profile": "H100-SXM5-80GB", "mig": "3g.40gb,3g.40gb,3g.40gb"}]},
            "no room for 3g.40gb")  # fmt: skip
