"""A minimal device plugin for testing the stand-in itself: N devices dev-0..dev-N-1,
health set by the test, every call it receives logged in order.

In-process: `FakePlugin(dir, n).start()`; as a command (for the CLI):
`python -m tests.plugin.fake_plugin N` registers at $KUBELET_SOCKET and serves until
SIGTERM.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from plugin.api.v1beta1 import HEALTHY, UNHEALTHY, VERSION, load

pb, pb_grpc = load()
RESOURCE = "example.com/fake"
_END = object()


class FakePlugin(pb_grpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
    def __init__(
        self, directory: Path, count: int, *, pre_start: bool = False, version: str = VERSION
    ) -> None:
        self.dir = directory
        self.endpoint = "fake.sock"
        self.version = version
        self.options = pb.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=True
        )
        self.health = {f"dev-{i}": HEALTHY for i in range(count)}
        self.calls: list[str] = []
        self._streams: list[queue.Queue[object]] = []
        self._server: grpc.Server | None = None

    def start(self) -> FakePlugin:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{self.dir / self.endpoint}")
        self._server.start()
        return self

    def register(self) -> None:
        with grpc.insecure_channel(f"unix:{self.dir / 'kubelet.sock'}") as ch:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(
                    version=self.version,
                    endpoint=self.endpoint,
                    resource_name=RESOURCE,
                    options=self.options,
                ),
                timeout=10,
            )
        self.calls.append("Register returned")

    def stop(self) -> None:
        for q in self._streams:
            q.put(_END)
        if self._server is not None:
            self._server.stop(grace=None).wait()

    def set_health(self, device: str, healthy: bool) -> None:
        self.health[device] = HEALTHY if healthy else UNHEALTHY
        for q in self._streams:
            q.put(self._list())

    def end_streams(self) -> None:
        for q in self._streams:
            q.put(_END)

    def _list(self) -> Any:
        return pb.ListAndWatchResponse(
            devices=[pb.Device(ID=d, health=h) for d, h in self.health.items()]
        )

    # DevicePlugin service
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        self.calls.append("GetDevicePluginOptions")
        return self.options

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        self.calls.append("ListAndWatch")
        q: queue.Queue[object] = queue.Queue()
        self._streams.append(q)
        yield self._list()
        while (item := q.get()) is not _END:
            yield item

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        self.calls.append("GetPreferredAllocation")
        # Prefers the highest-numbered devices, so a test can tell it was used.
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=sorted(r.available_deviceIDs)[-r.allocation_size :]
                )
                for r in request.container_requests
            ]
        )

    def Allocate(self, request: Any, context: Any) -> Any:
        self.calls.append("Allocate")
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"FAKE_DEVICES": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        self.calls.append("PreStartContainer")
        return pb.PreStartContainerResponse()


def main() -> None:
    directory = Path(os.environ["KUBELET_SOCKET"]).parent
    plugin = FakePlugin(directory, int(sys.argv[1])).start()
    plugin.register()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    plugin.stop()


if __name__ == "__main__":
    main()
