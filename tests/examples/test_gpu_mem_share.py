"""gpu-mem-share's webhook decision, without a cluster: which pods it sends to the
subject's scheduler (e2e/test_share.py shows it on a real API server)."""

from __future__ import annotations

import base64
import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpu-mem-share"


@pytest.fixture(scope="module")
def webhook() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLE))  # it imports its sibling share.py, as in its image
    try:
        import webhook as module

        yield module
    finally:
        sys.path.remove(str(EXAMPLE))


def pod(units: int = 0, **spec: str) -> dict:
    limits = {"example.com/gpu-mem": str(units)} if units else {}
    containers = [{"name": "main", "resources": {"limits": limits}}]
    spec = {"containers": containers, "schedulerName": "default-scheduler", **spec}
    return {"metadata": {"name": "p"}, "spec": spec}


def patched(webhook: ModuleType, obj: dict) -> list[dict]:
    answer = webhook.review({"uid": "u-1", "namespace": "ns", "object": obj})
    assert answer["uid"] == "u-1" and answer["allowed"] is True
    if "patch" not in answer:
        return []
    assert answer["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(answer["patch"]))


def test_a_pod_asking_for_units_goes_to_its_scheduler(webhook: ModuleType) -> None:
    assert patched(webhook, pod(2)) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-mem-share-scheduler"}
    ]


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (pod(0), "asks for no units"),
        (pod(2, schedulerName="my-scheduler"), "names a scheduler of its own"),
        (pod(2, nodeName="n1"), "bound by nodeName: no scheduler sees it"),
    ],
)
def test_other_pods_are_left_alone(webhook: ModuleType, obj: dict, why: str) -> None:
    assert patched(webhook, obj) == [], why


def test_it_answers_the_path_the_api_server_asks(webhook: ModuleType) -> None:
    """The API server posts to the configured path with its timeout as a query
    (/mutate?timeout=5s); the server answers there, as an AdmissionReview."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), webhook.Handler)  # TLS aside
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u-2", "object": pod(1)}}  # fmt: skip
        url = f"http://127.0.0.1:{server.server_port}/mutate?timeout=5s"
        req = urllib.request.Request(url, json.dumps(review).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"] == "u-2"
        assert answer["response"]["patchType"] == "JSONPatch"
    finally:
        server.shutdown()
