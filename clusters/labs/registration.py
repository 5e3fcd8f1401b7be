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


# The kubelet answering a plugin that stops its gRPC server and registers the same socket
# again a few ms later (NVIDIA's plugin on SIGHUP: 3-6 ms on the labs, 2026-12-07). v1.34's
# device manager replaces the resource's client on Register; when an older stream's end is
# handled after that, `runClient` looks the client up by resource name and disconnects the
# *new* one (kubernetes/kubernetes#121994, pkg/kubelet/cm/devicemanager/plugin/v1beta1/
# handler.go). Where the new client was connected, its stream ends "the client connection
# is closing" and nothing registers again; where it was still connecting, the kubelet
# forgets it and serves its devices, and its own end later changes nothing: allocatable
# stays as it was when the plugin stops serving (a CI run, 2026-12-07: `nvidia.com/gpu`
# 2 of 2 on MIG GPUs the plugin served nothing of). Either way a stream's end follows the
# newest Register while its plugin still serves. v1.37 refuses the Register instead
# ("already connected").
DROPPED = ("ListAndWatch ended", "already connected")


def newest(journal: list[str], resource: str) -> tuple[int, list[str]]:
    """How many registration requests of `resource` the kubelet's lines hold, and the lines
    that show it dropped the newest: that request and what followed it, where one of those
    is a stream's end or a refusal ([] when it stands, or there was none). Read while the
    plugin serves: its newest stream has not ended, so a stream's end after its Register
    is an older one's.

    The count is the one `registrations` reads (the kubelet's `Register` logs its request
    and increments `kubelet_device_plugin_registration_total` together, server.go at
    v1.34 and v1.37), taken from the same lines as the drop so that no Register falls
    between two reads; Mark keeps the counter, which needs no journal and tells a
    restarted kubelet by its start time."""
    ours = [x for x in journal if f'"{resource}"' in x]
    asked = [i for i, x in enumerate(ours) if "registration request" in x]
    if not asked:
        return 0, []
    after = ours[asked[-1] :]
    return len(asked), after if any(d in x for x in after[1:] for d in DROPPED) else []
