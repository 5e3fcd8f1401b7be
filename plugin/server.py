"""One resource's DevicePlugin gRPC service on `<dir>/<socket>`, and its registration.

ListAndWatch streams the whole list on start and again on every real change (a version
bump whose list differs from the last one sent); Allocate validates every id; health and
topology come from ResourceState.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from plugin import allocator, mig
from plugin.api.v1beta1 import MAX_SOCKET_PATH
from plugin.api.v1beta1 import api_pb2 as pb
from plugin.api.v1beta1 import api_pb2_grpc as rpc
from plugin.config import Config
from plugin.metrics import Metrics
from plugin.state import Device, ResourceState

log = logging.getLogger("gpulab-plugin")
API_VERSION = "v1beta1"
# Scratch socket names, unique in this process (two resources serve from one process). Short
# and not derived from the socket's name: a Unix socket path has 107 bytes, and a scratch
# name longer than the real one failed to bind where the real one fit (a flaky test under
# pytest-xdist's long tmp paths caught it).
_SCRATCH = itertools.count()
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class SocketPathError(ValueError):
    """The plugin directory is too long for its sockets (MAX_SOCKET_PATH): none could be
    bound, and a live predecessor's would look dead to `_listening`."""


def socket_name(resource: str, start: str) -> str:
    """`gpulab-nvidia.com_gpu-<start>.sock`: each start of a resource's server binds a name
    of its own. Kubernetes 1.37's device manager keeps one endpoint per socket path and
    refuses a Register on a path whose old stream it has not yet seen end ("device plugin
    already connected"), then forgets both clients: a restart on the same name (SIGHUP, a
    new pod beside the old one) could leave the node without the resource until the kubelet
    restarts (docs/labs.md). Kubernetes 1.38's device manager tells plugins to use another
    socket for a new registration."""
    return f"gpulab-{resource.replace('/', '_')}-{start}.sock"


def _listening(path: Path) -> bool:
    """Whether a process still serves on the Unix socket `path` (connect answers)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:  # refused: its server is gone; or the file is gone
            return False
    return True


def env_name(resource: str) -> str:
    """An env var for a counted resource: example.com/rdma -> EXAMPLE_COM_RDMA."""
    return "".join(c if c.isalnum() else "_" for c in resource).upper()


class DevicePluginService(rpc.DevicePluginServicer):
    def __init__(self, state: ResourceState, config: Config, metrics: Metrics,
                 score: Callable[[int, int], int] | None, dev_root: Path) -> None:  # fmt: skip
        self.state = state
        self.config = config
        self.metrics = metrics
        self.score = score
        self.dev_root = dev_root
        self.stopping = threading.Event()

    # -- options and listing

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self.config.pre_start_required,
            get_preferred_allocation_available=self.score is not None,
        )

    def _listing(self) -> tuple[int, pb.ListAndWatchResponse]:
        version, devices = self.state.snapshot()
        out = []
        for d, healthy in devices:
            dev = pb.Device(ID=d.id, health=HEALTHY if healthy else UNHEALTHY)
            if d.numa is not None:
                dev.topology.nodes.append(pb.NUMANode(ID=d.numa))
            out.append(dev)
        return version, pb.ListAndWatchResponse(devices=out)

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        version, listing = self._listing()
        yield listing
        last = listing
        while context.is_active() and not self.stopping.is_set():
            newer = self.state.wait_newer(version, timeout=0.5, stop=self.stopping)
            if newer == version:
                continue
            version, listing = self._listing()
            if listing != last:  # once per real change, never a resend storm
                last = listing
                yield listing

    # -- allocation

    def _check(self, ids: list[str], context: grpc.ServicerContext) -> list[Device]:
        devices = []
        for i in ids:
            d = self.state.by_id.get(i)
            if d is None:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown device {i!r} for resource {self.state.resource}",
                )
            if not self.state.healthy(i):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"device {i!r} is unhealthy ({self.state.reason(i)})",
                )
            devices.append(d)
        return devices

    def _visible(self, devices: list[Device]) -> str:
        ids: dict[str, None] = {}
        for d in devices:
            if d.gpu is None:
                ids[d.id] = None
            else:
                ids[d.id.split("::")[0]] = None  # replicas of one GPU (or slice) name it once
        return ",".join(ids)

    def _container(self, devices: list[Device]) -> pb.ContainerAllocateResponse:
        resp = pb.ContainerAllocateResponse()
        gpus = [d for d in devices if d.gpu is not None]
        if not gpus:
            resp.envs[env_name(self.state.resource)] = self._visible(devices)
            return resp
        resp.envs["NVIDIA_VISIBLE_DEVICES"] = self._visible(devices)
        nodes = [f"nvidia{d.gpu.minor}" for d in gpus if d.gpu]  # device specs where they exist
        if any(d.mig for d in gpus):
            # The driver's root is /dev's parent (a host's /, or a lab's driver root).
            minors = mig.read_mig_minors(self.dev_root.parent)
            nodes += [n for d in gpus if d.mig for n in mig.cap_nodes(d.mig, minors)]
        for name in [*dict.fromkeys(nodes), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            path = self.dev_root / name
            if path.exists():
                spec = pb.DeviceSpec(
                    container_path=f"/dev/{name}", host_path=str(path), permissions="rw"
                )
                resp.devices.append(spec)
        if self.config.cdi:
            for d in dict.fromkeys((g.mig or g.gpu).uuid for g in gpus if g.gpu):
                resp.cdi_devices.append(pb.CDIDevice(name=f"nvidia.com/gpu={d}"))
        return resp

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        for req in request.container_requests:
            devices = self._check(list(req.devices_ids), context)
            out.container_responses.append(self._container(devices))
            self.metrics.allocations.labels(self.state.resource).inc(len(devices))
        return out

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            available = self._check(list(req.available_deviceIDs), context)
            must = self._check(list(req.must_include_deviceIDs), context)
            index = {d.id: n for n, d in enumerate(self.state.devices)}

            def score(a: int, b: int) -> int:
                ga, gb = self.state.devices[a].gpu, self.state.devices[b].gpu
                if ga is None or gb is None or self.score is None:
                    return 0
                if ga.index == gb.index:
                    return -1000  # replicas: spread over GPUs before sharing one
                return self.score(ga.index, gb.index)

            picked = allocator.prefer(
                [index[d.id] for d in available],
                [index[d.id] for d in must],
                req.allocation_size,
                score,
            )
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(
                deviceIDs=[self.state.devices[n].id for n in picked]))  # fmt: skip
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        self._check(list(request.devices_ids), context)  # still healthy at container start
        return pb.PreStartContainerResponse()


class ResourcePlugin:
    """Serve one resource and keep it registered with kubelet."""

    def __init__(self, service: DevicePluginService, plugin_dir: Path) -> None:
        self.service = service
        self.resource = service.state.resource
        self.dir = plugin_dir
        self.socket = self._fresh_socket()
        if (n := len(os.fsencode(self.socket))) > MAX_SOCKET_PATH:
            raise SocketPathError(
                f"{self.socket} is {n} bytes; a Unix socket path takes at "
                f"most {MAX_SOCKET_PATH}: a shorter plugin directory"
            )
        self.server: grpc.Server | None = None
        self.inode = 0  # of the socket this server bound

    def _fresh_socket(self) -> Path:
        return self.dir / socket_name(self.resource, secrets.token_hex(4))

    def _remove_stale_sockets(self) -> None:
        """This resource's sockets that no process serves (a start killed before it could
        remove its own): each start's new name would otherwise leave one behind. A
        predecessor still serving keeps its own until it stops."""
        for old in self.dir.glob(socket_name(self.resource, "*")):
            if old != self.socket and not _listening(old):
                old.unlink(missing_ok=True)

    def serve(self) -> None:
        log.info("Starting GRPC server for '%s'", self.resource)
        if self.inode:  # served before (a restart, a kubelet that cleared the dir)
            self.socket = self._fresh_socket()
        self._remove_stale_sockets()
        self.service.stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        rpc.add_DevicePluginServicer_to_server(self.service, server)
        # Bind a scratch name and link the listening socket into place: the kubelet never
        # dials a socket that is bound but not yet listening, and gRPC's unlink at shutdown
        # hits only the scratch name.
        scratch = self.socket.with_name(f".{os.getpid()}-{next(_SCRATCH)}")
        scratch.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{scratch}")
        server.start()
        self.socket.unlink(missing_ok=True)
        os.link(scratch, self.socket)
        scratch.unlink()
        self.server = server
        self.inode = self.socket.stat().st_ino
        log.info("Starting to serve '%s' on %s", self.resource, self.socket)

    def register(self, stop: threading.Event, warn_after_s: float = 60.0) -> bool:
        """Register with kubelet, retrying with exponential backoff (0.1 s .. 5 s) until it
        answers or `stop`: a plugin that gives up keeps serving while the kubelet never
        lists its devices (its pod stays Ready, its node reads allocatable 0). Past
        `warn_after_s`, each failure is logged as an error. False only when stopped."""
        kubelet = self.dir / "kubelet.sock"
        delay, t0 = 0.1, time.monotonic()
        while not stop.is_set():
            if not self.socket.exists():  # a kubelet started meanwhile and cleared the dir
                log.info("'%s' socket %s is gone, serving again", self.resource, self.socket)
                self.stop()
                self.serve()
            try:
                with grpc.insecure_channel(f"unix://{kubelet}") as channel:
                    # The kubelet dials the plugin back (10 s) before it answers: a shorter
                    # deadline under load would retry into a second registration.
                    rpc.RegistrationStub(channel).Register(pb.RegisterRequest(
                        version=API_VERSION, endpoint=self.socket.name,
                        resource_name=self.resource,
                        options=self.service.GetDevicePluginOptions(pb.Empty(), None),  # type: ignore[arg-type]
                    ), timeout=30)  # fmt: skip
                log.info("Registered device plugin for '%s' with Kubelet", self.resource)
                self.service.metrics.registrations.labels(self.resource).inc()
                return True
            except grpc.RpcError as e:
                if time.monotonic() - t0 > warn_after_s:
                    log.error("Could not register '%s' for %.0fs, still trying: %s",
                              self.resource, time.monotonic() - t0, e.details())  # fmt: skip
                stop.wait(delay)
                delay = min(delay * 2, 5.0)
        return False

    def stop(self) -> None:
        stop_all([self])

    def _begin_stop(self) -> threading.Event | None:
        self.service.stopping.set()
        self.service.state.wake()  # ListAndWatch sees `stopping` now: the grace ends early
        server, self.server = self.server, None
        return server.stop(grace=0.5) if server is not None else None

    def _unlink_own_socket(self) -> None:
        # Only the socket this server bound (a start that found the same name taken,
        # however unlikely, must not remove its holder's).
        try:
            if self.socket.stat().st_ino == self.inode:
                self.socket.unlink()
        except FileNotFoundError:
            pass


def stop_all(plugins: list[ResourcePlugin]) -> None:
    """Stop the resources' servers together: their 0.5 s graces (ListAndWatch streams end
    at their next wake) run side by side, not one after another as each pod's shutdown and
    every restart used to wait."""
    for done in [p._begin_stop() for p in plugins]:
        if done is not None:
            done.wait()
    for p in plugins:
        p._unlink_own_socket()
