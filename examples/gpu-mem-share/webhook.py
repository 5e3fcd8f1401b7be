"""gpu-mem-share's mutating admission webhook: a pod that asks for example.com/gpu-mem and
names the default scheduler is sent to gpu-mem-share's scheduler instead, so a user's pod
needs no schedulerName (HAMi's webhook does the same for its resources). A pod bound by
nodeName is left alone: no scheduler will see it.

The API server calls it over TLS with the certificate its chart (webhook/) generated; the
MutatingWebhookConfiguration's matchConditions send it only pods that ask for the resource,
so its failurePolicy (Fail) never stands between the cluster and any other pod.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import ssl
from http.server import ThreadingHTTPServer
from urllib.parse import urlsplit

from share import JsonHandler, requested

log = logging.getLogger("gpu-mem-share-webhook")
SCHEDULER = os.environ.get("GPU_SHARE_SCHEDULER", "gpu-mem-share-scheduler")
DEFAULT = "default-scheduler"  # what the API server fills in before admission


def review(request: dict) -> dict:
    """The AdmissionReview response to one request: allowed, with a JSON patch that names
    the scheduler where the pod asks for units and would go to the default one."""
    pod = request.get("object") or {}
    spec = pod.get("spec") or {}
    answer: dict = {"uid": request["uid"], "allowed": True}
    if (requested(pod) and not spec.get("nodeName")
            and spec.get("schedulerName", DEFAULT) == DEFAULT):  # fmt: skip
        patch = [{"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER}]
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        meta = pod.get("metadata") or {}
        log.info("pod %s/%s: schedulerName %s", request.get("namespace"),
                 meta.get("name") or meta.get("generateName"), SCHEDULER)  # fmt: skip
    return answer


class Handler(JsonHandler):
    def do_GET(self) -> None:  # the readiness probe
        self.reply(200 if urlsplit(self.path).path == "/healthz" else 404, {})

    def do_POST(self) -> None:
        # The API server asks /mutate?timeout=5s (the configuration's timeoutSeconds).
        if urlsplit(self.path).path != "/mutate":
            self.reply(404, {})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = review(body["request"])
        self.reply(200, {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
                         "kind": "AdmissionReview", "response": answer})  # fmt: skip


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # PID 1: see extender.py
    certs = os.environ.get("GPU_SHARE_TLS_DIR", "/tls")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(f"{certs}/tls.crt", f"{certs}/tls.key")
    port = int(os.environ.get("WEBHOOK_PORT", "8443"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    log.info("serving /mutate on :%d; pods asking for units go to %s", port, SCHEDULER)
    server.serve_forever()


if __name__ == "__main__":
    main()
