"""The kubelet device-plugin API v1beta1: constants, and the generated gRPC modules.

api_pb2 / api_pb2_grpc are build products of `python -m plugin.api.generate` (run by
`make install`); `load()` imports them with an error that says so when they are missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Values the kubelet and every plugin agree on (k8s.io/kubelet .../v1beta1/constants.go).
VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET = "kubelet.sock"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
# The API's sockets are Unix sockets: sockaddr_un.sun_path is 108 bytes with its NUL, so a
# longer path cannot be bound, and a connect to one fails as a refusal would.
MAX_SOCKET_PATH = 107


def load() -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc), or an error naming the command that generates them."""
    try:
        pb2 = importlib.import_module("plugin.api.v1beta1.api_pb2")
        grpc_mod = importlib.import_module("plugin.api.v1beta1.api_pb2_grpc")
    except ModuleNotFoundError as e:
        if e.name not in ("plugin.api.v1beta1.api_pb2", "plugin.api.v1beta1.api_pb2_grpc"):
            raise
        raise ModuleNotFoundError(
            f"{e.name} is not generated yet; run `python -m plugin.api.generate` "
            "(make install does it)",
            name=e.name,
        ) from e
    return pb2, grpc_mod
