"""The unit tier's order: the files that run minutes (a kind cluster, image builds) first.

`make test-unit` runs two xdist workers, a file each at a time, in collection order
(`--dist loadfile --no-loadscope-reorder`): a worker asks for the next file when the one it
runs is nearly done. With the files in their own order, test_lab.py (a kind cluster, ~6
min) started after most others and ran alone at the end; started first, the other worker
runs the rest beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST = (
    "tests/clusters/test_lab.py",  # the seed lab: kind, both plugins, NFD and GFD
    "tests/containers/test_subject_images.py",  # every subject's image built and run
    "tests/plugin/test_conformance.py",  # kubelet stand-ins against both plugins
    "tests/test_package.py",  # a wheel built and installed in a new venv
)


def pytest_report_header() -> list[str]:
    """The subjects the node and container tiers leave out (`cluster_only`), one line each:
    shipped ones and those $GPULAB_SUBJECTS names."""
    from clusters.infra import infra
    from clusters.subjects import subject

    return subject.cluster_only(infra.subjects_tested())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if missing := [f for f in FIRST if not (ROOT / f).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py FIRST names no file: {', '.join(missing)}")

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each file's own order kept
