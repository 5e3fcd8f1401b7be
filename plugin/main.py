"""`gpulab-plugin`: discover GPUs through NVML, serve one DevicePlugin per resource, keep
them registered across kubelet restarts, mark health from NVML events.

    gpulab-plugin [--config plugin.yaml] [--device-plugin-path DIR] [--metrics-port N]
                  [--wait-for-nvml SECONDS]

Signals: SIGHUP restarts the plugins (re-discovery, health reset, as NVIDIA's does);
SIGTERM/SIGINT stop them and remove their sockets. Exit 2 on a bad config.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import pynvml as nv
from inotify_simple import INotify
from inotify_simple import flags as inflags

from plugin import config as cfg
from plugin import mig
from plugin.devices import Gpu, Topology, discover
from plugin.health import HealthMonitor
from plugin.metrics import Metrics
from plugin.mig import MigDevice
from plugin.server import DevicePluginService, ResourcePlugin, SocketPathError, stop_all
from plugin.state import ANY, Device, ResourceState

log = logging.getLogger("gpulab-plugin")
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
NVML_SONAME = "libnvidia-ml.so.1"  # what nvidia-ml-py dlopens


def gpu_devices(members: list[Gpu | MigDevice], conf: cfg.Config) -> list[Device]:
    """A resource's device ids: NVIDIA's forms (UUID or index; `<gpu>:<mig index>` for a
    MIG device by index), each `<id>::<k>` when time-sliced."""
    out = []
    for m in members:
        gpu, mig = (m.parent, m) if isinstance(m, MigDevice) else (m, None)
        if conf.device_id_strategy == "uuid":
            base = (mig or gpu).uuid
        else:
            base = f"{gpu.index}:{mig.index}" if mig else str(gpu.index)
        if conf.replicas == 1:
            out.append(Device(base, gpu, mig))
        else:  # time-slicing ids, NVIDIA's form: <id>::<replica>
            out.extend(Device(f"{base}::{k}", gpu, mig) for k in range(conf.replicas))
    return out


class Plugins:
    """Everything one start of the plugin owns; SIGHUP tears it down and builds it anew."""

    def __init__(
        self, conf: cfg.Config, plugin_dir: Path, dev_root: Path, metrics: Metrics
    ) -> None:
        gpus = discover()
        log.info("Discovered %d GPUs: %s", len(gpus), ", ".join(g.uuid for g in gpus))
        topology = Topology(gpus)
        resources = mig.plan(conf.mig_strategy, gpus, conf.resource)
        self.gpu_states = [ResourceState(n, gpu_devices(m, conf)) for n, m in resources.items()]
        for s in self.gpu_states:
            if s.devices and s.devices[0].mig:
                log.info("MIG resource %s: %s", s.resource, ", ".join(d.id for d in s.devices))
        states = self.gpu_states + [
            ResourceState(name, [Device(f"{name.split('/')[-1]}-{i}") for i in range(count)])
            for name, count in conf.extra_resources.items()
        ]
        self.plugins = []
        for s in states:
            # Topology scores whole GPUs; MIG slices and counted resources get none.
            whole = s in self.gpu_states and not any(d.mig for d in s.devices)
            service = DevicePluginService(s, conf, metrics, topology.score if whole else None,
                                          dev_root)  # fmt: skip
            self.plugins.append(ResourcePlugin(service, plugin_dir))
        self.metrics = metrics
        h = conf.health
        recover = h.policy == "recover"
        self.health = HealthMonitor(
            gpus, cfg.XidPolicy(h), recover, h.double_bit_ecc, self._set_health
        )

    def _set_health(self, gpu: int, healthy: bool, reason: str, gi: int = ANY,
                    ci: int = ANY) -> None:  # fmt: skip
        word = "healthy" if healthy else "unhealthy"
        why = f" ({reason})" if reason else ""
        for state in self.gpu_states:
            for dev_id in state.set_gpu_health(gpu, healthy, reason, gi, ci):
                log.info("'%s' device marked %s: %s%s", state.resource, word, dev_id, why)
                self.metrics.health_transitions.labels(state.resource, word).inc()

    def start(self, stop: threading.Event) -> None:
        self.health.start()
        for p in self.plugins:
            p.serve()
        self.register(stop)

    def register(self, stop: threading.Event) -> None:
        for p in self.plugins:
            p.register(stop)

    def reregister(self, stop: threading.Event) -> None:
        """kubelet restarted: serve again and register, keeping every device's health."""
        stop_all(self.plugins)
        for p in self.plugins:
            p.serve()
        self.register(stop)

    def stop(self, join_health: bool = True) -> None:
        # All at once: the health thread's NVML wait and the servers' graces overlap.
        self.health.stop(wait=False)
        stop_all(self.plugins)
        if join_health:
            self.health.stop()


def _driver_library() -> Path | None:
    """libnvidia-ml.so.1 in a directory of $LD_LIBRARY_PATH, where the driver's pod puts it."""
    for d in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        if (lib := Path(d) / NVML_SONAME).exists():
            return lib
    return None


def init_nvml(wait_s: float, stop: threading.Event) -> bool:
    """nvmlInit, waiting up to `wait_s` for the driver's library to appear: a plugin pod
    may start before the driver's. The plugin waits itself rather than behind an init
    container, whose exit the kubelet notices only at its next relist (up to 1 s): that
    wait came back in every restart of the pod. False when a stop came first.

    A library that appears later is loaded by its path: glibc remembers a search directory
    that did not exist at its first dlopen and never looks there again, so NVML's dlopen by
    name would go on failing; once loaded, that dlopen finds it by its soname."""
    deadline = time.monotonic() + wait_s
    told = loaded = False
    while True:
        try:
            nv.nvmlInit()
            return True
        except nv.NVMLError_LibraryNotFound:
            if not loaded and (lib := _driver_library()) is not None:
                with contextlib.suppress(OSError):  # still being written: the next round
                    ctypes.CDLL(str(lib))
                    loaded = True
                    continue
            if time.monotonic() >= deadline:
                raise
            if not told:
                log.info("No libnvidia-ml.so.1 yet; waiting up to %gs for the driver.", wait_s)
                told = True
        if stop.wait(0.1):
            return False


def run(
    conf: cfg.Config, plugin_dir: Path, dev_root: Path, metrics_port: int, nvml_wait: float = 0
) -> int:
    metrics = Metrics()
    if metrics_port:
        metrics.serve(metrics_port)
    stop, restart, reregister = threading.Event(), threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("Received signal \"%s\", %s.", signal.Signals(signum).name,
                 "restarting" if signum == signal.SIGHUP else "shutting down")  # fmt: skip
        (restart if signum == signal.SIGHUP else stop).set()

    for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    if not init_nvml(nvml_wait, stop):
        return 0
    # A signal wakes the main loop at once: Python writes its number here, and select()
    # returns. A wait it merely interrupts is retried to its timeout (PEP 475), which
    # made every stop of the plugin up to 200 ms later.
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    inotify = INotify()
    # kubelet recreates kubelet.sock on restart and deletes plugin sockets: both mean
    # "register again", as NVIDIA's plugin does on fsnotify Create of kubelet.sock.
    inotify.add_watch(plugin_dir, inflags.CREATE)
    try:
        while not stop.is_set():
            # Cleared before the start, never after: a SIGHUP that lands while this start
            # registers (the kubelet lists devices before Register returns) must restart
            # again, not be wiped (it was, once in a CI run).
            restart.clear()
            plugins = Plugins(conf, plugin_dir, dev_root, metrics)
            plugins.start(stop)
            while not (stop.is_set() or restart.is_set()):
                select.select([inotify.fd, woken], [], [])
                with contextlib.suppress(BlockingIOError):
                    os.read(woken, 64)
                for event in inotify.read(timeout=0):
                    if event.name == "kubelet.sock":
                        log.info("inotify: %s created, re-registering.", plugin_dir / event.name)
                        reregister.set()
                if reregister.is_set() and not stop.is_set():
                    reregister.clear()
                    plugins.reregister(stop)
            # A restart joins the old health thread (the new one must be the only one
            # marking devices); an exit does not wait out its NVML wait (up to WAIT_MS,
            # most of a stop's time): it is a daemon holding its own nvmlInit, and the
            # library counts them, so the shutdown below leaves its calls working.
            plugins.stop(join_health=not stop.is_set())
    finally:
        nv.nvmlShutdown()
        inotify.close()
        signal.set_wakeup_fd(-1)
        os.close(woken)
        os.close(wake)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpulab-plugin", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config",
        type=Path,
        help="a YAML file, or a directory holding <NODE_NAME>.yaml or default.yaml",
    )
    ap.add_argument("--device-plugin-path", type=Path, default=DEFAULT_DIR)
    ap.add_argument(
        "--dev-root",
        type=Path,
        default=Path("/dev"),
        help="where /dev/nvidiaN appear (device specs are returned when they exist)",
    )
    ap.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: off)")
    ap.add_argument(
        "--wait-for-nvml",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait this long for libnvidia-ml.so.1 to appear before failing (0: fail at once)",
    )
    ap.add_argument(
        "--mig-strategy",
        choices=mig.STRATEGIES,
        default=os.environ.get("MIG_STRATEGY") or None,
        help="none | single | mixed (NVIDIA's flag and $MIG_STRATEGY; overrides the config)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(message)s")  # fmt: skip
    try:
        conf = cfg.load(cfg.config_file(args.config))
        if args.mig_strategy:
            if args.mig_strategy not in mig.STRATEGIES:  # from $MIG_STRATEGY: not parsed
                raise cfg.ConfigError(f"MIG_STRATEGY: {args.mig_strategy!r} is not one of "
                                      f"{', '.join(mig.STRATEGIES)}")  # fmt: skip
            conf = conf.model_copy(update={"mig_strategy": args.mig_strategy})
        cfg.XidPolicy(conf.health)  # env var errors are config errors too
    except cfg.ConfigError as e:
        print(f"gpulab-plugin: error: {e}", file=sys.stderr)
        return 2
    if not args.device_plugin_path.is_dir():
        where = args.device_plugin_path
        print(f"gpulab-plugin: error: {where} is not a directory", file=sys.stderr)
        return 2
    try:
        return run(conf, args.device_plugin_path, args.dev_root, args.metrics_port,
                   args.wait_for_nvml)  # fmt: skip
    except nv.NVMLError as e:
        log.error("Failed to initialize NVML: %s", e)
        return 1
    except mig.MigConfigError as e:
        log.error("Invalid MIG configuration: %s", e)
        return 1
    except SocketPathError as e:  # before any socket was made
        print(f"gpulab-plugin: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
