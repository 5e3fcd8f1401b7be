"""Has the plugin under test registered with each node's kubelet since a mark?

A Node's allocatable reaches the API server up to one nodeStatusUpdateFrequency (labs: 1 s,
more under load) after the kubelet knew it. Right after a plugin is switched or restarted the
API server can still show the *old* plugin's devices, so a wait on capacity alone passes on
them and the next check sees allocatable 0 (CI: 10/10 read 1.9 s after a switch, 10/0 a
moment later). The kubelet's own counter `kubelet_device_plugin_registration_total`, by
resource, is the plugin-agnostic proof that the new plugin got through Register.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.labs.kubelet_metrics import DeviceMetrics, scrape


def registrations(core: client.CoreV1Api, node: str, resource: str) -> int:
    """How often a plugin of `resource` has registered with `node`'s kubelet since it started."""
    return scrape(core, node, resource).registrations


def _read(core: client.CoreV1Api, node: str, resource: str) -> DeviceMetrics | None:
    """The node's kubelet figures; None while its metrics do not answer (a kubelet
    restarting: the suites restart kubelets; or not in time)."""
    try:
        return scrape(core, node, resource)
    except (ApiException, urllib3.exceptions.HTTPError):
        return None


@dataclass(frozen=True)
class Mark:
    """Before a change to the plugin: its pods then, and each node's kubelet figures."""

    resource: str
    pods: frozenset[str]  # uids
    seen: dict[str, DeviceMetrics | None]  # node -> its kubelet's then (None: no answer)
    at: float = field(default_factory=time.time)  # when (the nodes' clock is this host's)

    @property
    def counts(self) -> dict[str, int]:
        return {n: m.registrations if m else 0 for n, m in self.seen.items()}

    def pending(self, core: client.CoreV1Api, pods: list[client.V1Pod]) -> list[str]:
        """Nodes in the mark that now run a plugin pod the mark did not see and whose
        kubelet has not counted a registration since (a kubelet started since the mark,
        or unknown then, counts from zero)."""
        fresh = {p.spec.node_name for p in pods if p.metadata.uid not in self.pods}
        out = []
        for n in sorted(x for x in self.seen if x in fresh):
            before, now = self.seen[n], _read(core, n, self.resource)
            same = before is not None and now is not None and now.started == before.started
            if now is None or now.registrations <= (before.registrations if same else 0):
                out.append(n)
        return out


def mark(core: client.CoreV1Api, pods: list[client.V1Pod], resource: str,
         nodes: list[str]) -> Mark:  # fmt: skip
    return Mark(resource, frozenset(p.metadata.uid for p in pods),
                {n: _read(core, n, resource) for n in nodes})  # fmt: skip
