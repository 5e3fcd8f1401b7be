"""gpu-mem-share's scheduler extender (the kube-scheduler extender HTTP API): filter keeps
the nodes where one healthy GPU has the units a pod asks for free, prioritize packs pods
onto the fullest GPUs, bind picks that GPU, writes it on the pod and binds the pod. The
plugin's Allocate reads the choice back (share.py: the annotations).

Its scheduler sends only pods that ask for example.com/gpu-mem (managedResources), one
request at a time: this server is single-threaded, so two binds never pick the same free
units.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from http.server import HTTPServer

from share import (
    ASSIGNED,
    ASSUME_TIME,
    GPU_INDEX,
    NODE_GPUS,
    Gpu,
    JsonHandler,
    Kube,
    parse_gpus,
    requested,
    used_units,
)

log = logging.getLogger("gpu-mem-share-extender")
kube = Kube()


def lower(d: dict) -> dict:
    """The scheduler's JSON keys as Go writes them (Pod, Nodes), read case-blind."""
    return {k.lower(): v for k, v in d.items()}


def free(node: dict) -> list[tuple[Gpu, int]]:
    """The node's healthy GPUs and the units each has free, from its annotation and the
    pods placed there."""
    gpus = parse_gpus((node["metadata"].get("annotations") or {}).get(NODE_GPUS))
    used = used_units(kube.pods_on(node["metadata"]["name"]))
    return [(g, g.units - used.get(g.index, 0)) for g in gpus if g.healthy]


def best(room: list[tuple[Gpu, int]], units: int) -> tuple[Gpu, int] | None:
    """Of a node's GPUs and their free units (`free`), the one with the fewest free units
    that still holds `units` (packing), and its free units."""
    fits = [(left, g.index, g) for g, left in room if left >= units]
    if not fits:
        return None
    left, _, gpu = min(fits)
    return gpu, left


def filter_nodes(args: dict) -> dict:
    pod, nodes = args["pod"], (args.get("nodes") or {}).get("items") or []
    units = requested(pod)
    keep, failed = [], {}
    for n in nodes:
        room = free(n)
        if best(room, units) is not None:
            keep.append(n)
        else:
            most = max((left for _, left in room), default=0)
            why = f"no healthy GPU with {units} free units (most free on one GPU: {most})"
            failed[n["metadata"]["name"]] = f"gpu-mem-share: {why}"
    return {"Nodes": {"items": keep}, "FailedNodes": failed, "Error": ""}


def prioritize(args: dict) -> list[dict]:
    pod, nodes = args["pod"], (args.get("nodes") or {}).get("items") or []
    units = requested(pod)
    out = []
    for n in nodes:
        found = best(free(n), units)
        score = 0  # 0..10: the fewer units a GPU keeps free after it, the better
        if found is not None and found[0].units:
            gpu, left = found
            score = 10 - round(10 * (left - units) / gpu.units)
        out.append({"Host": n["metadata"]["name"], "Score": max(0, min(10, score))})
    return out


def bind(args: dict) -> dict:
    ns, name, node = args["podnamespace"], args["podname"], args["node"]
    pod = kube.pod(ns, name)
    found = best(free(kube.node(node)), requested(pod))
    if found is None:
        return {"Error": f"gpu-mem-share: no GPU on {node} has room for {ns}/{name} any more"}
    g = found[0]
    kube.annotate_pod(ns, name, {GPU_INDEX: str(g.index), ASSIGNED: "false",
                                 ASSUME_TIME: str(time.time_ns())})  # fmt: skip
    kube.bind(ns, name, args["poduid"], node)
    log.info("bound %s/%s to %s, GPU %d", ns, name, node, g.index)
    return {"Error": ""}


VERBS = {"/filter": filter_nodes, "/prioritize": prioritize, "/bind": bind}


class Handler(JsonHandler):
    def do_POST(self) -> None:
        verb = VERBS.get(self.path)
        if verb is None:
            self.send_error(404)
            return
        args = lower(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        try:
            body = verb(args)
        except Exception as e:  # the scheduler shows the error; the server goes on
            log.exception("%s failed", self.path)
            body = {"Error": f"gpu-mem-share: {self.path[1:]}: {e}"}
            if self.path == "/prioritize":
                self.send_error(500, str(e))
                return
        self.reply(200, body)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # PID 1 in its container: SIGTERM is ignored unless handled (a delete would wait
    # out the grace period). Nothing to flush: its state is the cluster's.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    port = int(os.environ.get("EXTENDER_PORT", "8888"))
    log.info("serving filter, prioritize and bind on 127.0.0.1:%d", port)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
