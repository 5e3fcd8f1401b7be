"""Kubernetes' own scheduler_perf DRA benchmark, run beside gpulab's fleet by `make
bench-scale` so that the ratio between the two on one machine is a measured figure.

`test/integration/scheduler_perf/dra` of k8s.io/kubernetes at the labs' version, built as a
test binary from the Go module proxy (clusters/infra/nodeimage/build-go.sh scheduler-perf,
cached) and run as its README runs it (`-bench=BenchmarkPerfScheduling/<case>/<workload>
-benchtime=1x`): an API server and a scheduler in one process on an etcd of their own, no
kubelet, no KWOK, nodes and ResourceSlices written by the harness (10 devices a node). Its
SchedulingThroughput (pods/s, sampled each second while the measured pods are scheduled)
comes from the data items it writes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from clusters import steps, versions

BUILD = Path(__file__).resolve().parent.parent / "clusters/infra/nodeimage/build-go.sh"
# 500 nodes x 10 devices, 2,500 claims allocated before and 2,500 pods (one claim each from
# a template) measured until the nodes are full; Kubernetes' CI holds it above 56 pods/s
# ("typically above 70", its performance-config.yaml).
WORKLOAD = "SchedulingWithResourceClaimTemplate/5000pods_500nodes"
NODES = 500  # the workload's fake nodes: gpulab's fleet of that size goes beside it
METRIC = "SchedulingThroughput"


def build() -> Path:
    """The test binary's directory (built when not yet; its progress on stderr)."""
    env = {**os.environ, "GPULAB_KUBE_VERSION": versions.kube_version()}
    done = subprocess.run(["bash", str(BUILD), "scheduler-perf"], env=env, check=False,
                          stdout=subprocess.PIPE, text=True)  # fmt: skip
    if done.returncode != 0:
        raise steps.StepError(f"building scheduler_perf failed ({BUILD.name} scheduler-perf "
                              f"exited {done.returncode})")  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def throughput(items: dict, workload: str = WORKLOAD) -> dict[str, float]:
    """The SchedulingThroughput data item of `workload` (Average, Perc50 ... in pods/s)."""
    for item in items.get("dataItems") or []:
        labels = item.get("labels") or {}
        if labels.get("Metric") == METRIC and workload in labels.get("Name", ""):
            return {k: float(v) for k, v in item["data"].items()}
    raise steps.StepError(f"scheduler_perf wrote no {METRIC} of {workload}")


def bench_pattern(workload: str) -> str:
    """go test's -bench pattern for `workload` of BenchmarkPerfScheduling alone: each level
    anchored (a bare prefix also ran BenchmarkPerfSchedulingExperimental, the experimental
    allocator, doubling the run)."""
    return "/".join(f"^{part}$" for part in ["BenchmarkPerfScheduling", *workload.split("/")])


def run(out: Path, workload: str = WORKLOAD, timeout_s: float = 3600) -> dict[str, float]:
    """One run of `workload`; its log and data items in `out`."""
    where = build()
    out = out.resolve()  # the binary runs in its package's directory (the module cache)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("BenchmarkPerfScheduling*.json"):
        old.unlink()
    env = {**os.environ, "PATH": f"{where}:{os.environ['PATH']}", "ARTIFACTS": str(out)}
    cmd = [str(where / "dra.test"), "-test.run=^$", "-test.benchtime=1x",
           f"-test.bench={bench_pattern(workload)}",
           f"-test.timeout={int(timeout_s)}s", f"-data-items-dir={out}"]  # fmt: skip
    log = out / "scheduler_perf.log"
    with log.open("w") as f:
        done = subprocess.run(cmd, cwd=where / "dra", env=env, stdout=f,
                              stderr=subprocess.STDOUT, check=False,
                              timeout=timeout_s + 60)  # fmt: skip
    # Below its own CI's threshold (AverageThreshold, for its CI's machines) the benchmark
    # exits 1 after writing its figures: a figure, not a failure, on a 2-core machine.
    found = sorted(out.glob("BenchmarkPerfScheduling*.json"))
    if not found:
        raise steps.StepError(f"scheduler_perf {workload} exited {done.returncode} and wrote "
                              f"no data items (its log: {log})")  # fmt: skip
    return throughput(json.loads(found[0].read_text()), workload)
