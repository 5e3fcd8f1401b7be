"""A plugin under test as a child process: started with a kubelet-like environment, its
output kept in a log file, stopped with SIGTERM (then SIGKILL) when done."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from plugin.api.v1beta1 import DEVICE_PLUGIN_PATH, KUBELET_SOCKET

# Where a plugin that hardcodes the kubelet's path (NVIDIA's does) puts its socket.
DEFAULT_DIR = DEVICE_PLUGIN_PATH.rstrip("/")
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.002  # between looks at /proc while waiting
# poll(2) by syscall number; on arm64 glibc implements it with ppoll.
SYS_POLL = {"x86_64": "7", "aarch64": "73"}.get(os.uname().machine, "7")


def kubelet_env(directory: Path) -> dict[str, str]:
    """What tells a plugin where the kubelet is: KUBELET_SOCKET is the variable NVIDIA's
    plugin reads for its --kubelet-socket flag; its directory is the device-plugins dir."""
    return {"KUBELET_SOCKET": str(directory / KUBELET_SOCKET)}


def in_private_mount(
    directory: Path, argv: Sequence[str], proc_driver: Path | None = None
) -> list[str]:
    """argv run in a private mount namespace where `directory` is bind-mounted over the
    kubelet's default device-plugins dir, for plugins that cannot be pointed elsewhere.
    Sockets and inotify events pass through a bind mount, so the stand-in sees both.
    `proc_driver` (a fake driver root's proc/driver) is bind-mounted over /proc/driver,
    where NVIDIA's plugin reads the MIG capability minors; the host's /proc is untouched.
    Needs root (CAP_SYS_ADMIN); the empty mount point is created on the host if missing."""
    script = 'mkdir -p "$1" && mount --bind "$2" "$1" && shift 2 && '
    if proc_driver is not None:
        script += f"mount --bind {shlex.quote(str(proc_driver))} /proc/driver && "
    return [
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", script + 'exec "$@"', "sh", DEFAULT_DIR, str(directory), *argv,
    ]  # fmt: skip


class PluginProcess:
    """`with PluginProcess(argv, env, log) as p:` runs argv until the block ends."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path | None = None,
        *,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def __enter__(self) -> PluginProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        out: IO[bytes] | int | None = None
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = out = self.log.open("ab")
        argv = self.argv
        if shutil.which("setpriv"):
            # Dies with us: a harness killed mid-test must not leave a plugin behind
            # (the parent-death signal survives the exec chain unshare -> sh -> plugin).
            argv = ["setpriv", "--pdeathsig", "KILL", *argv]
        try:
            # A session of its own, so SIGTERM/SIGKILL reach the plugin and any children.
            self.proc = subprocess.Popen(
                argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
            )  # fmt: skip
        except FileNotFoundError as e:
            raise FileNotFoundError(f"cannot start plugin {self.argv[0]!r}: {e.strerror}") from e

    @property
    def pid(self) -> int:
        assert self.proc is not None, "plugin not started"
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code once the plugin has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def wait_exit(self, timeout: float = 10.0) -> int:
        """Its exit code once it has exited by itself (TimeoutExpired past `timeout`)."""
        assert self.proc is not None, "plugin not started"
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        rc = None
        if self.proc is not None:
            self.signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                rc = self.proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return rc

    def wait_event_wait(self, timeout: float = 10.0) -> None:
        """Wait until one of the plugin's threads is blocked in poll(2), which is where
        fakenvml's nvmlEventSetWait blocks; a Go plugin makes no other poll(2) calls (its
        runtime uses epoll). fakenvml delivers a device's events only from the moment it
        was registered, so a fault injected before this point is missed, as on real
        hardware; after it, the health loop has registered its devices and is waiting."""
        deadline = time.monotonic() + timeout
        while not self._in_poll():
            if self.poll() is not None:
                raise RuntimeError(f"plugin exited ({self.poll()}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {timeout:g}s for plugin {self.pid} to block in nvmlEventSetWait "
                    f"(a thread in poll(2)); its threads are in syscalls {self._syscalls()}"
                )
            time.sleep(POLL_INTERVAL_S)

    def wait_log(self, text: str, timeout: float = 10.0) -> None:
        """Wait until the plugin's log contains `text` (a readiness line it prints)."""
        deadline = time.monotonic() + timeout
        while self.log is None or text not in self.log.read_text(errors="replace"):
            if self.poll() is not None:
                raise RuntimeError(f"plugin exited ({self.poll()}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g}s for {text!r} in the plugin's log:\n"
                                   f"{self.log_tail()}")  # fmt: skip
            time.sleep(POLL_INTERVAL_S)

    def _syscalls(self) -> list[str]:
        nrs = []
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            try:
                nrs.append((task / "syscall").read_text().split(" ", 1)[0])
            except OSError:
                continue  # the thread ended
        return nrs

    def _in_poll(self) -> bool:
        return SYS_POLL in self._syscalls()

    def log_tail(self, lines: int = 40) -> str:
        if self.log is None or not self.log.exists():
            return "(no log)"
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])
