"""gpu-mem-share's device plugin: each GPU's memory in units (GPU_SHARE_UNIT_MIB, 1024 by
default) as devices of example.com/gpu-mem, whose ids name no GPU (`unit-<n>`). Which GPU
a container gets is its scheduler's choice: Allocate finds the pending pod on this node that
the extender annotated for that many units and hands the container that GPU's index in
NVIDIA_VISIBLE_DEVICES (the NVIDIA runtime then gives it the GPU's device node). It
publishes its GPUs and their health in a node annotation the extender reads, and marks a
GPU's units Unhealthy for good on an Xid (NVIDIA's harmless ones aside).

GPU_SHARE_IGNORE_SCHEDULER=1 is a deliberately broken variant: every container gets GPU
0 whatever its scheduler chose (what the suites' scheduler-choice scenario must catch).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pynvml
from share import (
    ASSIGNED,
    ASSUME_TIME,
    GPU_INDEX,
    NODE_GPUS,
    RESOURCE,
    Gpu,
    Kube,
    format_gpus,
    requested,
)

from plugin.api.v1beta1 import load

pb2, pb2_grpc = load()
log = logging.getLogger("gpu-mem-share")

PLUGINS = Path("/var/lib/kubelet/device-plugins")
SOCKET = "gpu-mem-share.sock"
# NVIDIA's default list of Xids that leave a GPU healthy (application errors).
HARMLESS_XIDS = {13, 31, 43, 45, 68, 109}


class Plugin(pb2_grpc.DevicePluginServicer):
    def __init__(self, node: str, unit_mib: int, ignore_scheduler: bool) -> None:
        self.node, self.unit_mib, self.ignore = node, unit_mib, ignore_scheduler
        self.kube = Kube()
        self.handles = []
        self.gpus: list[Gpu] = []
        self.owner: list[int] = []  # unit n -> its GPU's index
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            units = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024) // unit_mib
            self.handles.append(h)
            self.gpus.append(Gpu(i, units, True))
            self.owner += [i] * units
        self.changed = threading.Condition()
        self.version = 0
        self.allocating = threading.Lock()  # one choice taken at a time

    # -- health

    def publish(self) -> None:
        self.kube.annotate_node(self.node, {NODE_GPUS: format_gpus(self.gpus)})

    def mark_unhealthy(self, index: int) -> None:
        with self.changed:
            self.gpus[index] = Gpu(index, self.gpus[index].units, False)
            self.version += 1
            self.changed.notify_all()
        self.publish()

    def watch_xids(self) -> None:
        events = pynvml.nvmlEventSetCreate()
        for h in self.handles:
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
        uuids = {pynvml.nvmlDeviceGetUUID(h): i for i, h in enumerate(self.handles)}
        while True:
            try:
                e = pynvml.nvmlEventSetWait_v2(events, 5000)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as err:
                log.warning("event wait: %s; waiting again", err)
                time.sleep(1)
                continue
            xid, index = e.eventData, uuids.get(pynvml.nvmlDeviceGetUUID(e.device))
            if index is None or xid in HARMLESS_XIDS:
                log.info("Xid %d on GPU %s: ignored", xid, index)
                continue
            log.info("Xid %d on GPU %d: its %d units Unhealthy", xid, index,
                     self.gpus[index].units)  # fmt: skip
            self.mark_unhealthy(index)

    # -- the device plugin API

    def devices(self) -> list:
        health = {g.index: g.healthy for g in self.gpus}
        return [pb2.Device(ID=f"unit-{n}", health="Healthy" if health[i] else "Unhealthy")
                for n, i in enumerate(self.owner)]  # fmt: skip

    def GetDevicePluginOptions(self, request, context):
        return pb2.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        seen = -1
        while context.is_active():
            with self.changed:
                if seen == self.version:
                    self.changed.wait(timeout=5)
                if seen == self.version:
                    continue
                seen = self.version
            yield pb2.ListAndWatchResponse(devices=self.devices())

    def Allocate(self, request, context):
        out = pb2.AllocateResponse()
        for req in request.container_requests:
            units = len(req.devices_ids)
            try:
                index = self.choice(units)
            except LookupError as e:
                log.warning("Allocate of %d units refused: %s", units, e)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            log.info("Allocate: %d units on GPU %d", units, index)
            out.container_responses.append(pb2.ContainerAllocateResponse(envs={
                "NVIDIA_VISIBLE_DEVICES": str(index),
                "GPU_MEM_SHARE_LIMIT_MIB": str(units * self.unit_mib),
            }))  # fmt: skip
        return out

    def choice(self, units: int) -> int:
        """The GPU the scheduler chose for the oldest pod here asking `units` and not yet
        started, marked used; LookupError when there is none (a pod that did not go
        through the scheduler)."""
        with self.allocating:
            for _ in range(10):  # the extender annotates before it binds; allow for lag
                pods = [p for p in self.kube.pods_on(self.node)
                        if p.get("status", {}).get("phase") == "Pending"
                        and (p["metadata"].get("annotations") or {}).get(ASSIGNED) == "false"
                        and requested(p) == units]  # fmt: skip
                if pods:
                    pod = min(pods, key=lambda p: int(p["metadata"]["annotations"][ASSUME_TIME]))
                    meta = pod["metadata"]
                    self.kube.annotate_pod(meta["namespace"], meta["name"], {ASSIGNED: "true"})
                    return 0 if self.ignore else int(meta["annotations"][GPU_INDEX])
                time.sleep(0.3)
        raise LookupError(f"no pod pending on {self.node} asks for {units} units of "
                          f"{RESOURCE} with a GPU its scheduler chose (annotation "
                          f"{GPU_INDEX}): was it scheduled by gpu-mem-share's "
                          "scheduler?")  # fmt: skip

    def GetPreferredAllocation(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no preferred allocation")

    def PreStartContainer(self, request, context):
        return pb2.PreStartContainerResponse()


def register() -> None:
    with grpc.insecure_channel(f"unix://{PLUGINS / 'kubelet.sock'}") as ch:
        pb2_grpc.RegistrationStub(ch).Register(pb2.RegisterRequest(
            version="v1beta1", endpoint=SOCKET, resource_name=RESOURCE,
            options=pb2.DevicePluginOptions()), timeout=10)  # fmt: skip


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    # PID 1 in its container: SIGTERM is ignored unless handled (a delete would wait
    # out the grace period). Nothing to flush: its state is the cluster's.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    pynvml.nvmlInit()
    plugin = Plugin(os.environ["NODE_NAME"], int(os.environ.get("GPU_SHARE_UNIT_MIB", "1024")),
                    os.environ.get("GPU_SHARE_IGNORE_SCHEDULER") == "1")  # fmt: skip
    if plugin.ignore:
        log.warning("GPU_SHARE_IGNORE_SCHEDULER=1: every container gets GPU 0 (broken on purpose)")
    plugin.publish()
    threading.Thread(target=plugin.watch_xids, daemon=True).start()
    sock = PLUGINS / SOCKET
    sock.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    kubelet = PLUGINS / "kubelet.sock"
    registered_to = None
    while True:  # register again whenever the kubelet's socket is new (a kubelet restart)
        try:
            now = kubelet.stat().st_ino
        except FileNotFoundError:
            now = None
        if now is not None and now != registered_to:
            try:
                register()
                registered_to = now
                log.info("registered %s with kubelet: serving %d units on %d GPUs",
                         RESOURCE, len(plugin.owner), len(plugin.gpus))  # fmt: skip
            except grpc.RpcError as e:
                log.warning("registration failed: %s; trying again", e.code())
        if not sock.exists():  # the kubelet removes plugin sockets when it restarts
            os._exit(1)  # the DaemonSet starts a fresh one
        time.sleep(1)


if __name__ == "__main__":
    main()
