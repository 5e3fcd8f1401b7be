"""The container tier of the health monitor: node-problem-detector's image (built by `make
infra`) with gpulab's kernel monitor (clusters/labs/npd.py) follows a fakenvml node's kernel
log (fakenvml/kernlog.py) as its DaemonSet does, its Kubernetes exporter off: what it
counts and reports comes from its own Prometheus endpoint. The cluster tier
(e2e/test_health_monitor.py) shows the same on Nodes and Events."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from clusters import built, steps
from clusters.labs import kindconfig, npd
from fakenvml import inventory
from fakenvml.node import NodeDir

PORT = 20257  # its default, inside the container's own network namespace
SCRAPE = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{PORT}/metrics').read().decode())"


@pytest.fixture
def node(tmp_path: Path) -> NodeDir:
    d = NodeDir(tmp_path / "state")
    d.init(inventory.from_dict({"gpus": [{"profile": "A100-SXM4-80GB", "count": 2}]}, "node-a"))
    return d


Container = docker.models.containers.Container


@pytest.fixture
def start_monitor(tmp_path: Path, node: NodeDir) -> Iterator[Callable[[], Container]]:
    """start() runs node-problem-detector on `node`'s state directory; removed afterwards."""
    try:
        image = built.require(["npd"]).images["npd"]
    except built.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)
    config = tmp_path / "config"
    config.mkdir()
    (config / npd.CONFIG_FILE).write_text(json.dumps(npd.monitor_config()))
    started: list[Container] = []

    def start() -> Container:
        started.append(docker.from_env().containers.run(
            image,
            [f"--config.system-log-monitor=/config/{npd.CONFIG_FILE}",
             "--enable-k8s-exporter=false", "--port=0", f"--prometheus-port={PORT}",
             "--hostname-override=node-a"],
            volumes={str(node.path): {"bind": kindconfig.NODE_STATE_DIR, "mode": "ro"},
                     str(config): {"bind": "/config", "mode": "ro"}},
            detach=True,
        ))  # fmt: skip
        return started[-1]

    yield start
    for c in started:
        c.remove(force=True)


def metrics(c: Container) -> dict[str, float]:
    """problem_counter and problem_gauge samples, by their line's name and labels."""
    res = c.exec_run(["python3", "-c", SCRAPE])
    if res.exit_code != 0:
        return {}
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^(problem_\w+\{[^}]*\}) (\S+)$", res.output.decode(), re.M)}  # fmt: skip


def wait_metrics(c: Container, want: dict[str, float], deadline_s: float = 30) -> dict[str, float]:
    """The metrics once they hold `want` (steps.poll; its error names what it last saw)."""
    seen: dict[str, float] = {}

    def done() -> tuple[bool, str]:
        seen.clear()
        seen.update(metrics(c))
        return all(seen.get(k) == v for k, v in want.items()), str(seen or "no metrics yet")

    steps.poll(f"node-problem-detector's metrics {want}", done, deadline_s)
    return seen


def test_node_problem_detector_counts_the_fake_drivers_xids_from_its_start(
    node: NodeDir, start_monitor: Callable[[], Container]
) -> None:
    node.inject_ecc(0, double=True)  # Xid 48, before the monitor starts: not reported
    time.sleep(1.1)  # in an earlier second than its start
    monitor = start_monitor()
    wait_metrics(monitor, {'problem_gauge{reason="Xid48",type="GPUXidError"}': 0})
    time.sleep(1.1)  # the log's timestamps are whole seconds: after the monitor's start
    node.inject_xid(1, 13)
    node.fall_off_bus(1)
    xid79 = 'problem_gauge{reason="Xid79",type="GPUXidError"}'
    seen = wait_metrics(monitor, {'problem_counter{reason="GPUXid"}': 2, xid79: 1})
    assert seen['problem_counter{reason="Xid48"}'] == 0
    assert seen['problem_gauge{reason="Xid48",type="GPUXidError"}'] == 0
