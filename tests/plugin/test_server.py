"""ResourcePlugin's registration and socket lifecycle, in process against the kubelet
stand-in: the cases a whole plugin process cannot time (a kubelet absent past the warning
deadline, a successor serving at the same path)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from plugin.config import Config
from plugin.metrics import Metrics
from plugin.server import DevicePluginService, ResourcePlugin
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


def test_stop_leaves_a_successors_socket_at_the_same_path(tmp_path: Path) -> None:
    old, new = plugin(tmp_path), plugin(tmp_path)
    old.serve()
    new.serve()  # unlinks the old path and binds its own
    try:
        old.stop()
        assert new.socket.exists() and new.socket.stat().st_ino == new.inode
    finally:
        new.stop()
    assert not new.socket.exists()


def test_a_socket_path_near_the_unix_limit_is_served(tmp_path: Path) -> None:
    """The scratch name the server binds first is no longer than the socket's own: a path
    that fits the 107-byte limit serves, however long the directory."""
    p = plugin(tmp_path)
    deep = tmp_path / ("d" * (105 - len(str(p.socket))))  # the socket's path: 106 bytes
    deep.mkdir()
    p = plugin(deep)
    assert len(str(p.socket)) == 106
    p.serve()
    try:
        assert p.socket.exists() and p.socket.stat().st_ino == p.inode
    finally:
        p.stop()


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
