"""ResourcePlugin's registration and socket lifecycle, in process against the kubelet
stand-in: the cases a whole plugin process cannot time (a kubelet absent past the warning
deadline, a successor serving beside its predecessor)."""

from __future__ import annotations

import logging
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.config import Config
from plugin.metrics import Metrics
from plugin.server import DevicePluginService, ResourcePlugin, SocketPathError, socket_name
from plugin.state import Device, ResourceState
from standin import Kubelet

R = "gpulab.dev/gpu"


def plugin(directory: Path) -> ResourcePlugin:
    state = ResourceState(R, [Device(f"gpu-{i}") for i in range(2)])
    return ResourcePlugin(DevicePluginService(state, Config(resource=R), Metrics(), None,
                                              Path("/nonexistent")), directory)  # fmt: skip


def test_registration_keeps_trying_past_its_warning_and_serves_again_if_its_socket_went(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No kubelet for longer than the warning deadline, then one that cleans the directory
    (deleting the plugin's socket) as it starts: the plugin still registers, serving again."""
    caplog.set_level(logging.INFO, logger="gpulab-plugin")
    kubelet = Kubelet()
    p = plugin(kubelet.dir)
    p.serve()
    stop, result = threading.Event(), []
    t = threading.Thread(target=lambda: result.append(p.register(stop, warn_after_s=0.2)))
    t.start()
    try:
        time.sleep(1.0)
        assert t.is_alive() and not result, "gave up while the kubelet was away"
        with kubelet:
            t.join(timeout=30)
            assert result == [True]
            res = kubelet.wait_devices(R, 2, timeout=10)
            assert res.registrations == 1
    finally:
        stop.set()
        t.join(timeout=10)
        p.stop()
    assert "still trying" in caplog.text
    assert "is gone, serving again" in caplog.text


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A plugin directory as short as a kubelet's: pytest's tmp paths under xdist leave the
    socket names little room, and none once its run counter reached 100 (pytest-102: these
    tests failed with "AF_UNIX path too long")."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="gp-") as d:
        yield Path(d)


def test_each_start_serves_a_socket_name_of_its_own_and_a_stop_removes_only_its_own(
    short_dir: Path,
) -> None:
    """A new pod beside the old one, or a restart: Kubernetes 1.37 refuses a Register on a
    path whose old stream it has not seen end, so no two starts share a name."""
    old, new = plugin(short_dir), plugin(short_dir)
    old.serve()
    first = old.socket
    new.serve()
    try:
        assert new.socket != old.socket and old.socket.exists() and new.socket.exists()
        old.stop()
        assert not first.exists()
        assert new.socket.exists() and new.socket.stat().st_ino == new.inode
        before = new.socket
        new.stop()
        new.serve()  # the same server started again (a cleared directory): a new name
        assert new.socket.exists() and new.socket != before and not before.exists()
    finally:
        new.stop()
    assert not list(short_dir.glob("*.sock"))


def test_a_start_removes_its_resources_dead_sockets_and_keeps_a_live_predecessors(
    short_dir: Path,
) -> None:
    """A start killed before it could remove its own socket leaves it behind; the next
    start removes it (no process answers on it), not a predecessor still serving, nor
    another resource's or program's socket."""
    dead = short_dir / socket_name(R, "0badc0de")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(dead))  # bound, never listening, its process gone: connect is refused
    others = [short_dir / socket_name("gpulab.dev/rdma", "0badc0de"), short_dir / "kubelet.sock"]
    for o in others:
        o.touch()
    live = plugin(short_dir)
    live.serve()
    successor = plugin(short_dir)
    successor.serve()
    try:
        assert not dead.exists()
        assert live.socket.exists() and successor.socket.exists()
        assert all(o.exists() for o in others)
    finally:
        live.stop()
        successor.stop()


def test_a_socket_path_near_the_unix_limit_is_served() -> None:
    """The scratch name the server binds first is no longer than the socket's own: a path
    that fits the 107-byte limit serves, however long the directory. (A short base: xdist's
    tmp paths alone leave no room for the name.)"""
    with tempfile.TemporaryDirectory(dir="/tmp") as base:
        p = plugin(Path(base))
        deep = Path(base) / ("d" * (105 - len(str(p.socket))))  # the socket's path: 106 bytes
        deep.mkdir()
        p = plugin(deep)
        assert len(str(p.socket)) == 106
        p.serve()
        try:
            assert p.socket.exists() and p.socket.stat().st_ino == p.inode
        finally:
            p.stop()


def test_a_directory_too_long_for_its_sockets_is_refused_before_any_is_made(
    short_dir: Path,
) -> None:
    """A socket path past the 107 bytes cannot be bound, and a connect to one fails as a
    refusal would, so a live predecessor's socket would look dead and be removed: refused
    when the server is made, with the path's length, nothing made."""
    deep = short_dir / ("d" * 100)
    deep.mkdir()
    with pytest.raises(
        SocketPathError, match=r"is 1\d\d bytes; a Unix socket path takes at most 107"
    ):
        plugin(deep)
    assert list(deep.iterdir()) == []


def test_a_stop_wakes_a_wait_for_a_newer_list_at_once() -> None:
    """A stopping server's ListAndWatch stream waits in wait_newer: the stop event, set
    and then woken, ends that wait with nothing changed (the wake alone used to sleep on to
    its timeout, so every stop waited out the server's grace)."""
    state = ResourceState(R, [Device("gpu-0")])
    stop, got = threading.Event(), []
    t = threading.Thread(target=lambda: got.append(state.wait_newer(0, timeout=60, stop=stop)))
    t.start()
    time.sleep(0.2)  # in its wait (were it not yet, the stop is seen on entry all the same)
    stop.set()
    state.wake()
    t.join(timeout=10)
    assert not t.is_alive() and got == [0]
