"""What gpu-mem-share's plugin and its scheduler extender share: the words they write on
pods and nodes, and a small client of the API server's REST interface.

The pattern is that of the memory-sharing plugins in real use (Alibaba's gpushare, HAMi):
the kubelet hands out units of GPU memory by ids that name no GPU; the scheduler's
extender picks the GPU, writes it on the pod before the pod is bound, and the plugin's
Allocate reads it back from the pod. The client is the standard library's: the image is
gpulab's (grpc, nvidia-ml-py), and the two programs need five REST calls, not a client
library's weight.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

RESOURCE = "example.com/gpu-mem"
PREFIX = "gpu-mem-share.example.com"
GPU_INDEX = f"{PREFIX}/gpu-index"  # on a pod: the GPU the extender chose (its NVML index)
ASSIGNED = f"{PREFIX}/assigned"  # on a pod: "false" once chosen, "true" once Allocate used it
ASSUME_TIME = f"{PREFIX}/assume-time"  # on a pod: when it was chosen (ns), oldest first
NODE_GPUS = f"{PREFIX}/gpus"  # on a node: "<index>:<units>:<Healthy|Unhealthy>,..."

SA = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Gpu:
    index: int
    units: int
    healthy: bool


def format_gpus(gpus: list[Gpu]) -> str:
    return ",".join(f"{g.index}:{g.units}:{'Healthy' if g.healthy else 'Unhealthy'}"
                    for g in gpus)  # fmt: skip


def parse_gpus(text: str | None) -> list[Gpu]:
    """The node annotation's GPUs; [] for none or a value this version cannot read."""
    out = []
    for part in (text or "").split(","):
        try:
            index, units, health = part.split(":")
            out.append(Gpu(int(index), int(units), health == "Healthy"))
        except ValueError:
            return []
    return out


def requested(pod: dict) -> int:
    """The units of RESOURCE a pod asks for, over its containers (limits win)."""
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        amount = (res.get("limits") or {}).get(RESOURCE) or (res.get("requests") or {}).get(
            RESOURCE
        )
        total += int(amount or 0)
    return total


def used_units(pods: list[dict]) -> dict[int, int]:
    """Units in use per GPU index on a node: every pod there that is not done and carries a
    choice (chosen and not yet Running counts: it is about to start)."""
    used: dict[int, int] = {}
    for p in pods:
        if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        index = (p["metadata"].get("annotations") or {}).get(GPU_INDEX)
        if index is not None:
            used[int(index)] = used.get(int(index), 0) + requested(p)
    return used


class ApiError(Exception):
    pass


class Kube:
    """The API server, as the pod's service account (in-cluster)."""

    def __init__(self) -> None:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}"
        self.ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")

    def call(self, method: str, path: str, body: object = None,
             content_type: str = "application/json") -> dict:  # fmt: skip
        with open(f"{SA}/token") as f:  # re-read: the kubelet rotates it
            token = f.read().strip()
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise ApiError(f"{method} {path}: {e.code} {e.read()[:300]!r}") from None

    def pods_on(self, node: str) -> list[dict]:
        q = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
        return self.call("GET", f"/api/v1/pods?{q}")["items"]

    def pod(self, namespace: str, name: str) -> dict:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                  {"metadata": {"annotations": annotations}},
                  "application/merge-patch+json")  # fmt: skip

    def node(self, name: str) -> dict:
        return self.call("GET", f"/api/v1/nodes/{name}")

    def annotate_node(self, name: str, annotations: dict[str, str]) -> None:
        self.call("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": annotations}},
                  "application/merge-patch+json")  # fmt: skip

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        })  # fmt: skip


class JsonHandler(BaseHTTPRequestHandler):
    """An HTTP handler that answers JSON and logs requests at debug only (the extender's
    and the webhook's: the scheduler and the API server call them many times a second)."""

    def reply(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *a: object) -> None:
        logging.getLogger(type(self).__module__).debug(fmt, *a)
