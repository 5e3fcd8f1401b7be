"""Every profile walked like a real GPU (fakenvml.walk, one GPU each): the calls its family
says a board of it answers answer SUCCESS, the calls the family lacks NOT_SUPPORTED, the
driver's argument checks the same on every profile as on the captured H100, and the
platform layer answers for VM inventories; docs/fakenvml.md's table is this walk's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fakenvml import boards, branches, families, inventory, platforms, profiles
from fakenvml.model import Gpu

KEYS = list(profiles.PROFILES)
CAPTURE = Path(__file__).resolve().parent / "data" / "h100" / "h100-walk.json"
INVENTORIES = Path(inventory.__file__).parent / "inventories"
Walks = dict[str, tuple[Gpu, dict[str, Any]]]


@pytest.fixture(scope="module")
def walks(fake_library: object, tmp_path_factory: pytest.TempPathFactory) -> Walks:
    where = tmp_path_factory.mktemp("boards")
    out = {}
    for key in KEYS:
        node = boards.node_of(key)
        out[key] = (node.gpus[0], boards.walk_node(node, where))
    return out


def _rc(walked: dict[str, Any], key: str) -> str:
    return walked.get(key, {"rc": "ABSENT"})["rc"]


@pytest.mark.parametrize("key", KEYS)
def test_the_calls_its_family_answers_answer_on_the_board(key: str, walks: Walks) -> None:
    gpu, walked = walks[key]
    declared = profiles.PROFILES[key].family.answers(gpu)
    wrong = {k: _rc(walked, k) for k in sorted(declared) if _rc(walked, k) != "SUCCESS"}
    assert not wrong, f"{key}: calls its family answers, answered otherwise: {wrong}"


@pytest.mark.parametrize("key", KEYS)
def test_the_calls_its_family_lacks_answer_not_supported(key: str, walks: Walks) -> None:
    _, walked = walks[key]
    lacks = profiles.PROFILES[key].family.lacks
    wrong = {k: _rc(walked, k) for k in lacks if _rc(walked, k) != "NVML_ERROR_NOT_SUPPORTED"}
    assert not wrong, f"{key}: calls its family lacks, answered otherwise: {wrong}"


@pytest.mark.parametrize("key", KEYS)
def test_the_drivers_argument_checks_answer_alike_on_every_profile(key: str, walks: Walks) -> None:
    gpu, walked = walks[key]
    checks = {k: rc for k in walked if (rc := branches.R580.refuses(k, gpu))}
    assert len(checks) > 20, "the walk reaches the driver's checks"
    wrong = {k: (walked[k]["rc"], rc) for k, rc in checks.items() if walked[k]["rc"] != rc}
    assert not wrong, f"{key}: (answered, the driver's) {wrong}"


def test_the_drivers_argument_checks_are_the_captures() -> None:
    """Each refusal the driver layer states is what the real H100 answered."""
    real = json.loads(CAPTURE.read_text())
    h100 = boards.node_of("H100-SXM5-80GB").gpus[0]
    checks = {k: rc for k in real if (rc := branches.R580.refuses(k, h100))}
    assert set(branches.R580.refusals) <= set(checks)
    assert {k: real[k]["rc"] for k in checks} == checks


def test_every_family_has_boards_and_states_why_it_lacks_a_call() -> None:
    by_family = {p.family.key for p in profiles.PROFILES.values()}
    assert by_family == set(families.FAMILIES)
    for f in families.FAMILIES.values():
        assert set(f.lacks) <= families.HOPPER_CALLS, f.key
        assert all(why.strip() for why in f.lacks.values()), f.key


def test_unsourced_values_name_values_the_layer_states() -> None:
    for p in profiles.PROFILES.values():
        assert set(p.unsourced) <= set(profiles.stated(p)), p.key
    for f in families.FAMILIES.values():
        assert set(f.unsourced) <= set(families.stated(f)), f.key


@pytest.mark.parametrize(
    ("inventory_file", "mode"),
    [("h100-vm.yaml", 1), ("t4-2.yaml", 1), ("dgx-h100.yaml", 0)],
)
def test_the_platform_layer_answers_the_virtualization_mode(
    inventory_file: str, mode: int, fake_library: object, tmp_path: Path
) -> None:
    node = inventory.load(INVENTORIES / inventory_file)
    walked = boards.walk_node(node, tmp_path)
    assert walked["nvmlDeviceGetVirtualizationMode"] == {"rc": "SUCCESS", "value": mode}
    vm = node.platform == platforms.VM_PASSTHROUGH.code
    assert (walked["nvmlDeviceGetNumaNodeId"]["rc"] == "NVML_ERROR_NOT_SUPPORTED") == vm


def test_the_docs_table_is_this_walk(walks: Walks) -> None:
    rows = [boards.row(key, *walks[key]) for key in KEYS]
    for page in boards.PAGES:
        assert boards.listed(page.read_text()) == boards.table(rows), (
            f"{page.name}: run `python -m fakenvml.boards`"
        )
