"""Preferred allocation: NVLink first, then PCIe proximity (NUMA included); must-include
ids are always kept."""

from __future__ import annotations

from plugin.allocator import prefer

# 8 GPUs: NVLink islands {0,1,2,3} and {4,5,6,7}; PCIe pairs (0,1) (2,3)...; NUMA 0-3 / 4-7.
ISLAND = {i: i // 4 for i in range(8)}


def score(a: int, b: int) -> int:
    links = 100 * 4 if ISLAND[a] == ISLAND[b] else 0
    pcie = 40 if a // 2 == b // 2 else (10 if ISLAND[a] == ISLAND[b] else 0)
    return links + pcie


def test_fills_one_nvlink_island_first() -> None:
    assert sorted(prefer(range(8), [], 4, score)) in ([0, 1, 2, 3], [4, 5, 6, 7])


def test_must_include_is_kept_and_its_island_preferred() -> None:
    got = prefer(range(8), [5], 3, score)
    assert got[0] == 5 and set(got) <= {4, 5, 6, 7}
    assert 4 in got  # 5's PCIe neighbour beats the rest of the island


def test_pcie_pair_preferred_when_nvlink_is_equal() -> None:
    assert sorted(prefer([0, 2, 3, 5], [], 2, score)) == [2, 3]


def test_size_larger_than_available_returns_what_there_is() -> None:
    assert sorted(prefer([1, 6], [], 4, score)) == [1, 6]


def test_deterministic() -> None:
    assert prefer(range(8), [], 6, score) == prefer(range(8), [], 6, score)
