"""A kubelet stand-in: the device manager's side of the device-plugin API, in one process.

    with Kubelet() as kubelet:                      # serves <dir>/kubelet.sock
        ...start a plugin that registers there...
        kubelet.wait_devices("nvidia.com/gpu", 8)
        got = kubelet.admit("nvidia.com/gpu", 2)     # GetPreferredAllocation + Allocate
        kubelet.restart()                            # wipe sockets, recreate kubelet.sock

It does what the kubelet's device manager does, in the same order: Register dials the
plugin's socket and calls GetDevicePluginOptions before answering, then ListAndWatch runs
in the background and each response replaces the resource's healthy/unhealthy sets. A
stream that ends marks all of that resource's devices unhealthy (the plugin is gone).
Every message in either direction is recorded with its CLOCK_MONOTONIC time, so a test
can line records up with fakenvml's journal (whose records carry the same clock).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message

from plugin.api.v1beta1 import HEALTHY, KUBELET_SOCKET, MAX_SOCKET_PATH, VERSION, load

pb, pb_grpc = load()

T = TypeVar("T")
# The checkpoint is the one file the kubelet keeps when it cleans the directory.
CHECKPOINT = "kubelet_internal_checkpoint"
DIAL_TIMEOUT_S = 10.0  # the kubelet's dial timeout for a plugin socket
RPC_TIMEOUT_S = 10.0


class StandinError(AssertionError):
    """A wait that ran out, or a kubelet-side check that failed; says what was seen."""


@dataclass(frozen=True)
class Record:
    """One message through the stand-in, or one thing it did (a restart, a stream end)."""

    t_ns: int  # time.monotonic_ns() when sent or received
    direction: str  # "recv" plugin -> kubelet, "send" kubelet -> plugin, "event"
    rpc: str  # Register, GetDevicePluginOptions, ListAndWatch, ..., or the event's name
    resource: str
    message: Message | None = None
    error: str = ""

    def body(self) -> str:
        """The message as one line of protobuf text, or the error / event detail."""
        if self.error or self.message is None:
            return self.error
        return text_format.MessageToString(self.message, as_one_line=True)

    def text(self) -> str:
        return f"{self.t_ns / 1e9:.6f} {self.direction:5} {self.rpc} {self.resource} {self.body()}"


@dataclass
class Resource:
    """The device manager's view of one resource, replaced wholesale by each update."""

    name: str
    endpoint: str
    options: Any  # DevicePluginOptions
    registrations: int = 0
    updates: int = 0  # ListAndWatch responses since the stand-in started
    connected: bool = False
    devices: dict[str, Any] = field(default_factory=dict)  # id -> Device, latest list
    healthy: frozenset[str] = frozenset()
    unhealthy: frozenset[str] = frozenset()
    allocated: set[str] = field(default_factory=set)

    def summary(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return (
            f"{self.name}: {len(self.devices)} devices, {len(self.healthy)} healthy, "
            f"{len(self.unhealthy)} unhealthy ({state}, {self.registrations} registrations, "
            f"{self.updates} updates)"
        )


@dataclass
class Admission:
    """What the kubelet did to admit one container asking for `count` devices."""

    devices: list[str]
    preferred: list[str] | None  # None when the plugin has no GetPreferredAllocation
    response: Any  # ContainerAllocateResponse


class _Endpoint:
    """The connection to one registered plugin, and its ListAndWatch reader thread."""

    def __init__(self, kubelet: Kubelet, resource: str, socket: Path) -> None:
        self.kubelet = kubelet
        self.resource = resource
        self.socket = socket
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.closed = False
        self.thread: threading.Thread | None = None

    def connect(self) -> Any:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=DIAL_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise StandinError(
                f"{self.resource}: could not dial the plugin at {self.socket} within "
                f"{DIAL_TIMEOUT_S:.0f}s (does the plugin serve there?)"
            ) from None
        return self.kubelet._call(
            self.resource, "GetDevicePluginOptions", self.stub.GetDevicePluginOptions, pb.Empty()
        )

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._list_and_watch, name=f"ListAndWatch {self.resource}", daemon=True
        )
        self.thread.start()

    def _list_and_watch(self) -> None:
        k = self.kubelet
        k._record("send", "ListAndWatch", self.resource, pb.Empty())
        error = "stream closed by the plugin"
        try:
            for response in self.stub.ListAndWatch(pb.Empty()):
                k._on_list(self, response)
        except grpc.RpcError as e:
            error = f"{e.code().name}: {e.details()}"  # type: ignore[attr-defined]
        except ValueError as e:  # closed (kubelet stopping) before the stream began
            error = str(e)
        k._on_stream_end(self, error)

    def close(self) -> None:
        self.closed = True
        self.channel.close()  # cancels ListAndWatch; the reader thread then ends


class Kubelet:
    """Serves Registration on <dir>/kubelet.sock and drives the plugins that register."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._own_dir = directory is None
        # A short path of our own: unix socket paths are limited to 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="gpulab-dp-") if directory is None else directory)
        self.socket = self.dir / KUBELET_SOCKET
        if len(str(self.dir)) + len("/nvidia-gpu.sock") > MAX_SOCKET_PATH:
            raise StandinError(
                f"device-plugins dir {self.dir} is too long for unix sockets "
                f"({MAX_SOCKET_PATH} bytes with the socket name); use a shorter --dir"
            )
        self.records: list[Record] = []
        self.resources: dict[str, Resource] = {}
        self.restarts = 0
        self._endpoints: dict[str, _Endpoint] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._before_answer: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Clean the directory as the kubelet does, then serve kubelet.sock."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._clean_dir()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        )
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        # gRPC binds, then reads somaxconn, then listens: a plugin that dials as soon as
        # kubelet.sock appears can hit that gap, get ECONNREFUSED and back off for a
        # second (NVIDIA's does, one restart in ~15 here). The kubelet's Go listener
        # has no such gap, so bind under a scratch name and hard-link the listening
        # socket into place: plugins still see IN_CREATE of kubelet.sock, never early.
        scratch = self.dir / f".{KUBELET_SOCKET}.bind"
        server.add_insecure_port(f"unix:{scratch}")
        # Recorded just before the socket appears: "created -> registered" is never
        # short, and no Register can be recorded ahead of it.
        self._record("event", "KubeletStarted", "", error=str(self.socket))
        os.link(scratch, self.socket)
        scratch.unlink()
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (the kubelet going away)."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
            self.socket.unlink(missing_ok=True)  # gRPC removes only the name it bound
        with self._cond:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            if ep.thread is not None and ep.thread.is_alive():
                ep.thread.join(timeout=5)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        """A kubelet restart as plugins see it: connections drop, every socket in the
        directory is deleted, and a new kubelet.sock appears (plugins watch for its
        creation and register again). Until they do, their resources read disconnected
        and all devices unhealthy, as after the kubelet's own restart."""
        own, self._own_dir = self._own_dir, False  # keep the directory through stop()
        self.stop()
        self._own_dir = own
        with self._cond:
            self.restarts += 1
        self._record("event", "KubeletRestart", "", error=f"restart {self.restarts}")
        self.start()

    def _clean_dir(self) -> None:
        for entry in self.dir.iterdir():
            if entry.name == CHECKPOINT:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    # ------------------------------------------------------------------ records

    def _record(
        self,
        direction: str,
        rpc: str,
        resource: str,
        message: Message | None = None,
        error: str = "",
    ) -> Record:
        with self._cond:  # timestamp under the lock, so the list is in time order
            rec = Record(time.monotonic_ns(), direction, rpc, resource, message, error)
            self.records.append(rec)
            self._cond.notify_all()
        return rec

    def next_records(self, cursor: int, timeout: float) -> list[Record]:
        """Records from index `cursor` on, waiting up to `timeout` for at least one."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.records) > cursor, timeout=timeout)
            return self.records[cursor:]

    def _call(
        self,
        resource: str,
        rpc: str,
        method: Callable[..., T],
        request: Message,
        timeout: float = RPC_TIMEOUT_S,
    ) -> T:
        self._record("send", rpc, resource, request)
        try:
            response = method(request, timeout=timeout)
        except grpc.RpcError as e:
            self._record("recv", rpc, resource, error=f"{e.code().name}: {e.details()}")  # type: ignore[attr-defined]
            raise
        self._record("recv", rpc, resource, response)  # type: ignore[arg-type]
        return response

    # ------------------------------------------------------------------ registration

    def _register(self, request: Any) -> None:
        """The kubelet's Register: validate, dial, GetDevicePluginOptions, then answer."""
        name = request.resource_name
        self._record("recv", "Register", name, request)
        if request.version != VERSION:
            raise StandinError(
                f"{name}: plugin speaks device-plugin API {request.version!r}, kubelet {VERSION!r}"
            )
        if "/" not in name or name.startswith("kubernetes.io/"):
            raise StandinError(f"{name!r} is not an extended resource name (domain/name)")
        with self._cond:
            generation = self.restarts
        ep = _Endpoint(self, name, self.dir / request.endpoint)
        options = ep.connect()
        with self._cond:
            if self._server is None or self.restarts != generation:
                # The kubelet stopped while this call dialled the plugin: a stopped
                # kubelet's late handler must not register anything with the new one.
                ep.close()
                raise StandinError(f"{name}: kubelet stopped during registration")
            old = self._endpoints.get(name)
            self._endpoints[name] = ep
            res = self.resources.get(name)
            if res is None:
                res = self.resources[name] = Resource(name, request.endpoint, options)
            res.endpoint, res.options = request.endpoint, options
            res.registrations += 1
            res.connected = True
            self._cond.notify_all()
        if old is not None:
            old.close()  # a plugin that registers again replaces its old endpoint
        ep.start()
        with self._cond:
            action, self._before_answer = self._before_answer, None
        if action is not None:
            action(name)

    def before_next_answer(self, action: Callable[[str], None]) -> None:
        """Run `action(resource)` once, in the next Register, after the kubelet dialled the
        plugin and opened its ListAndWatch but before it answers: the window in which a
        plugin already serves while its own Register call has not returned."""
        with self._cond:
            self._before_answer = action

    def _on_list(self, ep: _Endpoint, response: Any) -> None:
        self._record("recv", "ListAndWatch", ep.resource, response)
        with self._cond:
            if ep.closed:
                return
            res = self.resources[ep.resource]
            res.devices = {d.ID: d for d in response.devices}
            # As the kubelet does: anything but "Healthy" counts as unhealthy.
            res.healthy = frozenset(d.ID for d in response.devices if d.health == HEALTHY)
            res.unhealthy = frozenset(res.devices) - res.healthy
            res.updates += 1
            self._cond.notify_all()

    def _on_stream_end(self, ep: _Endpoint, error: str) -> None:
        self._record("event", "ListAndWatchEnded", ep.resource, error=error)
        with self._cond:
            if self._endpoints.get(ep.resource) is ep:
                del self._endpoints[ep.resource]
            if self._endpoints.get(ep.resource) is None and ep.resource in self.resources:
                res = self.resources[ep.resource]
                res.connected = False
                res.unhealthy = frozenset(res.devices)
                res.healthy = frozenset()
            self._cond.notify_all()
        ep.channel.close()

    # ------------------------------------------------------------------ waits

    def wait_for(
        self,
        check: Callable[[], T | None],
        what: str,
        seen: Callable[[], str],
        timeout: float = 10.0,
    ) -> T:
        """Wait until check() returns something truthy (it runs under the state lock,
        and again after every change); on timeout fail with `what` and `seen()`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = check()
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StandinError(f"waited {timeout:g}s for {what}; last saw {seen()}")
                self._cond.wait(left)

    def _seen(self, resource: str) -> Callable[[], str]:
        def seen() -> str:
            res = self.resources.get(resource)
            if res is None:
                regs = sorted(self.resources) or "none"
                return f"no registration of {resource} (registered: {regs})"
            return res.summary()

        return seen

    def wait_registered(self, resource: str, count: int = 1, timeout: float = 10.0) -> Resource:
        """Wait for the resource's `count`-th registration, with its endpoint connected."""
        return self.wait_for(
            lambda: self._if(resource, lambda r: r.registrations >= count and r.connected),
            f"{resource} to register{'' if count == 1 else f' {count} times'}",
            self._seen(resource),
            timeout,
        )

    def wait_devices(self, resource: str, count: int, timeout: float = 10.0) -> Resource:
        """Wait for a ListAndWatch list of exactly `count` devices."""
        return self.wait_for(
            lambda: self._if(resource, lambda r: r.updates > 0 and len(r.devices) == count),
            f"{resource} to list {count} devices",
            lambda: self._seen_count(resource),
            timeout,
        )

    def _seen_count(self, resource: str) -> str:
        res = self.resources.get(resource)
        return self._seen(resource)() if res is None else f"{len(res.devices)} ({res.summary()})"

    def wait_health(
        self,
        resource: str,
        unhealthy: Iterable[str],
        after: int = 0,
        timeout: float = 10.0,
    ) -> Resource:
        """Wait until the unhealthy set is exactly `unhealthy`, in an update numbered
        above `after` (pass `resource.updates` from before a fault)."""
        want = frozenset(unhealthy)

        def check() -> Resource | None:
            return self._if(resource, lambda r: r.updates > after and r.unhealthy == want)

        def seen() -> str:
            res = self.resources.get(resource)
            if res is None:
                return self._seen(resource)()
            return f"unhealthy {sorted(res.unhealthy)} ({res.summary()})"

        return self.wait_for(check, f"{resource} unhealthy = {sorted(want)}", seen, timeout)

    def wait_update(self, resource: str, after: int, timeout: float = 10.0) -> Resource:
        """Wait for a ListAndWatch response numbered above `after`."""
        return self.wait_for(
            lambda: self._if(resource, lambda r: r.updates > after),
            f"{resource} to send ListAndWatch update #{after + 1}",
            self._seen(resource),
            timeout,
        )

    def _if(self, resource: str, pred: Callable[[Resource], bool]) -> Resource | None:
        res = self.resources.get(resource)
        return _snapshot(res) if res is not None and pred(res) else None

    def resource(self, name: str) -> Resource:
        """A snapshot of the resource as the device manager holds it now."""
        with self._cond:
            res = self.resources.get(name)
            if res is None:
                raise StandinError(self._seen(name)())
            return _snapshot(res)

    def updates(self, resource: str, after_ns: int = 0) -> Iterator[Record]:
        """ListAndWatch responses received for `resource` at or after `after_ns`."""
        with self._cond:
            recs = list(self.records)
        for r in recs:
            is_update = r.rpc == "ListAndWatch" and r.direction == "recv" and r.message
            if is_update and r.resource == resource and r.t_ns >= after_ns:
                yield r

    # ------------------------------------------------------------------ on demand RPCs

    def _stub(self, resource: str) -> Any:
        with self._cond:
            ep = self._endpoints.get(resource)
        if ep is None:
            raise StandinError(f"no connected plugin for {resource}: {self._seen(resource)()}")
        return ep.stub

    def get_preferred_allocation(
        self,
        resource: str,
        available: Iterable[str],
        must_include: Iterable[str] = (),
        size: int = 1,
        timeout: float = RPC_TIMEOUT_S,
    ) -> list[str]:
        stub = self._stub(resource)
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        resp = self._call(
            resource, "GetPreferredAllocation", stub.GetPreferredAllocation, req, timeout
        )
        return list(resp.container_responses[0].deviceIDs)

    def allocate(self, resource: str, device_ids: Iterable[str]) -> Any:
        """Allocate for one container; returns its ContainerAllocateResponse."""
        stub = self._stub(resource)
        req = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        resp = self._call(resource, "Allocate", stub.Allocate, req)
        if len(resp.container_responses) != 1:
            raise StandinError(
                f"{resource}: Allocate for 1 container returned "
                f"{len(resp.container_responses)} container responses"
            )
        return resp.container_responses[0]

    def pre_start_container(self, resource: str, device_ids: Iterable[str]) -> None:
        stub = self._stub(resource)
        req = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        self._call(resource, "PreStartContainer", stub.PreStartContainer, req)

    def admit(self, resource: str, count: int) -> Admission:
        """Admit a container asking for `count` devices, as the device manager does:
        healthy and unallocated devices are available; the plugin's preferred set (when
        it offers one) is taken first, the rest filled in ID order; then Allocate, then
        PreStartContainer if the plugin asked for it. The devices stay allocated until
        release()."""
        with self._cond:
            res = self.resources.get(resource)
            if res is None or not res.connected:
                raise StandinError(f"cannot admit {count} {resource}: {self._seen(resource)()}")
            available = sorted(res.healthy - res.allocated)
            options = res.options
        if len(available) < count:
            raise StandinError(
                f"cannot admit {count} {resource}: only {len(available)} healthy and "
                f"unallocated ({res.summary()}, {len(res.allocated)} allocated)"
            )
        preferred: list[str] | None = None
        chosen: list[str] = []
        if count < len(available) and options.get_preferred_allocation_available:
            preferred = self.get_preferred_allocation(resource, available, (), count)
            chosen = [d for d in dict.fromkeys(preferred) if d in available][:count]
        chosen += [d for d in available if d not in chosen][: count - len(chosen)]
        response = self.allocate(resource, chosen)
        if options.pre_start_required:
            self.pre_start_container(resource, chosen)
        with self._cond:
            self.resources[resource].allocated.update(chosen)
        return Admission(chosen, preferred, response)

    def release(self, resource: str, device_ids: Iterable[str]) -> None:
        with self._cond:
            self.resources[resource].allocated.difference_update(device_ids)


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self.kubelet._register(request)
        except StandinError as e:
            self.kubelet._record("send", "Register", request.resource_name, error=str(e))
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        empty = pb.Empty()
        self.kubelet._record("send", "Register", request.resource_name, empty)
        return empty


def _snapshot(res: Resource) -> Resource:
    return Resource(
        res.name,
        res.endpoint,
        res.options,
        res.registrations,
        res.updates,
        res.connected,
        dict(res.devices),
        res.healthy,
        res.unhealthy,
        set(res.allocated),
    )
