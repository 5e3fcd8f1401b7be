"""`gpulab standin`: run a device plugin against the kubelet stand-in, by hand.

    gpulab standin -- gpulab-plugin --config my.yaml
    gpulab standin --nvidia v0.19.3 --state /tmp/node-a --allocate nvidia.com/gpu=2
    FAKENVML_STATE_DIR=/tmp/node-a gpulab standin --private-mount -- ./nvidia-device-plugin

Serves Registration on <dir>/kubelet.sock, starts the plugin command with KUBELET_SOCKET
set to it, and prints each registration and ListAndWatch update as it comes. Each
--allocate RESOURCE=N admits a container once that resource lists N devices, as the
kubelet would (GetPreferredAllocation, Allocate, PreStartContainer). Ctrl-C stops both;
--exit-after-allocate stops once every --allocate is done. Exit status: the plugin's if it
exits first, 1 if an allocation fails, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import grpc

from standin import nvidia
from standin.kubelet import Kubelet, Record, StandinError
from standin.process import PluginProcess, in_private_mount, kubelet_env


def _allocation(text: str) -> tuple[str, int]:
    name, sep, count = text.rpartition("=")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"expected RESOURCE=COUNT (e.g. nvidia.com/gpu=2), not {text!r}"
        )
    return name, int(count)


def parse_args(argv: Sequence[str] | None, prog: str = "gpulab standin") -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    # fmt: off
    add = ap.add_argument
    add("--dir", type=Path,
        help="device-plugins dir, emptied at start as the kubelet does (default: a new temp dir)")
    add("--allocate", type=_allocation, action="append", default=[], metavar="RESOURCE=N",
        help="admit a container asking for N devices (repeatable)")
    add("--exit-after-allocate", action="store_true", help="stop once every --allocate is done")
    add("--private-mount", action="store_true",
        help="run the plugin in a private mount namespace with --dir bind-mounted at "
        "/var/lib/kubelet/device-plugins (for plugins that hardcode it; needs root)")
    add("--nvidia", metavar="VERSION",
        help="run NVIDIA's plugin VERSION (built on first use) over fakenvml")
    add("--state", type=Path, help="fakenvml state dir for --nvidia (default: $FAKENVML_STATE_DIR)")
    add("--timeout", type=float, default=30.0,
        help="seconds to wait for a registration or device count (default 30)")
    add("--plugin-log", type=Path, help="write the plugin's output here, not to the terminal")
    add("command", nargs=argparse.REMAINDER, help="-- plugin command and arguments")
    # fmt: on
    args = ap.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if bool(args.command) == bool(args.nvidia):
        ap.error("give either a plugin command after -- or --nvidia VERSION")
    if args.nvidia and not (args.state or os.environ.get("FAKENVML_STATE_DIR")):
        ap.error("--nvidia needs a fakenvml node: --state DIR or $FAKENVML_STATE_DIR")
    return args


def _print(rec: Record) -> None:
    """One line per registration, update or event; the raw messages for the rest."""
    t = f"{rec.t_ns / 1e9:12.6f}"
    if rec.rpc == "ListAndWatch" and rec.direction == "recv" and rec.message is not None:
        devices = list(rec.message.devices)  # type: ignore[attr-defined]
        sick = [d.ID for d in devices if d.health != "Healthy"]
        print(f"{t} ListAndWatch {rec.resource}: {len(devices)} devices, "
              f"{len(devices) - len(sick)} healthy, unhealthy: {sick or 'none'}")  # fmt: skip
    elif rec.direction == "event":
        print(f"{t} {rec.rpc} {rec.resource} {rec.error}".rstrip())
    elif rec.direction == "recv":
        print(f"{t} {rec.rpc} {rec.resource}: {rec.body()}")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None, prog: str = "gpulab standin") -> int:
    args = parse_args(argv, prog)
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    with Kubelet(args.dir) as kubelet, tempfile.TemporaryDirectory(prefix="gpulab-") as work:
        print(f"kubelet stand-in serving {kubelet.socket}", flush=True)
        if args.nvidia:
            state = args.state or Path(os.environ["FAKENVML_STATE_DIR"])
            cmd, env = nvidia.command(args.nvidia, kubelet.dir, state.resolve(), Path(work))
        else:
            cmd, env = args.command, {**os.environ, **kubelet_env(kubelet.dir)}
            if args.private_mount:
                cmd = in_private_mount(kubelet.dir, cmd)
        with PluginProcess(cmd, env, args.plugin_log) as plugin:
            return _run(args, kubelet, plugin, lambda: stop)


def _run(
    args: argparse.Namespace, kubelet: Kubelet, plugin: PluginProcess, stopped: Callable[[], bool]
) -> int:
    pending = list(args.allocate)
    cursor, rc = 0, 0
    started = time.monotonic()

    def drain(timeout: float) -> None:
        nonlocal cursor
        for rec in kubelet.next_records(cursor, timeout=timeout):
            _print(rec)
            cursor += 1

    while not stopped():
        drain(0.2)
        if (code := plugin.poll()) is not None:
            print(f"plugin exited with status {code}", file=sys.stderr)
            return code or 1
        for want in list(pending):
            name, count = want
            res = kubelet.resources.get(name)
            if res is None or len(res.healthy) < count:
                if time.monotonic() - started > args.timeout:
                    print(f"error: waited {args.timeout:g}s for {name} to list {count} healthy "
                          f"devices; last saw {res.summary() if res else 'no registration'}",
                          file=sys.stderr)  # fmt: skip
                    return 1
                continue
            pending.remove(want)
            try:
                got = kubelet.admit(name, count)
            except (StandinError, grpc.RpcError) as e:  # a result to show, not a crash
                print(f"error: allocate {count} {name}: {e}", file=sys.stderr)
                rc = 1
                continue
            drain(0)
            envs = dict(got.response.envs)
            print(f"allocated {name} x{count}: {got.devices} (preferred {got.preferred})")
            for key, value in sorted(envs.items()):
                print(f"  env {key}={value}")
            for m in got.response.mounts:
                print(f"  mount {m.host_path} -> {m.container_path}")
            for d in got.response.devices:
                print(f"  device {d.host_path} -> {d.container_path} ({d.permissions})")
            for c in got.response.cdi_devices:
                print(f"  cdi {c.name}")
        if args.exit_after_allocate and args.allocate and not pending:
            drain(0)
            return rc
    return rc
