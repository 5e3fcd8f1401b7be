"""`gpulab-plugin`: discover GPUs through NVML, serve one DevicePlugin per resource, keep
them registered across kubelet restarts, mark health from NVML events.

    gpulab-plugin [--config plugin.yaml] [--device-plugin-path DIR] [--metrics-port N]

Signals: SIGHUP restarts the plugins (re-discovery, health reset, as NVIDIA's does);
SIGTERM/SIGINT stop them and remove their sockets. Exit 2 on a bad config.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

import pynvml as nv
from inotify_simple import INotify
from inotify_simple import flags as inflags

from plugin import config as cfg
from plugin.devices import Gpu, Topology, discover
from plugin.health import HealthMonitor
from plugin.metrics import Metrics
from plugin.server import DevicePluginService, ResourcePlugin
from plugin.state import Device, ResourceState

log = logging.getLogger("gpulab-plugin")
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")


def gpu_devices(gpus: list[Gpu], conf: cfg.Config) -> list[Device]:
    out = []
    for g in gpus:
        base = g.uuid if conf.device_id_strategy == "uuid" else str(g.index)
        if conf.replicas == 1:
            out.append(Device(base, g))
        else:  # time-slicing ids, NVIDIA's form: <id>::<replica>
            out.extend(Device(f"{base}::{k}", g) for k in range(conf.replicas))
    return out


class Plugins:
    """Everything one start of the plugin owns; SIGHUP tears it down and builds it anew."""

    def __init__(
        self, conf: cfg.Config, plugin_dir: Path, dev_root: Path, metrics: Metrics
    ) -> None:
        gpus = discover()
        log.info("Discovered %d GPUs: %s", len(gpus), ", ".join(g.uuid for g in gpus))
        topology = Topology(gpus)
        self.gpu_state = ResourceState(conf.resource, gpu_devices(gpus, conf))
        states = [self.gpu_state] + [
            ResourceState(name, [Device(f"{name.split('/')[-1]}-{i}") for i in range(count)])
            for name, count in conf.extra_resources.items()
        ]
        self.plugins = []
        for s in states:
            score = topology.score if s is self.gpu_state else None  # counted ones: no topology
            service = DevicePluginService(s, conf, metrics, score, dev_root)
            self.plugins.append(ResourcePlugin(service, plugin_dir))
        self.metrics = metrics
        h = conf.health
        recover = h.policy == "recover"
        self.health = HealthMonitor(
            gpus, cfg.XidPolicy(h), recover, h.double_bit_ecc, self._set_health
        )

    def _set_health(self, gpu: int, healthy: bool, reason: str) -> None:
        for dev_id in self.gpu_state.set_gpu_health(gpu, healthy, reason):
            word = "healthy" if healthy else "unhealthy"
            why = f" ({reason})" if reason else ""
            log.info("'%s' device marked %s: %s%s", self.gpu_state.resource, word, dev_id, why)
            self.metrics.health_transitions.labels(self.gpu_state.resource, word).inc()

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
        for p in self.plugins:
            p.stop()
            p.serve()
        self.register(stop)

    def stop(self) -> None:
        for p in self.plugins:
            p.stop()
        self.health.stop()


def run(conf: cfg.Config, plugin_dir: Path, dev_root: Path, metrics_port: int) -> int:
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
    inotify = INotify()
    # kubelet recreates kubelet.sock on restart and deletes plugin sockets: both mean
    # "register again", as NVIDIA's plugin does on fsnotify Create of kubelet.sock.
    inotify.add_watch(plugin_dir, inflags.CREATE)
    nv.nvmlInit()
    try:
        while not stop.is_set():
            plugins = Plugins(conf, plugin_dir, dev_root, metrics)
            plugins.start(stop)
            restart.clear()
            while not (stop.is_set() or restart.is_set()):
                for event in inotify.read(timeout=200):
                    if event.name == "kubelet.sock":
                        log.info("inotify: %s created, re-registering.", plugin_dir / event.name)
                        reregister.set()
                if reregister.is_set() and not stop.is_set():
                    reregister.clear()
                    plugins.reregister(stop)
            plugins.stop()
    finally:
        nv.nvmlShutdown()
        inotify.close()
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(message)s")  # fmt: skip
    try:
        conf = cfg.load(cfg.config_file(args.config))
        cfg.XidPolicy(conf.health)  # env var errors are config errors too
    except cfg.ConfigError as e:
        print(f"gpulab-plugin: error: {e}", file=sys.stderr)
        return 2
    if not args.device_plugin_path.is_dir():
        where = args.device_plugin_path
        print(f"gpulab-plugin: error: {where} is not a directory", file=sys.stderr)
        return 2
    try:
        return run(conf, args.device_plugin_path, args.dev_root, args.metrics_port)
    except nv.NVMLError as e:
        log.error("Failed to initialize NVML: %s", e)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
