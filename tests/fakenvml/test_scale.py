"""A 1024-GPU node through the official bindings: identity, lookups, topology, events."""

from __future__ import annotations

import pynvml as nv
import pytest

from fakenvml.node import NodeDir

WIDE = {"gpus": [{"profile": "H100-SXM5-80GB", "count": 1024}]}


@pytest.fixture
def wide(make_state, fake_library) -> NodeDir:  # type: ignore[no-untyped-def]
    d = make_state(WIDE, "wide")
    nv.nvmlInit()
    yield d
    nv.nvmlShutdown()


def test_1024_gpus_have_distinct_identities_and_resolve_back(wide: NodeDir) -> None:
    node = wide.node()
    assert nv.nvmlDeviceGetCount() == 1024
    uuids, buses = set(), set()
    for i in range(1024):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        uuid, bus = nv.nvmlDeviceGetUUID(handle), nv.nvmlDeviceGetPciInfo(handle).busId
        assert (uuid, bus) == (node.gpus[i].uuid, node.gpus[i].bus_id)
        uuids.add(uuid)
        buses.add(bus)
    assert len(uuids) == len(buses) == 1024
    for i in (0, 511, 1023):
        g = node.gpus[i]
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(g.uuid)) == i
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(g.bus_id)) == i


def test_1024_gpus_topology_and_events(wide: NodeDir) -> None:
    last = nv.nvmlDeviceGetHandleByIndex(1023)
    level = nv.nvmlDeviceGetTopologyCommonAncestor(nv.nvmlDeviceGetHandleByIndex(0), last)
    assert level == nv.NVML_TOPOLOGY_SYSTEM  # first and last sit on different NUMA nodes
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(last, nv.nvmlEventTypeXidCriticalError, es)
    wide.inject_xid(1023, 79)
    e = nv.nvmlEventSetWait_v2(es, 1000)
    assert (nv.nvmlDeviceGetIndex(e.device), e.eventData) == (1023, 79)
    nv.nvmlEventSetFree(es)
