"""The v1beta1 proto speaks the kubelet's wire format, and its generated code is fresh.

UPSTREAM is the kubelet's api.proto (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) as a
table: message -> field name -> (number, type, repeated). A field renamed or renumbered
here would still compile and silently break every kubelet, so the test checks all of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from plugin.api import generate
from plugin.api.v1beta1 import api_pb2

F = FieldDescriptor
S, B, I32, I64, M = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_INT32, F.TYPE_INT64, F.TYPE_MESSAGE
MAP = "map<string,string>"

UPSTREAM: dict[str, dict[str, tuple[int, object, bool]]] = {
    "DevicePluginOptions": {
        "pre_start_required": (1, B, False),
        "get_preferred_allocation_available": (2, B, False),
    },
    "RegisterRequest": {
        "version": (1, S, False),
        "endpoint": (2, S, False),
        "resource_name": (3, S, False),
        "options": (4, "DevicePluginOptions", False),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, "Device", True)},
    "TopologyInfo": {"nodes": (1, "NUMANode", True)},
    "NUMANode": {"ID": (1, I64, False)},
    "Device": {
        "ID": (1, S, False),
        "health": (2, S, False),
        "topology": (3, "TopologyInfo", False),
    },
    "PreStartContainerRequest": {"devices_ids": (1, S, True)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": (1, "ContainerPreferredAllocationRequest", True),
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, S, True),
        "must_include_deviceIDs": (2, S, True),
        "allocation_size": (3, I32, False),
    },
    "PreferredAllocationResponse": {
        "container_responses": (1, "ContainerPreferredAllocationResponse", True),
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, S, True)},
    "AllocateRequest": {"container_requests": (1, "ContainerAllocateRequest", True)},
    "ContainerAllocateRequest": {"devices_ids": (1, S, True)},
    "CDIDevice": {"name": (1, S, False)},
    "AllocateResponse": {"container_responses": (1, "ContainerAllocateResponse", True)},
    "ContainerAllocateResponse": {
        "envs": (1, MAP, True),
        "mounts": (2, "Mount", True),
        "devices": (3, "DeviceSpec", True),
        "annotations": (4, MAP, True),
        "cdi_devices": (5, "CDIDevice", True),
    },
    "Mount": {
        "container_path": (1, S, False),
        "host_path": (2, S, False),
        "read_only": (3, B, False),
    },
    "DeviceSpec": {
        "container_path": (1, S, False),
        "host_path": (2, S, False),
        "permissions": (3, S, False),
    },
}

# service -> method -> (request, response, server streaming)
UPSTREAM_SERVICES = {
    "Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": (
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            False,
        ),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
}


def _shape(field: FieldDescriptor) -> tuple[int, object, bool]:
    kind: object = field.type
    if field.type == M:
        entry: Descriptor = field.message_type
        if entry.GetOptions().map_entry:
            kv = [entry.fields_by_name[k].type for k in ("key", "value")]
            assert kv == [S, S], f"{field.full_name}: map of {kv}, kubelet's is map<string,string>"
            kind = MAP
        else:
            assert entry.full_name.startswith("v1beta1."), entry.full_name
            kind = entry.name
    return field.number, kind, field.is_repeated


def test_package_is_v1beta1() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"


def test_messages_are_exactly_the_kubelets() -> None:
    ours = set(api_pb2.DESCRIPTOR.message_types_by_name)
    assert ours == set(UPSTREAM), (
        f"missing: {sorted(set(UPSTREAM) - ours)}, extra: {sorted(ours - set(UPSTREAM))}"
    )


@pytest.mark.parametrize("message", sorted(UPSTREAM))
def test_message_fields_match_the_kubelets(message: str) -> None:
    desc = api_pb2.DESCRIPTOR.message_types_by_name[message]
    ours = {f.name: _shape(f) for f in desc.fields}
    assert ours == UPSTREAM[message]


@pytest.mark.parametrize("service", sorted(UPSTREAM_SERVICES))
def test_service_methods_match_the_kubelets(service: str) -> None:
    desc = api_pb2.DESCRIPTOR.services_by_name[service]
    ours = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in desc.methods
    }
    assert ours == UPSTREAM_SERVICES[service]
    assert not any(m.client_streaming for m in desc.methods)


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    for path in fresh:
        checked = generate.REPO / generate.PROTO.parent / path.name
        assert checked.exists(), f"{checked} missing: run `python -m plugin.api.generate`"
        assert checked.read_bytes() == path.read_bytes(), (
            f"{checked} is stale against {generate.PROTO}: run `python -m plugin.api.generate`"
        )
