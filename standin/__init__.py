"""The node tier's kubelet stand-in: a Registration server that drives device plugins
the way the kubelet's device manager does, plus helpers to run a plugin under it.

The names below load on first use, so importing the pytest plugin (a submodule) does not
import gRPC."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from standin.kubelet import Admission, Kubelet, Record, Resource, StandinError

__all__ = ["Admission", "Kubelet", "Record", "Resource", "StandinError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from standin import kubelet

        return getattr(kubelet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
